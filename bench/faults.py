"""What survives a crash, a tracking-server outage and a race, counted against one real server.

    python -m bench.faults [--outage-s 60] [--json PATH]      # 5-15 min on 2 cores

- crash: `hyprun test` killed with SIGKILL at a random moment of its seeds, then the same command
  again. Expected: what uninterrupted runs of the same seeds record (measured here, side by
  side), and their verdict's strikes.
- outage: the `mlflow server` stopped for `--outage-s` while a job trains, then started again.
  Expected: every training step and held-out mark of the job, once.
- concurrency: six tests of one investigation claim at the same moment, then record rejections
  at the same moment. Expected: numbers H1..H6, three run, three refused, three strikes, one
  escalation notice.

Prints one table (runs, metric points, strikes and notices, expected vs found; duplicates) and
exits 1 if anything was lost, duplicated or mis-counted.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from hyprun.runner import markdown
from hyprun.runner.control.baseline import record_baseline
from hyprun.runner.control.context import DEFAULT_PRIMARY, job_config
from hyprun.runner.control.controller import Refused, claim
from hyprun.runner.control.one_variable import measure
from hyprun.runner.control.verdicts import decide, record_verdict
from hyprun.runner.job.result import JobResult
from hyprun.runner.job.train import run
from hyprun.runner.store.investigation import STRIKES, State, Store
from tests.helpers import free_port, python_env, start_mlflow_server

# 16 steps of >= 0.25 s each: a window to kill a job or stop its server mid-run.
BUDGET = [
    "budget.tokens=16384",
    "budget.eval_every_tokens=4096",
    "budget.eval_sequences=16",
    "checkpoint.every_tokens=2048",
    "data.source.loader_delay_ms=250",
    "tracking.flush_every_s=0.5",
    "tracking.system_metrics_every_s=0",
]
METRICS = ("train/loss", "eval/loss")
WHY = "I think [cause] because [evidence]"
RACERS = 6


@dataclass
class Survived:
    """One scenario's counts: what should be in MLflow and what is."""

    scenario: str
    runs_expected: int
    runs_found: int
    points_expected: int
    """Metric points (train/loss and eval/loss steps) the runs should hold."""
    points_found: int
    duplicates: int
    """Metric points at a step already recorded, or test numbers given twice."""
    strikes_expected: int | None = None
    strikes_found: int | None = None
    notices_expected: int | None = None
    """Escalation notices sent."""
    notices_found: int | None = None
    note: str = ""

    @property
    def intact(self) -> bool:
        return (
            self.runs_found == self.runs_expected
            and self.duplicates == 0
            and self.points_found == self.points_expected
            and self.strikes_found == self.strikes_expected
            and self.notices_found == self.notices_expected
        )


def points(store: Store, run_ids: list[str]) -> tuple[int, int]:
    """(metric points, duplicated steps) of `run_ids` over METRICS."""
    found = duplicates = 0
    for run_id in run_ids:
        for metric in METRICS:
            steps = [s for s, _ in store.history(run_id, metric)]
            found += len(steps)
            duplicates += len(steps) - len(set(steps))
    return found, duplicates


def seed_runs(store: Store, parent: str) -> dict[int, str]:
    return {int(r.data.tags["hyprun.seed"]): r.info.run_id for r in store.seed_runs(parent)}


