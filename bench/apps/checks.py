"""The probe's L0 checks on the app benchmark's healthy configs (python -m bench.apps.checks
[--rerun DRAW] WORKDIR...): what each healthy entry's baseline runs recorded (tag
hyprun.l0_checks), read back from the MLflow stores a `python -m bench.apps --workdir WORKDIR`
run left; `--rerun DRAW` first runs that draw's healthy entries again into WORKDIR (baselines
only, nothing scored), so checks added since the draw was scored are read on the same configs
and data seeds. Every check that is
not an L0 warning of the config (LR band, warmup, decay, clipping, betas: those read the app's
own choices) is an invariant: any fail or warn on a healthy config is a false alarm. Writes
bench/corpus/results/invariants_apps.json (the invariants' foreign healthy population)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from mlflow.tracking import MlflowClient

from hyprun.diag.live_checks import L0_TAG, read_l0_tags

RESULTS = Path(__file__).resolve().parents[1] / "corpus" / "results"
CONFIG_WARNINGS = {"lr_plausible", "warmup", "adam_betas", "sgd_momentum", "weight_decay"}
CONFIG_WARNINGS |= {"decay_norms_biases", "grad_clip", "tokens_per_step"}
"""Checks that judge the config's choices, not the loop: not invariants."""


def healthy_entries(workdir: Path) -> list[Path]:
    """An entry's folder is ID-DATASEED; a planted fault's ID holds '@', early rejection's
    folders start with 'early'."""
    return sorted(
        folder
        for folder in workdir.iterdir()
        if (folder / "mlflow.db").exists() and "@" not in folder.name
        if not folder.name.startswith("early")
    )


def recorded_checks(folder: Path) -> dict[str, dict[str, str]]:
    """By baseline seed: {check id: status} as the probe recorded them."""
    client = MlflowClient(tracking_uri=f"sqlite:///{folder / 'mlflow.db'}")
    experiments = [e.experiment_id for e in client.search_experiments()]
    found = {}
    for run in client.search_runs(experiments, max_results=1000):
        tags = run.data.tags
        if L0_TAG in tags:
            seed = tags.get("hyprun.seed", run.info.run_id[:8])
            found[f"seed {seed}"] = {c["id"]: c["status"] for c in read_l0_tags(tags)}
    return found


def rerun_healthy(draw: Path, workdir: Path) -> None:
    """A draw's healthy entries run again into `workdir`: baseline and diagnosis, as scored."""
    import numpy as np

    from bench.apps.run import entry_folder, run_entry
    from bench.apps.schema import load_table
    from bench.apps.split import load_split
    from bench.diagnosis.run import worker_setup
    from hyprun.runner.provenance import git_state

    worker_setup(1, git_state()[0])
    table, rng = load_table(), np.random.default_rng(26)
    for entry in load_split(draw)["heldout"]:
        if entry.family is None:
            run_entry(table, entry, entry_folder(workdir.resolve(), entry.id, entry.seed), rng)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--rerun"] and len(argv) >= 3:
        rerun_healthy(Path(argv[1]), Path(argv[2]))
        argv = argv[2:]
    if not argv or argv[0].startswith("-"):
        print("usage: python -m bench.apps.checks [--rerun DRAW] WORKDIR...", file=sys.stderr)
        return 2
    table, alarms = {}, 0
    for workdir in map(Path, argv):
        for folder in healthy_entries(workdir):
            for seed, checks in recorded_checks(folder).items():
                name = f"{folder.name} {seed}"
                table[name] = checks
                raised = {k: v for k, v in checks.items() if v in ("fail", "warn")}
                raised = {k: v for k, v in raised.items() if k not in CONFIG_WARNINGS}
                alarms += bool(raised)
                print(f"{name}: {raised or 'no invariant raised'}")
    print(f"healthy runs with an invariant raised: {alarms} of {len(table)}")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "invariants_apps.json").write_text(json.dumps(table, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
