"""What hyprun's job costs on top of a bare DeepSpeed loop, measured side by side in one run.

    python bench/overhead.py [--steps 200] [--rounds 3] [overrides ...]   # CPU, tiny GPT
    python bench/overhead.py --mfu            # on a GPU: gpt_1b, bf16 ZeRO-2, report MFU

Both sides train the same model on the same data with the same DeepSpeed config. The bare loop
reads a batch from the data source, then `engine(x, y); engine.backward(loss); engine.step()`;
hyprun's sides are `runner.job.train.run` with its metrics to MLflow and its L1 probes off, at the
default interval and at every step, timed per step by the job itself (everything inside the
loop but evaluation and checkpoints). Rounds alternate the two sides so
that drifts of a shared machine hit both; medians resist the noise of a small shared CPU.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch
from hydra.utils import instantiate
from mlflow.tracking import MlflowClient

from runner.compose import compose
from runner.job import dist as distributed
from runner.job.engine import build_engine
from runner.job.optim import build_optimizer
from runner.job.train import run

PEAK_BF16_FLOPS = {"A100": 312e12, "H100": 989e12, "H200": 989e12}  # dense, per GPU


def bare_loop(cfg) -> list[float]:
    """Per-step seconds of a plain DeepSpeed loop over the same data."""
    dist = distributed.init()
    torch.manual_seed(cfg.budget.seed)
    source = instantiate(cfg.data.source)
    model = instantiate(cfg.model)
    optimizer = build_optimizer(model, cfg.optim)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    engine = build_engine(model, optimizer, scheduler, cfg.ds)
    rows, accum = cfg.ds.micro_batch, cfg.ds.grad_accum
    steps = cfg.budget.tokens // (rows * accum * cfg.model.seq_len)
    times = []
    for step in range(steps):
        start = time.perf_counter()
        for micro in range(accum):
            x, y = source.train((step * accum + micro) * rows, rows, cfg.budget.data_seed)
            loss = engine(x.to(dist.device), y.to(dist.device))
            engine.backward(loss)
            engine.step()
        loss.item()  # wait for the device, as hyprun's loss logging does
        times.append(time.perf_counter() - start)
    return times


def hyprun_job(cfg) -> list[float]:
    """Per-step seconds as hyprun's job measures them (everything in the loop but eval)."""
    result = run(cfg)
    history = MlflowClient(cfg.tracking.uri).get_metric_history(result.run_id, "perf/step_time_s")
    return [m.value for m in history]


def config(overrides: list[str], steps: int, folder: Path, round_: int):
    probe = compose(overrides)
    tokens = steps * probe.ds.micro_batch * probe.ds.grad_accum * probe.model.seq_len
    return compose(
        [
            *overrides,
            f"budget.tokens={tokens}",
            f"budget.eval_every_tokens={tokens}",
            "checkpoint.every_tokens=0",
            f"tracking.uri=sqlite:///{folder}/mlflow.db",
            f"tracking.experiment=overhead-{round_}",
            f"checkpoint.dir={folder}/ckpt",
        ]
    )


SIDES = {  # name -> probes config of hyprun's job (None: the bare loop)
    "bare": None,
    "hyprun, probes off": "off",
    "hyprun, probes default": "default",
    "hyprun, probes every step": "every_step",
}
RATIOS = [  # (numerator, denominator, target)
    ("hyprun, probes off", "bare", 1.03),
    ("hyprun, probes default", "hyprun, probes off", 1.02),
    ("hyprun, probes every step", "hyprun, probes off", 1.15),
]


def overhead(overrides: list[str], steps: int, rounds: int) -> None:
    times: dict[str, list[float]] = {name: [] for name in SIDES}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        hyprun_job(config(overrides, 2, folder, -1))  # one-offs: DeepSpeed's build, MLflow's db
        for round_ in range(rounds):
            for name, probes in SIDES.items():
                side = overrides if probes is None else [*overrides, f"probes={probes}"]
                cfg = config(side, steps, folder, round_)
                fn = bare_loop if probes is None else hyprun_job
                times[name] += fn(cfg)[5:]  # the first steps warm caches up
    cfg = compose(overrides)
    tokens_per_step = cfg.ds.micro_batch * cfg.ds.grad_accum * cfg.model.seq_len
    print(
        f"model {cfg.model.n_layer}L d{cfg.model.d_model}, {tokens_per_step} tokens/step, "
        f"{rounds} interleaved rounds of {steps} steps per side"
    )
    print(f"{'side':28} median step (ms)   mean step (ms)   tokens/s (median)")
    for name, values in times.items():
        median, mean = statistics.median(values), statistics.fmean(values)
        print(f"{name:28} {median * 1e3:16.2f} {mean * 1e3:16.2f} {tokens_per_step / median:19.0f}")
    for top, bottom, target in RATIOS:
        median = statistics.median(times[top]) / statistics.median(times[bottom])
        mean = statistics.fmean(times[top]) / statistics.fmean(times[bottom])
        print(f"{top} / {bottom}: {median:.3f} median, {mean:.3f} mean (target <= {target})")


def mfu(steps: int) -> None:
    """Model FLOPs utilisation of gpt_1b, bf16 ZeRO-2, on this GPU."""
    if not torch.cuda.is_available():
        raise SystemExit("--mfu needs a GPU: no CUDA device here")
    name = torch.cuda.get_device_name()
    peak = next((v for k, v in PEAK_BF16_FLOPS.items() if k in name), None)
    overrides = [
        "model=gpt_1b",
        "ds=zero2_bf16",
        "data.vocab_size=50304",
        "data.source.n_train=256",
        "data.source.n_heldout=16",
        "budget.eval_sequences=8",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        cfg = config(overrides, steps, Path(tmp), 0)
        step_time = statistics.median(hyprun_job(cfg)[3:])
    tokens_per_s = cfg.ds.micro_batch * cfg.ds.grad_accum * cfg.model.seq_len / step_time
    tokens_per_s *= torch.distributed.get_world_size()
    with torch.device("meta"):
        flops_per_token = instantiate(cfg.model).flops_per_token()
    achieved = tokens_per_s * flops_per_token
    print(f"{name}: {tokens_per_s:.0f} tokens/s, {achieved / 1e12:.1f} TFLOP/s", end="")
    print(f", MFU {achieved / peak:.1%} (target >= 45%)" if peak else " (unknown peak)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mfu", action="store_true", help="gpt_1b bf16 ZeRO-2 MFU on a GPU")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    if args.mfu:
        mfu(max(args.steps, 10) if args.steps != 200 else 20)
    else:
        overhead(args.overrides, args.steps, args.rounds)


if __name__ == "__main__":
    main()