def crash(store: Store, folder: Path, rng: random.Random) -> Survived:
    state = record_baseline(store, "crash", [*BUDGET, f"checkpoint.dir={folder}/ckpt"], 2, "")
    command = [
        sys.executable,
        "-m",
        "hyprun.runner.cli.main",
        "test",
        "optim.lr=3e-3",
        "--why",
        WHY,
        "--investigation",
        "crash",
        "--max-seeds",  # one look: the uninterrupted reference below is judged with one look
        "2",
    ]

    def hyprun_test() -> subprocess.Popen:
        return subprocess.Popen(
            command,
            cwd=folder,
            env=python_env(MLFLOW_TRACKING_URI=store.uri),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

    first = hyprun_test()
    deadline = time.monotonic() + 300
    while not (tests := store.find("crash").tests) or not seed_runs(store, tests[0].run_id):
        if time.monotonic() > deadline or first.poll() is not None:
            raise RuntimeError(f"the test never started: {first.stdout.read()}")
        time.sleep(0.2)
    moment = rng.uniform(0.5, 6.0)
    time.sleep(moment)
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()
    again = hyprun_test()
    output, _ = again.communicate(timeout=900)
    if again.returncode != 0:
        raise RuntimeError(f"the rerun failed: {output}")

    # The same seeds uninterrupted: what the test's runs should hold, and the verdict.
    reference = uninterrupted(store, state, [*BUDGET, "optim.lr=3e-3"], folder / "reference")
    verdict = decide(store, state, reference, DEFAULT_PRIMARY, [])["status"]
    state = store.find("crash")
    runs = list(seed_runs(store, state.tests[0].run_id).values())
    expected, _ = points(store, [r.run_id for r in reference])
    found, duplicates = points(store, runs)
    return Survived(
        "crash",
        1 + 2,
        len(state.tests) + len(runs),
        expected,
        found,
        duplicates,
        int(verdict == "rejected"),
        state.strikes,
        note=f"SIGKILL after {moment:.1f} s; verdict {state.tests[0].verdict}, "
        f"uninterrupted {verdict}",
    )


def uninterrupted(
    store: Store, state: State, overrides: list[str], checkpoints: Path
) -> list[JobResult]:
    """Seeds 0 and 1 of `overrides` run straight through, under a `reference` child run."""
    parent = store.child(state.run_id, "reference", {"hyprun.role": "reference"})
    results = []
    for seed in (0, 1):
        cfg = job_config(store, overrides, seed, parent, f"reference {seed}", {})
        cfg.checkpoint.dir = str(checkpoints)
        results.append(run(cfg))
    return results


def outage(folder: Path, outage_s: float) -> Survived:
    port = free_port()
    uri = f"http://127.0.0.1:{port}"
    server = start_mlflow_server(folder, port)
    store = Store(uri, "outage")
    job = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "hyprun.runner.job.train",
            *BUDGET,
            "tracking.experiment=outage",
            f"checkpoint.dir={folder}/ckpt",
        ],
        cwd=folder,
        env=python_env(MLFLOW_TRACKING_URI=uri),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        while not (runs := _runs(store)) or not store.history(runs[0], "train/loss"):
            if time.monotonic() > deadline or job.poll() is not None:
                raise RuntimeError("the job never logged a loss")
            time.sleep(0.2)
        server.terminate()
        server.wait(timeout=30)
        time.sleep(outage_s)
        server = start_mlflow_server(folder, port)
        output, _ = job.communicate(timeout=300)
        if job.returncode != 0:
            raise RuntimeError(f"the job failed: {output}")
        found, duplicates = points(store, runs)
        finished = store.client.get_run(runs[0]).info.status
    finally:
        server.terminate()
        server.wait(timeout=30)
    steps, marks = 16384 // 1024, 16384 // 4096
    return Survived(
        "outage",
        1,
        len(runs),
        steps + marks,
        found,
        duplicates,
        note=f"server down {outage_s:.0f} s; run {finished}",
    )


def _runs(store: Store) -> list[str]:
    found = store.client.get_experiment_by_name(store.experiment)
    return [r.info.run_id for r in store.client.search_runs([found.experiment_id])] if found else []


def claim_then_finish(uri: str, name: str, value: float, start, finish, results) -> None:
    """One `hyprun test` reduced to its two racing moments: the claim, and a rejection."""
    store = Store(uri, "hyprun")
    state = store.find(name)
    delta = measure(state.baseline["overrides"], [f"optim.lr={value}"])
    start.wait()
    try:
        run_id, number = claim(store, state, delta, None, WHY)
    except Refused as refused:
        results.put(("refused", refused.exit_code))
        finish.wait()
        return
    results.put(("claimed", number))
    finish.wait()  # every claimant's verdict is written at the same moment
    verdict = {
        "status": "rejected",
        "reason": "worse than the baseline band",
        "effect": -0.1,
        "noise": 0.01,
        "tokens": 16384,
    }
    record_verdict(store, store.refresh(state), run_id, f"H{number}", verdict, {})


