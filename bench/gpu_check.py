"""The prepared GPU check behind bench/gpu_check.sh: one side per process, then one table.

    python -m bench.gpu_check measure SIDE --size gpu|cpu --out FOLDER   # writes FOLDER/SIDE.json
    python -m bench.gpu_check table FOLDER --size gpu|cpu                # prints the table

Sides run in processes of their own so that each one's peak memory is its own, and a 1B model's
engine is gone before the next is built. `gpu` is the check itself (gpt_1b, bf16 ZeRO-2, one
H100/H200); `cpu` is the same sequence at tiny sizes, which CI runs to prove the script works
(its numbers say nothing about a GPU).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

from hyprun.runner.errors import BadInput

GB_PER_GIB = 2**30 / 1e9  # the job logs GiB; diag/memory.py counts GB of 1e9 bytes

SIZES = {
    "gpu": {
        "base": [
            "model=gpt_1b",
            "data.vocab_size=50304",
            "ds=zero2_bf16",
            "data.source.n_train=1024",
            "data.source.n_heldout=64",
            "budget.eval_sequences=16",
        ],
        "nan": ["model=gpt_tiny"],  # where a NaN starts does not depend on the model's size
        "steps": 30,
    },
    "cpu": {
        "base": ["model=gpt_tiny", "ds=zero2_bf16", "budget.eval_sequences=16"],
        "nan": ["model=gpt_tiny"],
        "steps": 10,
    },
}
SIDES = {  # name -> overrides on top of the size's base (bare: the plain DeepSpeed loop)
    "bare": ["probes=off"],
    "off": ["probes=off"],
    "nan_check": ["probes=off", "probes.nan_check=true"],
    "default": ["probes=default"],
    "every_step": ["probes=every_step"],
    "fp16": ["probes=off", "ds.precision=fp16"],
    "nan": [],
}
GOALS = {"mfu": 0.45, "job": 1.03, "default": 1.02, "every_step": 1.15, "memory": (0.8, 1.25)}


def measure(side: str, size: str, out: Path) -> dict:
    """Run one side and write what it measured to out/SIDE.json."""
    from bench import overhead

    spec = SIZES[size]
    if side == "nan":
        found = overhead.nan_check(spec["nan"], out)
    else:
        overrides = [*spec["base"], *SIDES[side]]
        cfg = overhead.config(overrides, spec["steps"], out, f"gpu-check-{side}")
        try:
            found = _run_side(side, cfg)
        except BadInput as refusal:  # fp16 on a CPU: refused before anything trains
            found = {"refused": str(refusal)}
    found |= {"side": side, "size": size}
    (out / f"{side}.json").write_text(json.dumps(found, indent=1, default=str))
    return found


def _run_side(side: str, cfg) -> dict:
    from mlflow.tracking import MlflowClient

    from bench import overhead
    from hyprun.runner.job.train import run

    if side == "bare":
        times = overhead.bare_loop(cfg)
        found = {"status": "completed"}
    else:
        result = run(cfg)
        client = MlflowClient(cfg.tracking.uri)
        times = {
            clock: [
                m.value for m in sorted(client.get_metric_history(result.run_id, key), key=_step)
            ]
            for clock, key in {**overhead.JOB_METRICS, "peak_mem": "perf/peak_mem_gb"}.items()
        }
        found = {"status": result.status, "train_loss": result.train_loss}
        found["peak_mem_gb"] = max(times.pop("peak_mem"), default=None)
    for clock, values in times.items():
        kept = values[overhead.WARMUP_STEPS :] or values
        found[clock] = statistics.median(kept) if kept else None
    found["config"] = _plain(cfg)
    return found


def table(folder: Path, size: str) -> list[tuple[str, str, str, str]]:
    """(check, measured, goal, verdict) rows from the sides' JSON files."""
    sides = {p.stem: json.loads(p.read_text()) for p in folder.glob("*.json")}
    rows = [_mfu_row(sides, size)]
    rows += [
        _ratio_row(sides, "off", "bare", "job (probes off) / bare DeepSpeed loop", GOALS["job"]),
        _ratio_row(sides, "default", "off", "probes default / off", GOALS["default"]),
        _ratio_row(sides, "every_step", "off", "probes every step / off", GOALS["every_step"]),
        _ratio_row(sides, "nan_check", "off", "per-step NaN check / off", None),
        _fp16_row(sides.get("fp16"), size),
        _nan_row(sides.get("nan")),
        _memory_row(sides.get("off"), size),
    ]
    return rows


def _mfu_row(sides: dict, size: str) -> tuple[str, str, str, str]:
    what = "MFU, gpt_1b bf16 ZeRO-2 (probes off)" if size == "gpu" else "MFU, tiny bf16 (CPU peak)"
    off = sides.get("off") or {}
    if off.get("mfu") is None:
        return (what, _missing(off), f">= {GOALS['mfu']:.0%}", "no result")
    goal = f">= {GOALS['mfu']:.0%}" if size == "gpu" else "- (a CPU)"
    verdict = ("pass" if off["mfu"] >= GOALS["mfu"] else "below goal") if size == "gpu" else "-"
    return (what, f"{off['mfu']:.1%}", goal, verdict)


