"""What hyprun's job costs on top of a bare DeepSpeed loop, measured side by side in one run.

    python -m bench.overhead [--steps 60] [--rounds 3] [overrides ...]   # CPU, tiny GPT

The bare loop is a fair anchor: the same model, data, loader (runner/job/data/loader.py, with the
`data.loader` workers, prefetch and pinning the job uses) and DeepSpeed config, then
`engine(x, y); engine.backward(loss); engine.step()` and one `.item()` per step, as the job's
loss logging does. hyprun's sides are
`hyprun.runner.job.train.run` with metrics to MLflow and its L1
probes off, with only the per-step NaN check, at the default interval, at the default interval
once past its free probes (what a long run settles to: a due probe waits while the probes'
time exceeds probes.max_overhead of the run's), and at every step. The same again for `Probe`
in a plain PyTorch loop (the job's model, data and AdamW, no DeepSpeed, no MLflow writes of
its own), with the step scan on the first held-out micro-batch as the job's.

Each side reports per step: wall time, CPU time of the process (all its threads: the MLflow
writer, the system-metrics monitor) and CPU time of the training thread. Wall time swings with
a shared machine's load; CPU time much less, so a ratio means the same on a busy and an idle
machine. Rounds alternate the sides; a round's figure is its mean step (a probed step every 16
is what the probes cost, and a median step never sees it: the median put the default interval
at 1.03x while every-step probes cost 2.8x, i.e. ~11% amortized), and the table shows the
median over rounds with the spread (min-max). Ratios are taken within a round (both sides saw
the same machine), then summarised the same way.

It ends with the NaN check that runs once per optimizer step: a NaN planted in the middle of a
step must still be caught at that step, with the module that made it named.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from hydra.utils import instantiate
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from hyprun.runner.compose import compose
from hyprun.runner.job import dist as distributed
from hyprun.runner.job.data.loader import build_loader
from hyprun.runner.job.engine import build_engine
from hyprun.runner.job.optim import build_optimizer
from hyprun.runner.job.train import Clocks, Plan, drawn_seq_len, run

WARMUP_STEPS = 5  # dropped from every side: caches, allocator, DeepSpeed's first-step work
CLOCKS = ("wall", "process", "thread")
JOB_METRICS = {  # what the job logs per step, by clock
    "wall": "perf/step_time_s",
    "process": "perf/process_cpu_s",
    "thread": "perf/thread_cpu_s",
    "mfu": "perf/mfu",
}


@dataclass(frozen=True)
class Side:
    name: str
    probes: list[str] | None  # overrides of hyprun's job; None: the bare loop
    kind: str = "job"  # "job": hyprun's job; "bare": a DeepSpeed loop; "loop": a Probe loop


PAST_FREE = ["probes=default", "probes.free_probes=1"]  # the cap at work from the 2nd probe
SIDES = [
    Side("bare DeepSpeed loop", None, "bare"),
    Side("hyprun, probes off", ["probes=off"]),
    Side("hyprun, NaN check only", ["probes=off", "probes.nan_check=true"]),
    Side("hyprun, probes default", ["probes=default"]),
    Side("hyprun, default, past free", PAST_FREE),
    Side("hyprun, probes every step", ["probes=every_step"]),
    Side("loop, no probe", ["probes=off"], "loop"),
    Side("loop + Probe, probes off", ["probes=off", "probes.nan_check=true"], "loop"),
    Side("loop + Probe default", ["probes=default"], "loop"),
    Side("loop + Probe, past free", PAST_FREE, "loop"),
    Side("loop + Probe every step", ["probes=every_step"], "loop"),
]
RATIOS = [  # (numerator, denominator, target or None)
    ("hyprun, probes off", "bare DeepSpeed loop", 1.03),
    ("hyprun, NaN check only", "hyprun, probes off", None),
    ("hyprun, probes default", "hyprun, probes off", None),
    ("hyprun, default, past free", "hyprun, probes off", 1.02),
    ("hyprun, probes every step", "hyprun, probes off", None),
    ("loop + Probe, probes off", "loop, no probe", None),
    ("loop + Probe default", "loop + Probe, probes off", None),
    ("loop + Probe, past free", "loop + Probe, probes off", 1.02),
    ("loop + Probe every step", "loop + Probe, probes off", None),
]


def bare_loop(cfg) -> dict[str, list[float]]:
    """Per-step wall, process-CPU and thread-CPU seconds of a plain DeepSpeed loop fed by the
    job's own loader."""
    dist = distributed.init()
    torch.manual_seed(cfg.budget.seed)
    source = instantiate(cfg.data.source)
    model = instantiate(cfg.model)
    optimizer = build_optimizer(model, cfg.optim)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    engine = build_engine(model, optimizer, scheduler, cfg.ds)
    plan = Plan.of(cfg, dist.world, drawn_seq_len(source, cfg.budget.data_seed))
    steps = cfg.budget.tokens // plan.tokens_per_step
    loader = build_loader(
        source,
        seed=cfg.budget.data_seed,
        micro_batch=cfg.ds.micro_batch,
        grad_accum=cfg.ds.grad_accum,
        rank=dist.rank,
        world=dist.world,
        start_step=0,
        total_steps=steps,
        **OmegaConf.to_container(cfg.data.loader, resolve=True),
    )
    batches = iter(loader)
    times: dict[str, list[float]] = {clock: [] for clock in CLOCKS}
    for _ in range(steps):
        start = Clocks.now()
        for _ in range(cfg.ds.grad_accum):
            x, y = (t.to(dist.device, non_blocking=True) for t in next(batches))
            loss = engine(x, y)
            engine.backward(loss)
            engine.step()
        loss.item()  # wait for the device, as hyprun's loss logging does
        spent = Clocks.now() - start
        for clock in CLOCKS:
            times[clock].append(getattr(spent, clock))
    return times