def notifying_baseline(store: Store, name: str, notices: Path, checkpoints: Path) -> State:
    """A short real baseline (its LR 100x too low) whose escalation notices append to `notices`."""
    overrides = [
        "budget.tokens=8192",
        "budget.eval_every_tokens=4096",
        "optim.lr=1e-5",
        f"checkpoint.dir={checkpoints}",
        f"tracking.notify_command='tee -a {notices}'",
    ]
    return record_baseline(store, name, overrides, seeds=2, why="loss is flat")


def race(store: Store, name: str, notices: Path, checkpoints: Path) -> list[tuple[str, int]]:
    """A notifying baseline, then RACERS tests claiming and finishing at the same moments:
    sorted ("claimed", number) and ("refused", exit code)."""
    notifying_baseline(store, name, notices, checkpoints)
    context = multiprocessing.get_context("spawn")
    start, finish, results = context.Barrier(RACERS), context.Barrier(RACERS), context.Queue()
    racers = [
        context.Process(
            target=claim_then_finish,
            args=(store.uri, name, 2e-5 + i * 1e-6, start, finish, results),
        )
        for i in range(RACERS)
    ]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join(timeout=300)
        if racer.exitcode != 0:
            raise RuntimeError(f"a racing test exited {racer.exitcode}")
    return sorted(results.get(timeout=10) for _ in range(RACERS))


def notice_count(path: Path) -> int:
    return path.read_text().count('"investigation"') if path.exists() else 0


def concurrency(store: Store, folder: Path) -> Survived:
    notices = folder / "notices.jsonl"
    outcomes = race(store, "race", notices, folder / "race-ckpt")
    state = store.find("race")
    numbers = sorted(t.number for t in state.tests)
    ran = [n for kind, n in outcomes if kind == "claimed"]
    return Survived(
        "concurrency",
        RACERS,
        len(state.tests),
        0,
        0,
        len(numbers) - len(set(numbers)),
        STRIKES,
        state.strikes,
        1,
        notice_count(notices),
        f"H{numbers[0]}..H{numbers[-1]}; ran "
        f"{', '.join(f'H{n}' for n in ran)}, refused {RACERS - len(ran)}",
    )


def table(rows: list[Survived]) -> str:
    head = ["scenario", "runs exp/found", "points exp/found", "duplicates", "strikes exp/found"]
    head += ["notices exp/found", "intact", "note"]
    body = []
    for r in rows:
        strikes = "—" if r.strikes_expected is None else f"{r.strikes_expected}/{r.strikes_found}"
        notices = "—" if r.notices_expected is None else f"{r.notices_expected}/{r.notices_found}"
        body.append(
            [
                r.scenario,
                f"{r.runs_expected}/{r.runs_found}",
                f"{r.points_expected}/{r.points_found}",
                r.duplicates,
                strikes,
                notices,
                "yes" if r.intact else "NO",
                r.note,
            ]
        )
    return "\n".join(markdown.table(head, body))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--outage-s", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=None, help="the kill moment's RNG seed")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    # Refused before minutes of work, not after (argparse: one line, exit 2).
    if not args.outage_s >= 0:
        parser.error(f"--outage-s {args.outage_s}: give a number of seconds >= 0")
    if args.json and not args.json.resolve().parent.is_dir():
        parser.error(f"--json {args.json}: its folder does not exist; create it or pick another")
    with tempfile.TemporaryDirectory(prefix="hyprun-faults-") as tmp:
        folder = Path(tmp)
        os.chdir(folder)
        port = free_port()
        server = start_mlflow_server(folder, port)
        try:
            store = Store(f"http://127.0.0.1:{port}", "hyprun")
            rows = [crash(store, folder, random.Random(args.seed)), concurrency(store, folder)]
        finally:
            server.terminate()
            server.wait(timeout=30)
        (folder / "outage").mkdir()
        rows.insert(1, outage(folder / "outage", args.outage_s))
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=2))
    return 0 if all(r.intact for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
