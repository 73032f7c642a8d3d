"""How long `make demo` takes (setup done): `python -m bench.demo_time [--repeats 3]`.

Runs `hyprun demo` as a user does, each time in a fresh folder with its own MLflow store, and
prints the median wall time with the spread, beside the CPU time of the demo's processes (user +
system), which a shared machine's load barely moves: wall time on an idle 2-core machine lies
between CPU time / 2 and CPU time. The goal is under 5 minutes on 2 cores (issue 17).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GOAL_S = 300.0
ROOT = Path(__file__).resolve().parent.parent


def one_demo(seeds: int) -> tuple[float, float]:
    """(wall s, CPU s) of one `hyprun demo` in a fresh folder."""
    with tempfile.TemporaryDirectory(prefix="hyprun-demo-") as folder:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        env.pop("MLFLOW_TRACKING_URI", None)  # the demo's own sqlite file in `folder`
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "hyprun.runner.cli.main", "demo", "--seeds", str(seeds)],
            cwd=folder,
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3, help="demo runs (median)")
    parser.add_argument("--seeds", type=int, default=3, help="as `hyprun demo --seeds`")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: give at least 1")
    runs = [one_demo(args.seeds) for _ in range(args.repeats)]
    walls, cpus = [r[0] for r in runs], [r[1] for r in runs]
    wall = statistics.median(walls)
    print(
        f"hyprun demo, {args.repeats} run(s) on {os.cpu_count()} cores: wall {wall:.0f} s median "
        f"[{min(walls):.0f}-{max(walls):.0f}], CPU {statistics.median(cpus):.0f} s median "
        f"(goal < {GOAL_S:.0f} s wall on 2 cores: {'met' if wall < GOAL_S else 'NOT met'})"
    )
    return 0 if wall < GOAL_S else 1


if __name__ == "__main__":
    sys.exit(main())