def probe_loop(cfg) -> dict[str, list[float]]:
    """Per-step seconds of a plain PyTorch loop over the job's model and data, with `Probe`
    set as `cfg.probes` says (every_steps 0: no probe), logging to the config's MLflow."""
    import os

    from hyprun.runner.job.probe import Probe

    os.environ["MLFLOW_TRACKING_URI"] = cfg.tracking.uri
    torch.manual_seed(cfg.budget.seed)
    source = instantiate(cfg.data.source)
    model = instantiate(cfg.model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.optim.lr)
    plan = Plan.of(cfg, 1, drawn_seq_len(source, cfg.budget.data_seed))
    steps = cfg.budget.tokens // plan.tokens_per_step
    x, y = source.train(0, steps * cfg.ds.micro_batch, cfg.budget.data_seed)
    held_x, held_y = source.heldout(cfg.ds.micro_batch)
    probes = cfg.probes
    probe = None
    if probes.nan_check or probes.every_steps:  # probes=off: no Probe at all
        probe = Probe(
            model,
            optimizer,
            every_steps=probes.every_steps,
            max_overhead=probes.max_overhead,
            free_probes=probes.free_probes,
            nan_check=probes.nan_check,
            spikes=probes.spikes,
            heldout=(held_x, held_y),
            experiment=cfg.tracking.experiment,
        )
    times: dict[str, list[float]] = {clock: [] for clock in CLOCKS}
    for batch_x, batch_y in zip(
        x.split(cfg.ds.micro_batch), y.split(cfg.ds.micro_batch), strict=True
    ):
        start = Clocks.now()
        loss = model(batch_x, batch_y)
        loss.backward()
        if probe is not None:
            probe.after_backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        loss.item()
        spent = Clocks.now() - start
        for clock in CLOCKS:
            times[clock].append(getattr(spent, clock))
    if probe is not None:
        probe.close()
    return times


def hyprun_job(cfg) -> dict[str, list[float]]:
    """Per-step seconds as hyprun's job records them (everything in the loop but evaluation)."""
    result = run(cfg)
    client = MlflowClient(cfg.tracking.uri)
    return {
        clock: [m.value for m in sorted(client.get_metric_history(result.run_id, key), key=_step)]
        for clock, key in JOB_METRICS.items()
    }


def config(overrides: list[str], steps: int, folder: Path, experiment: str):
    """The job config of `steps` optimizer steps, evaluated only at its end, no checkpoints."""
    probe = compose(overrides)
    tokens = steps * Plan.of(probe, world=1).tokens_per_step
    return compose(
        [
            *overrides,
            f"budget.tokens={tokens}",
            f"budget.eval_every_tokens={tokens}",
            "checkpoint.every_tokens=0",
            f"tracking.uri=sqlite:///{folder}/mlflow.db",
            f"tracking.experiment={experiment}",
            f"checkpoint.dir={folder}/ckpt",
        ]
    )


def measure(
    sides: list[Side], overrides: list[str], steps: int, rounds: int, folder: Path
) -> dict[str, list[dict[str, float]]]:
    """{side: one {clock: median step seconds} per round}, plus the job's `mfu`."""
    found: dict[str, list[dict[str, float]]] = {side.name: [] for side in sides}
    hyprun_job(config(overrides, 2, folder, "warm-up"))  # one-offs: DeepSpeed's build, the db
    for round_ in range(rounds):
        for side in sides:
            cfg = config([*overrides, *(side.probes or [])], steps, folder, f"round-{round_}")
            runs = {"bare": bare_loop, "job": hyprun_job, "loop": probe_loop}[side.kind]
            times = runs(cfg)
            row = {clock: statistics.mean(times[clock][WARMUP_STEPS:]) for clock in CLOCKS}
            if times.get("mfu"):
                row["mfu"] = statistics.median(times["mfu"][WARMUP_STEPS:])
            found[side.name].append(row)
    return found


