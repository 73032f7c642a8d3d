"""How long a user waits for the commands that train nothing: `python -m bench.commands`.

Each command runs as a fresh `hyprun` process (what a user types), `--repeats` times, against a
small investigation (a baseline and four tests) in a sqlite file and on a real `mlflow server`.
Prints the median wall time, the spread (min-max) and the median CPU time of the process; the
goal is < 2 s each (issue 17). Exit code 1 when a command answers with an unexpected exit code.

    python -m bench.commands [--repeats 5] [--json rows.json] [--no-server]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hyprun.runner.cli.main import parser as hyprun_parser

ROOT = Path(__file__).resolve().parent.parent

GOAL_S = 2.0
WHY = ["--why", "I think the LR is too low because the loss is flat"]
# (name, arguments, expected exit code); `store` commands run against sqlite and the server.
COMMANDS = [
    ("--help", ["--help"], 0, False),
    ("check --help", ["check", "--help"], 0, False),
    ("status", ["status"], 0, True),
    ("status --json", ["status", "--json"], 0, True),
    ("status of no investigation", ["status", "--investigation", "nope"], 2, True),
    ("train: unknown key", ["train", "optim.lrr=1e-3"], 2, False),
    ("train: negative budget", ["train", "budget.tokens=-5"], 2, False),
    ("check: unknown key", ["check", "optim.lrr=1e-3"], 2, False),
    ("test: two variables", ["test", "optim.lr=3e-3", "model.n_layer=4", *WHY], 2, True),
    ("test: unknown card", ["test", "no_such_card", *WHY], 2, True),
]


def seed_investigation(uri: str) -> None:
    """An investigation with a recorded baseline and four tests with verdicts (no jobs: status
    reads tags)."""
    from hyprun.runner import provenance
    from hyprun.runner.control.context import drift_key
    from hyprun.runner.store.investigation import Store

    store = Store(uri, "hyprun")
    parent = store.create("bench", "a baseline and four tests")
    baseline = {
        "overrides": [],
        "launcher": [],
        "seeds": 2,
        "seed_runs": [],
        "config_hash": drift_key([]),
        "git_sha": provenance.git_state()[0],
    }
    store.tag(parent, {"hyprun.baseline": json.dumps(baseline)})
    for number, verdict in enumerate(["rejected", "rejected", "confirmed", "running"], 1):
        test = store.child(parent, f"H{number}", {"hyprun.role": "test"})
        store.once(parent, f"test.H{number}", test)
        store.tag(
            test,
            {
                "hyprun.delta": json.dumps([f"optim.lr={number}e-3"]),
                "hyprun.variable": "optim.lr",
                "hyprun.verdict": verdict,
            },
        )


def time_command(args: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float, int]:
    """(wall s, CPU s of the process, exit code) of one `hyprun ARGS` run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "hyprun.runner.cli.main", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.returncode


def measure(stores: dict[str, str], repeats: int, folder: Path) -> list[dict]:
    rows = []
    for name, args, expected, needs_store in COMMANDS:
        for store, uri in stores.items() if needs_store else [("-", next(iter(stores.values())))]:
            env = {**os.environ, "PYTHONPATH": str(ROOT), "MLFLOW_TRACKING_URI": uri}
            runs = [time_command(args, env, folder) for _ in range(repeats)]
            walls = [r[0] for r in runs]
            codes = sorted({r[2] for r in runs})
            rows.append(
                {
                    "command": name,
                    "store": store,
                    "median_s": statistics.median(walls),
                    "min_s": min(walls),
                    "max_s": max(walls),
                    "cpu_s": statistics.median(r[1] for r in runs),
                    "exit": codes,
                    "expected_exit": expected,
                }
            )
    return rows


def print_table(rows: list[dict], repeats: int) -> None:
    print(f"hyprun commands that train nothing: wall time over {repeats} runs (goal < {GOAL_S} s)")
    print(f"{'command':<28} {'store':<7} {'median s':>9} {'min-max s':>12} {'cpu s':>7}  exit")
    for row in rows:
        spread = f"{row['min_s']:.2f}-{row['max_s']:.2f}"
        flag = "" if row["exit"] == [row["expected_exit"]] else f"  expected {row['expected_exit']}"
        slow = "  SLOW" if row["median_s"] >= GOAL_S else ""
        print(
            f"{row['command']:<28} {row['store']:<7} {row['median_s']:>9.2f} {spread:>12} "
            f"{row['cpu_s']:>7.2f}  {','.join(map(str, row['exit']))}{flag}{slow}"
        )


def main(argv: list[str] | None = None) -> int:
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("--repeats", type=int, default=5, help="runs per command (median)")
    cli.add_argument("--json", type=Path, help="also write the rows to this file")
    cli.add_argument("--no-server", action="store_true", help="sqlite only")
    args = cli.parse_args(argv)
    if args.repeats < 1:
        cli.error(f"--repeats {args.repeats}: give at least 1")
    hyprun_parser()  # the CLI this measures must at least build
    with tempfile.TemporaryDirectory(prefix="hyprun-bench-") as name:
        folder = Path(name)
        stores = {"sqlite": f"sqlite:///{folder}/mlflow.db"}
        server = None
        if not args.no_server:
            from tests.helpers import free_port, start_mlflow_server

            (folder / "server").mkdir()
            port = free_port()
            server = start_mlflow_server(folder / "server", port)
            stores["server"] = f"http://127.0.0.1:{port}"
        try:
            for uri in stores.values():
                seed_investigation(uri)
            rows = measure(stores, args.repeats, folder)
        finally:
            if server is not None:
                server.terminate()
                server.wait(timeout=30)
    print_table(rows, args.repeats)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0 if all(row["exit"] == [row["expected_exit"]] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
