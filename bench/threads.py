"""What hyprun's thread settings buy when a job shares its CPUs, measured side by side in one run.

    python -m bench.threads [--steps 12] [--rounds 2] [--half] [overrides ...]  # make bench-threads

Our job (gpt_tiny, probes off, each side in a fresh process) runs four ways, interleaved in
every round:

    alone, or beside one concurrent CPU-hungry job (a torch matmul loop that sets nothing),
    with torch's defaults (a thread per core it sees; libgomp's spin-then-sleep wait) or with
    hyprun's (threads sized from the CPU share, runner/job/threads.py, and OpenMP's passive
    wait, runner/__init__.py).

Thread sizing changes nothing where the share is every core (an unbound 2-core VM: the share
and torch's default are both 2); `--half` plays the case it is for: a node shared by two tenants
each entitled to half its cores with nothing binding them there (SLURM_CPUS_PER_TASK = cores/2
on a node without a cpuset), so hyprun's side runs cores/2 threads.

A side's figure in a round is the median of its logged perf/tokens_per_s windows (the first two
dropped: caches and DeepSpeed's first steps); the table shows the median over rounds and their
spread. Ratios are taken within a round (both sides saw the same machine), then summarised the
same way.
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

from bench.overhead import side_by_side_parser, spread
from hyprun.runner.compose import compose
from hyprun.runner.job import threads
from hyprun.runner.job.train import Plan

WARMUP_WINDOWS = 2  # logged windows dropped from every side
NEIGHBOUR = """
import torch
a = torch.randn(384, 384)
print("ready", flush=True)
while True:
    a = torch.tanh(a @ a)
"""
# torch imported before hyprun: libgomp reads its wait policy when torch loads it, so this job
# runs with libgomp's own default whatever hyprun then sets.
TORCH_FIRST = (
    "import sys, torch; from hyprun.runner.job.train import main; sys.argv[0] = 'train'; main()"
)
OURS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY", "SLURM_CPUS_PER_TASK")


@dataclass(frozen=True)
class Side:
    name: str
    hyprun: bool  # hyprun's settings, else torch's defaults
    loaded: bool


SIDES = [
    Side("torch defaults, alone", hyprun=False, loaded=False),
    Side("torch defaults, beside a job", hyprun=False, loaded=True),
    Side("hyprun, alone", hyprun=True, loaded=False),
    Side("hyprun, beside a job", hyprun=True, loaded=True),
]
RATIOS = [  # (numerator, denominator, what it says)
    ("torch defaults, beside a job", "torch defaults, alone", "kept beside a job, torch defaults"),
    ("hyprun, beside a job", "hyprun, alone", "kept beside a job, hyprun"),
    ("hyprun, beside a job", "torch defaults, beside a job", "hyprun / torch, beside a job"),
    ("hyprun, alone", "torch defaults, alone", "hyprun / torch, alone"),
]


def environment(**extra: str) -> dict[str, str]:
    """This environment without the settings the sides differ by, plus `extra`."""
    root = str(Path(__file__).resolve().parent.parent)
    env = {k: v for k, v in os.environ.items() if k not in OURS}
    return {**env, "PYTHONPATH": root, **extra}


@contextmanager
def neighbour(present: bool):
    """A CPU-hungry process with torch's defaults beside the job while the block runs."""
    if not present:
        yield
        return
    process = subprocess.Popen(
        [sys.executable, "-c", NEIGHBOUR], stdout=subprocess.PIPE, text=True, env=environment()
    )
    try:
        process.stdout.readline()  # "ready": torch imported, the loop about to start
        yield
    finally:
        process.terminate()
        process.wait(timeout=30)


def job(side: Side, job_overrides: list[str], half: int | None) -> None:
    """One side's job in a fresh process, recorded in MLflow."""
    if side.hyprun:
        extra = {"SLURM_CPUS_PER_TASK": str(half)} if half else {}
        command = [sys.executable, "-m", "hyprun.runner.job.train"]
    else:
        extra, command = {}, [sys.executable, "-c", TORCH_FIRST]
    with neighbour(side.loaded):
        subprocess.run(
            [*command, *job_overrides],
            env=environment(**extra),
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )


def read_side(uri: str, experiment: str) -> tuple[float, str]:
    """(median tokens/s after the warm-up, threads it ran) of the experiment's one run."""
    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    run = client.search_runs([found.experiment_id])[0]
    history = client.get_metric_history(run.info.run_id, "perf/tokens_per_s")
    values = [m.value for m in sorted(history, key=lambda m: m.step)][WARMUP_WINDOWS:]
    return statistics.median(values), run.data.params.get("runtime.threads", "?")


def measure(overrides: list[str], steps: int, rounds: int, folder: Path, half: int | None):
    """{side name: [tokens/s per round]}, and each side's thread count."""
    tokens = steps * Plan.of(compose(overrides), world=1).tokens_per_step
    uri = f"sqlite:///{folder}/mlflow.db"
    found: dict[str, list[float]] = {side.name: [] for side in SIDES}
    counts: dict[str, str] = {}
    for number in range(rounds):
        for index, side in enumerate(SIDES):
            experiment = f"round{number}-side{index}"
            job_overrides = [
                "probes=off",
                "tracking.system_metrics_every_s=0",
                *overrides,
                f"budget.tokens={tokens}",
                f"budget.eval_every_tokens={tokens}",
                "checkpoint.every_tokens=0",
                f"tracking.uri={uri}",
                f"tracking.experiment={experiment}",
                f"checkpoint.dir={folder}/ckpt",
            ]
            job(side, job_overrides, half)
            tokens_per_s, counts[side.name] = read_side(uri, experiment)
            found[side.name].append(tokens_per_s)
    return found, counts


def print_report(found: dict[str, list[float]], counts: dict[str, str]) -> None:
    print("\n| side | threads | tokens/s, median [min-max] of rounds |")
    print("|---|---|---|")
    for side in SIDES:
        print(f"| {side.name} | {counts[side.name]} | {spread(found[side.name], ',.0f')} |")
    print("\n| ratio | median [min-max] of per-round ratios | what it says |")
    print("|---|---|---|")
    for top, bottom, meaning in RATIOS:
        ratios = [a / b for a, b in zip(found[top], found[bottom], strict=True)]
        print(f"| {top} / {bottom} | {spread(ratios, '.2f')} | {meaning} |")


def main(argv: list[str] | None = None) -> None:
    parser = side_by_side_parser(__doc__.splitlines()[0], steps=12, rounds=2)
    parser.add_argument("--half", action="store_true", help="hyprun's side gets half the cores")
    args = parser.parse_args(argv)
    if args.steps <= 2 * WARMUP_WINDOWS or args.rounds < 1:
        parser.error(f"--steps must exceed {2 * WARMUP_WINDOWS}, --rounds be >= 1")
    cores = threads.cpu_share({}).count
    half = max(1, cores // 2) if args.half else None
    load = os.getloadavg()[0]
    print(
        f"{cores} CPUs (load {load:.1f} before the first side){', hyprun on half' if half else ''};"
        f" {args.rounds} interleaved rounds of {args.steps} steps per side, each side in a fresh"
        f" process (first {WARMUP_WINDOWS} logged windows dropped)"
    )
    with tempfile.TemporaryDirectory() as folder:
        found, counts = measure(args.overrides, args.steps, args.rounds, Path(folder), half)
    print_report(found, counts)


if __name__ == "__main__":
    main()
