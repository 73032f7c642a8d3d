"""`python -m bench.apps.verdicts --set SET --workdir DIR [--draw F]`: hyprun's order tested for
real on each harmful fault entry a benchmark run scored (it changes no score).

The benchmark simulates strikes: any card outside the planted family's `fix` list counts as a
strike. That misjudges an entry whose first finding names a second true cause, e.g. warmup
planted off at 13x the best LR, where hyprun names the LR first and lowering it may be a fix
too. Here each card the ranked findings name (results/SET.json's `cards`, in order) is tested
as `hyprun test CARD` would run it, against the entry's recorded baseline in DIR (2 seeds a
side), until one is confirmed or three strikes escalate. Entries whose fault did no harm
(results/harm_SET.json, change <= bench.diagnosis.split.HARM) leave nothing to fix and are
skipped. Run at the commit that scored SET: hyprun refuses a test across a code change.
Writes results/verdicts_SET.json."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from bench.apps.__main__ import RESULTS, ROOT
from bench.apps.harm import parse_scored
from bench.apps.run import EXPERIMENT, entry_folder, investigation_name
from bench.apps.schema import load_table
from bench.corpus.split import sha256
from bench.diagnosis.run import inside, worker_setup
from bench.diagnosis.split import HARM, STRIKES

MAX_SEEDS = 2
"""Seeds per side of each test: the baseline's, as bench/corpus tests its cards."""


def try_in_order(folder: Path, name: str, cards: list[str]) -> list[dict[str, Any]]:
    """Test `cards` in order against investigation `name` in `folder` until one is confirmed
    or the investigation escalates; each test's card and verdict (refused cards: the reason)."""
    from hyprun.runner.control import controller
    from hyprun.runner.errors import BadInput
    from hyprun.runner.store.investigation import Store

    tests: list[dict[str, Any]] = []
    with inside(folder):
        store = Store(f"sqlite:///{folder}/mlflow.db", EXPERIMENT)
        for card in cards:
            try:
                outcome = controller.test(store, name, [card], card, max_seeds=MAX_SEEDS)
            except BadInput as refused:  # the card changes nothing here: not a test
                tests.append({"card": card, "verdict": "refused", "reason": str(refused)})
                continue
            verdict = (outcome.verdict or {}).get("status", "error")
            tests.append({"card": card, "verdict": verdict})
            if verdict == "confirmed" or store.find(name).escalated:
                break
    return tests


def summary(tests: list[dict[str, Any]]) -> dict[str, Any]:
    """The confirmed card (None when none was) and the strikes taken before it."""
    confirmed = next((t["card"] for t in tests if t["verdict"] == "confirmed"), None)
    strikes = sum(t["verdict"] == "rejected" for t in tests)
    return {"confirmed": confirmed, "strikes": min(strikes, STRIKES)}


def main(argv: list[str] | None = None) -> int:
    parsed = parse_scored("python -m bench.apps.verdicts", __doc__, argv)
    if parsed is None:
        return 2
    args, split, name = parsed
    scored, harm = RESULTS / f"{name}.json", RESULTS / f"harm_{name}.json"
    if not scored.exists() or not harm.exists():
        print(
            f"score {name} and measure its harm first (bench.apps, bench.apps.harm)",
            file=sys.stderr,
        )
        return 2
    from hyprun.runner.provenance import git_state

    scored_run, sha = json.loads(scored.read_text()), git_state()[0]
    if scored_run["meta"]["commit"] != sha:  # hyprun refuses a test across a code change
        at = scored_run["meta"]["commit"][:10]
        print(f"{name} was scored at {at}: check that commit out", file=sys.stderr)
        return 2
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    worker_setup(1, sha)
    table = load_table()
    change = {row["id"]: row["change"] for row in json.loads(harm.read_text())["rows"]}
    rows = []
    for result in scored_run["results"]:
        if result["kind"] != "fault" or change.get(result["id"], 0.0) <= HARM:
            continue
        folder = entry_folder(args.workdir, result["id"], result["seed"])
        tests = try_in_order(folder, investigation_name(result["id"]), result["cards"])
        fix = table.families[result["family"]].fix
        row = {"id": result["id"], "change": change[result["id"]], "planted_fix": fix}
        row |= {"rank": result["rank"], "tests": tests, **summary(tests)}
        rows.append(row)
        print(f"{result['id']}: {tests}", flush=True)
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "commit": sha,
        "split": split.resolve().relative_to(ROOT).as_posix(),
        "split_sha256": sha256(split),
        "max_seeds": MAX_SEEDS,
    }
    out = RESULTS / f"verdicts_{name}.json"
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