def _ratio_row(sides: dict, top: str, bottom: str, what: str, goal: float | None):
    a, b = sides.get(top) or {}, sides.get(bottom) or {}
    goal_text = f"<= {goal}" if goal else "-"
    if not a.get("wall") or not b.get("wall"):
        return (what, _missing(a if not a.get("wall") else b), goal_text, "no result")
    wall = a["wall"] / b["wall"]
    cpu = a["process"] / b["process"] if a.get("process") and b.get("process") else None
    measured = f"{wall:.3f} wall" + (f", {cpu:.3f} process CPU" if cpu else "")
    verdict = "-" if goal is None else ("pass" if wall <= goal else "over goal")
    return (what, measured, goal_text, verdict)


def _fp16_row(side: dict | None, size: str) -> tuple[str, str, str, str]:
    what = "fp16 with dynamic loss scaling"
    if side is None:
        return (what, "no result", "trains, finite loss", "no result")
    if "refused" in side:
        expected = size == "cpu"
        return (
            what,
            f"refused: {side['refused']}",
            "refused on a CPU",
            "pass" if expected else "FAIL",
        )
    loss = side.get("train_loss")
    finite = loss is not None and loss == loss and abs(loss) != float("inf")
    measured = f"{side['status']}, train loss {loss:.3f}" if finite else f"{side['status']}, {loss}"
    if side.get("mfu") is not None:
        measured += f", MFU {side['mfu']:.1%}"
    ok = side["status"] == "completed" and finite
    return (what, measured, "trains, finite loss", "pass" if ok else "FAIL")


def _nan_row(side: dict | None) -> tuple[str, str, str, str]:
    what = "planted NaN (2nd micro-step of a step)"
    if side is None:
        return (what, "no result", "caught that step, module named", "no result")
    ok = side["caught_step"] == side["planted_step"] and side["module"] == side["expected_module"]
    measured = (
        f"planted step {side['planted_step']}: caught step {side['caught_step']}, "
        f"module {side['module']}"
    )
    return (what, measured, f"step {side['planted_step']}, {side['expected_module']}", _ok(ok))


def _memory_row(side: dict | None, size: str) -> tuple[str, str, str, str]:
    from hyprun.diag.static import memory_estimate

    what = "peak memory / hyprun.diag.memory estimate"
    low, high = GOALS["memory"]
    goal = f"{low}-{high}" if size == "gpu" else "- (CPU: RSS of the process)"
    if not side or side.get("peak_mem_gb") is None:
        return (what, _missing(side or {}), goal, "no result")
    estimate = memory_estimate(side["config"], world=1).total_gb
    measured_gb = side["peak_mem_gb"] * GB_PER_GIB
    ratio = measured_gb / estimate
    measured = f"{measured_gb:.2f} GB / {estimate:.2f} GB = {ratio:.2f}"
    verdict = _ok(low <= ratio <= high) if size == "gpu" else "-"
    return (what, measured, goal, verdict)


def print_table(rows: list[tuple[str, str, str, str]], header: str) -> None:
    widths = [
        max(len(row[i]) for row in [("check", "measured", "goal", "verdict"), *rows])
        for i in range(4)
    ]
    line = " | ".join
    print(header)
    print(
        line(
            cell.ljust(w)
            for cell, w in zip(("check", "measured", "goal", "verdict"), widths, strict=True)
        )
    )
    print(line("-" * w for w in widths))
    for row in rows:
        print(line(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))


def header(size: str, seconds: float | None) -> str:
    import deepspeed
    import torch

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor()
    took = f", {seconds:.0f} s" if seconds else ""
    return (
        f"hyprun GPU check ({size} sizes) on {device or platform.machine()}, torch "
        f"{torch.__version__}, DeepSpeed {deepspeed.__version__}, {time.strftime('%Y-%m-%d')}{took}"
    )


def _missing(side: dict) -> str:
    return side.get("refused") or side.get("error") or "no result (the side failed: see its log)"


def _ok(ok: bool) -> str:
    return "pass" if ok else "FAIL"


def _step(metric) -> int:
    return metric.step


def _plain(cfg) -> dict:
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg, resolve=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("measure", help="run one side")
    one.add_argument("side", choices=SIDES)
    table_ = sub.add_parser("table", help="print the table of the sides measured")
    table_.add_argument("folder", type=Path)
    table_.add_argument("--seconds", type=float, help="wall time of the whole check")
    for command in (one, table_):
        command.add_argument("--size", choices=SIZES, default="gpu")
    one.add_argument("--out", type=Path, required=True, help="folder of the sides' results")
    args = parser.parse_args(argv)
    if args.command == "measure":
        if args.size == "gpu":
            import torch

            if not torch.cuda.is_available():
                print("gpu_check: no CUDA device here: run with --cpu for tiny CPU sizes")
                return 2
        measure(args.side, args.size, args.out)
        return 0
    rows = table(args.folder, args.size)
    print_table(rows, header(args.size, args.seconds))
    return 1 if any(row[3] in ("FAIL", "no result") for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
