"""`python -m bench.first_loss WORKDIR...`: the first train loss over ln(vocab)
(`initial_loss_ratio`, read by `init_too_large`) of every run with L0 checks that the benchmark
workdirs' MLflow stores hold (`python -m bench.apps` / `bench.corpus` with `--workdir`), so the
row's cut can be put beside what healthy and faulty runs read. Prints the highest readings with
their entry folders; nothing is written."""

from __future__ import annotations

import sys
from pathlib import Path

from mlflow.tracking import MlflowClient

from hyprun.diag.features import features
from hyprun.diag.live_checks import L0_TAG
from hyprun.runner.control.diagnose import read_evidence

SHOWN = 6


def first_loss_ratios(workdir: Path) -> list[tuple[float, str]]:
    """(initial_loss_ratio, entry folder) of each run with L0 checks under `workdir`."""
    found = []
    for store in sorted(workdir.glob("*/mlflow.db")):
        uri = f"sqlite:///{store}"
        client = MlflowClient(uri)
        experiments = [e.experiment_id for e in client.search_experiments()]
        for run in client.search_runs(experiments, max_results=1000):
            if L0_TAG not in run.data.tags:
                continue
            ratio = features(read_evidence(uri, run.info.run_id)[0]).get("initial_loss_ratio")
            if ratio is not None:
                found.append((ratio.value, store.parent.name))
    return found


def main() -> int:
    ratios = sorted(r for workdir in sys.argv[1:] for r in first_loss_ratios(Path(workdir)))
    if not ratios:
        print("no runs with L0 checks under the given workdirs", file=sys.stderr)
        return 2
    print(f"{len(ratios)} runs; highest first-loss / ln(vocab):")
    for value, folder in reversed(ratios[-SHOWN:]):
        print(f"  {value:.3f}  {folder}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
