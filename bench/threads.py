"""What sizing torch's threads buys when a job shares its CPUs, measured side by side in one run.

    python -m bench.threads [--steps 32] [--rounds 2] [overrides ...]      (make bench-threads)

The scenario is a node shared by two tenants, each entitled to half its CPUs, with nothing
binding them to their half: a Slurm task with SLURM_CPUS_PER_TASK = cores / 2 on a node without
a cpuset (TaskPlugin=task/none), a container with a CPU quota, or two jobs someone started side
by side. Our job (gpt_tiny, probes off) runs four ways, interleaved in every round:

    alone or beside one concurrent CPU-hungry job (a torch matmul loop, the other tenant),
    thread sizing off (torch's default: a thread per core it sees, for both tenants) or on
    (runner/job/threads.py: the share, cores / 2, for both tenants).

A side's figure in a round is the median of its logged perf/tokens_per_s windows (the first two
dropped: caches and DeepSpeed's first steps); the table shows the median over rounds and their
spread. Ratios are taken within a round (both sides saw the same machine), then summarised the
same way. On a machine of one core there is no half to give: the bench says so and stops.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from mlflow.tracking import MlflowClient

from bench.overhead import config, side_by_side_parser, spread
from runner.job import threads
from runner.job.train import run

WARMUP_WINDOWS = 2  # logged windows dropped from every side
NEIGHBOUR = """
import sys, torch
torch.set_num_threads(int(sys.argv[1]))
a = torch.randn(384, 384)
print("ready", flush=True)
while True:
    a = torch.tanh(a @ a)
"""


@dataclass(frozen=True)
class Side:
    name: str
    sized: bool
    loaded: bool


SIDES = [
    Side("sizing off, alone", sized=False, loaded=False),
    Side("sizing off, beside a job", sized=False, loaded=True),
    Side("sizing on, alone", sized=True, loaded=False),
    Side("sizing on, beside a job", sized=True, loaded=True),
]
RATIOS = [  # (numerator, denominator, what it says)
    ("sizing off, beside a job", "sizing off, alone", "throughput kept beside a job, unsized"),
    ("sizing on, beside a job", "sizing on, alone", "throughput kept beside a job, sized"),
    ("sizing on, beside a job", "sizing off, beside a job", "sized / unsized, beside a job"),
    ("sizing on, alone", "sizing off, alone", "sized / unsized, alone"),
]


def torch_default_threads() -> int:
    """The intra-op threads torch starts with in a fresh process that sets nothing."""
    unset = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    read = "import torch; print(torch.get_num_threads())"
    done = subprocess.run(
        [sys.executable, "-c", read], env=env, capture_output=True, text=True, check=True
    )
    return int(done.stdout.strip())


@contextmanager
def neighbour(count: int, present: bool):
    """A CPU-hungry process of `count` threads beside the job while the block runs."""
    if not present:
        yield
        return
    process = subprocess.Popen(
        [sys.executable, "-c", NEIGHBOUR, str(count)], stdout=subprocess.PIPE, text=True
    )
    try:
        process.stdout.readline()  # "ready": torch imported, the loop about to start
        yield
    finally:
        process.terminate()
        process.wait(timeout=30)


def tokens_per_s(cfg) -> float:
    """The median of the job's logged throughput windows after the warm-up."""
    result = run(cfg)
    history = MlflowClient(cfg.tracking.uri).get_metric_history(result.run_id, "perf/tokens_per_s")
    values = [m.value for m in sorted(history, key=lambda m: m.step)][WARMUP_WINDOWS:]
    return statistics.median(values)


def measure(overrides: list[str], steps: int, rounds: int, folder: Path, share: int) -> dict:
    """{side name: [tokens/s per round]}, sides interleaved within each round."""
    default = torch_default_threads()
    found: dict[str, list[float]] = {side.name: [] for side in SIDES}
    counts = {True: share, False: default}
    for number in range(rounds):
        for index, side in enumerate(SIDES):
            quiet = ["probes=off", "tracking.system_metrics_every_s=0"]
            sided = [*quiet, *overrides, f"threads={counts[side.sized]}"]
            cfg = config(sided, steps, folder, f"round{number}-side{index}")
            with neighbour(counts[side.sized], side.loaded):
                found[side.name].append(tokens_per_s(cfg))
    return {"found": found, "default": default}


def print_report(found: dict[str, list[float]], default: int, share: int) -> None:
    print(f"\nthreads: sizing off {default} (torch's default), sizing on {share} (the share)")
    print("| side | tokens/s, median [min-max] of rounds |")
    print("|---|---|")
    for side in SIDES:
        print(f"| {side.name} | {spread(found[side.name], ',.0f')} |")
    print("\n| ratio | median [min-max] of per-round ratios | what it says |")
    print("|---|---|---|")
    for top, bottom, meaning in RATIOS:
        ratios = [a / b for a, b in zip(found[top], found[bottom], strict=True)]
        print(f"| {top} / {bottom} | {spread(ratios, '.2f')} | {meaning} |")


def main(argv: list[str] | None = None) -> None:
    parser = side_by_side_parser(__doc__.splitlines()[0], steps=32, rounds=2)
    args = parser.parse_args(argv)
    if args.steps <= 4 * WARMUP_WINDOWS or args.rounds < 1:
        parser.error(f"--steps must exceed {4 * WARMUP_WINDOWS}, --rounds be >= 1")
    cores = threads.cpu_share({}).count
    if cores < 2:
        print(f"bench.threads: {cores} CPU here, no half to give a neighbour: nothing to compare")
        return
    share = threads.cpu_share({"SLURM_CPUS_PER_TASK": str(cores // 2)}).count
    print(
        f"{cores} CPUs, two tenants of {share} each; {args.rounds} interleaved rounds of "
        f"{args.steps} steps per side (first {WARMUP_WINDOWS} logged windows dropped)"
    )
    with tempfile.TemporaryDirectory() as folder:
        measured = measure(args.overrides, args.steps, args.rounds, Path(folder), share)
    print_report(measured["found"], measured["default"], share)


if __name__ == "__main__":
    main()
