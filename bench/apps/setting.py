"""`python -m bench.apps.setting --set SET [--draw FILE]`: whether a fault's setting is a fault
of its own, measured after the fact beside the score (it changes no score).

Warmup off and clipping off are planted at a high LR (the family's `setting`), where they can
do harm. Past a few times the best LR, though, that LR ruins the run by itself: the clean twin
(the setting, warmup and clipping on) ends far above the form's healthy run, and the plant adds
little to it. Such an entry carries two faults, and a diagnosis that names the LR first names
the larger one. This script trains each setting entry's reference, its setting at magnitude 1
(the form's best LR: its healthy run, same data seed, same 2 seeds), and compares the clean twin
that results/harm_SET.json recorded with it: the setting's cost. Writes
results/setting_SET.json; bench.apps.summary reads it beside the harm.
"""

from __future__ import annotations

import json
import statistics
import sys

from bench.apps.__main__ import RESULTS, ROOT
from bench.apps.harm import finals, parse_scored, write_measured
from bench.apps.run import EXPERIMENT, SEEDS, entry_folder, folder_of, investigation_name
from bench.apps.schema import Entry, Table, load_table, overrides
from bench.apps.split import load_split
from bench.diagnosis.run import inside, worker_setup


def reference_of(table: Table, entry: Entry) -> list[str]:
    """The entry's healthy reference: its form's base and its setting at magnitude 1."""
    at_one = entry.model_copy(update={"m": 1.0})
    return [*table.forms[entry.form].base, *overrides(table, at_one, "setting")]


def main(argv: list[str] | None = None) -> int:
    parsed = parse_scored("python -m bench.apps.setting", __doc__, argv)
    if parsed is None:
        return 2
    args, split, name_of_set = parsed
    harm_file = RESULTS / f"harm_{name_of_set}.json"
    if not harm_file.exists():
        print(
            f"no {harm_file.name}: run bench.apps.harm with the same arguments first",
            file=sys.stderr,
        )
        return 2
    from hyprun.runner.control.baseline import record_baseline
    from hyprun.runner.launch.app import HydraApp
    from hyprun.runner.launch.declaration import load_declaration
    from hyprun.runner.provenance import git_state
    from hyprun.runner.store.investigation import Store

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    worker_setup(1, git_state()[0])
    twins = {row["id"]: row["twin"] for row in json.loads(harm_file.read_text())["rows"]}
    table, rows = load_table(), []
    for entry in load_split(split)[args.set_name]:
        if not entry.family or not table.families[entry.family].setting:
            continue
        form = table.forms[entry.form]
        metric = load_declaration(folder_of(form.app) / "hyprun.yaml").metric.name
        folder = entry_folder(args.workdir, entry.id, entry.seed)
        folder = folder.with_name(folder.name + "-reference")
        with inside(folder):
            store = Store(f"sqlite:///{folder}/mlflow.db", EXPERIMENT)
            name = investigation_name(entry.id)
            data_seed = f"{form.keys['data_seed']}={entry.seed}"
            app = HydraApp.load(form.app)
            reference_overrides = [*reference_of(table, entry), data_seed]
            record_baseline(store, name, reference_overrides, SEEDS, "reference", app=app)
            reference = finals(store, name, metric)
        twin = twins[entry.id]
        change = statistics.fmean(twin) / statistics.fmean(reference) - 1
        rows.append({"id": entry.id, "reference": reference, "twin": twin, "change": change})
        print(f"{entry.id}: twin {twin} reference {reference} setting {change:+.1%}", flush=True)
    write_measured(RESULTS / f"setting_{name_of_set}.json", split, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