def spread(values: list[float], fmt: str = ".3f") -> str:
    """median [min-max] of per-round values."""
    return f"{statistics.median(values):{fmt}} [{min(values):{fmt}}-{max(values):{fmt}}]"


def ratios(
    found: dict[str, list[dict[str, float]]], top: str, bottom: str, clock: str
) -> list[float]:
    """Per-round ratios: both sides of a round ran on the same machine, minutes apart."""
    return [a[clock] / b[clock] for a, b in zip(found[top], found[bottom], strict=True)]


def nan_check(overrides: list[str], folder: Path, at_step: int = 3) -> dict[str, object]:
    """A NaN planted in the 2nd micro-step of step `at_step` (grad_accum 2): the step the job
    says it diverged at, and the module it names."""
    cfg = config(
        [
            *overrides,
            "ds.grad_accum=2",
            "model._target_=bench.diagnosis.faults.GPTWithNaNAt",
            "+model.nan_parameter=blocks.0.mlp.fc.weight",
            f"+model.at_forward={2 * at_step}",
        ],
        at_step + 5,
        folder,
        "nan-check",
    )
    result = run(cfg)
    tags = MlflowClient(cfg.tracking.uri).get_run(result.run_id).data.tags
    return {
        "planted_step": at_step,
        "caught_step": result.steps if result.status == "diverged" else None,
        "module": tags.get("hyprun.nan_module"),
        "expected_module": "blocks.0.mlp.fc",
    }


def print_report(found: dict[str, list[dict[str, float]]], nan: dict[str, object]) -> None:
    print(f"{'side':28} {'wall ms/step':>22} {'process CPU ms':>22} {'thread CPU ms':>22}  MFU")
    for name, rounds in found.items():
        cells = [spread([1e3 * r[clock] for r in rounds]) for clock in CLOCKS]
        mfu = [r["mfu"] for r in rounds if "mfu" in r]
        mfu_cell = f"{statistics.median(mfu):.1%}" if mfu else "-"
        print(f"{name:28} {cells[0]:>22} {cells[1]:>22} {cells[2]:>22}  {mfu_cell}")
    print(f"\n{'ratio':58} {'wall':>22} {'process CPU':>22}  target")
    for top, bottom, target in RATIOS:
        if top not in found or bottom not in found:
            continue
        wall, cpu = (spread(ratios(found, top, bottom, clock)) for clock in ("wall", "process"))
        goal = f"<= {target}" if target else "-"
        print(f"{top + ' / ' + bottom:58} {wall:>22} {cpu:>22}  {goal}")
    caught = nan["caught_step"] == nan["planted_step"] and nan["module"] == nan["expected_module"]
    print(
        f"\nNaN planted at step {nan['planted_step']} (its 2nd micro-step): caught at step "
        f"{nan['caught_step']}, module {nan['module']!r} "
        f"({'as planted' if caught else 'NOT as planted: expected ' + str(nan['expected_module'])})"
    )


def _step(metric) -> int:
    return metric.step


def side_by_side_parser(description: str, steps: int, rounds: int) -> argparse.ArgumentParser:
    """The command line of a bench whose sides alternate in rounds."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--steps", type=int, default=steps, help="optimizer steps per side")
    parser.add_argument("--rounds", type=int, default=rounds, help="interleaved rounds")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of every side")
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = side_by_side_parser(__doc__.splitlines()[0], steps=60, rounds=3)
    parser.add_argument("--kind", choices=("all", "job", "loop"), default="all", help="sides")
    args = parser.parse_args(argv)
    sides = [s for s in SIDES if args.kind == "all" or (s.kind == "loop") == (args.kind == "loop")]
    if args.steps <= WARMUP_STEPS or args.rounds < 1:
        parser.error(f"--steps must exceed the {WARMUP_STEPS} warm-up steps, --rounds be >= 1")
    cfg = compose(args.overrides)
    tokens = Plan.of(cfg, world=1).tokens_per_step
    print(
        f"model {cfg.model.n_layer}L d{cfg.model.d_model}, {tokens} tokens/step, loader "
        f"workers={cfg.data.loader.num_workers}; {args.rounds} interleaved rounds of "
        f"{args.steps} steps per side (first {WARMUP_STEPS} dropped); median [min-max] of rounds"
    )
    with tempfile.TemporaryDirectory() as folder:
        found = measure(sides, args.overrides, args.steps, args.rounds, Path(folder))
        nan = nan_check(args.overrides, Path(folder))
    print_report(found, nan)


if __name__ == "__main__":
    main()
