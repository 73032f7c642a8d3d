"""`python -m bench.diagnosis.healthy_lr`: the LR each shape trains best at, measured.

    python -m bench.diagnosis.healthy_lr [--workdir DIR] [--out DIR]

The family benchmark scales its LR faults from a healthy LR (families.HEALTHY_LR) and judges a
fault's harm against the healthy run of its shape. A healthy reference that is itself starved
of LR is not healthy: at 3e-3 the 2-layer model ends 27% above its loss at 1e-2, so "LR 3x too
low" would be the reference and an LR 3x too high would train better than it. So the healthy LR
is the grid LR with the lowest mean eval loss over two seeds, per shape and optimizer, at the
split's budget; a test fails when families.HEALTHY_LR and this measurement disagree.

Seeds 0 and 1 are tuning seeds: the healthy LR is part of what the tables are tuned against,
never read from a held-out draw.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.diagnosis.families import SHAPES

RESULTS = Path(__file__).with_name("results")
GRID = {
    "adamw": (1e-3, 2e-3, 3e-3, 6e-3, 1e-2, 2e-2, 4e-2),
    "sgd": (0.03, 0.1, 0.3, 1.0, 3.0, 10.0),
}
"""Steps of 2-3x, wide enough that each shape's best LR has a worse one on both sides."""
SEEDS = (0, 1)


def grid_items() -> list[dict[str, Any]]:
    """One healthy-style split entry per (optimizer, shape, LR, seed), its LR as an override."""
    return [
        {
            "name": f"{shape}/{optim}/lr{lr:g}/s{seed}",
            "shape": shape,
            "optim": optim,
            "seed": seed,
            "lr": lr,
            "overrides": [f"optim.lr={lr:g}"],
        }
        for optim, lrs in GRID.items()
        for shape, lr, seed in itertools.product(SHAPES, lrs, SEEDS)
    ]


def mean_losses(rows: list[dict[str, Any]]) -> dict[tuple[str, str, float], float]:
    """{(shape, optimizer, LR): mean eval loss over its seeds}; a run that did not complete, or
    ended non-finite, counts as an infinite loss."""
    losses: dict[tuple[str, str, float], list[float]] = {}
    for row in rows:
        loss = row.get("eval_loss")
        finite = loss is not None and math.isfinite(loss) and row.get("status") == "completed"
        losses.setdefault((row["shape"], row["optim"], row["lr"]), []).append(
            loss if finite else math.inf
        )
    return {key: statistics.fmean(values) for key, values in losses.items()}


def best_lr(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """{shape: {optimizer: the LR with the lowest mean eval loss}}; an LR that diverges on any
    seed never wins."""
    best: dict[str, dict[str, float]] = {}
    means = mean_losses(rows)
    for (shape, optim, lr), mean in sorted(means.items()):
        current = best.setdefault(shape, {}).get(optim)
        if current is None or mean < means[(shape, optim, current)]:
            best[shape][optim] = lr
    return best


def render(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    best, means = best_lr(rows), mean_losses(rows)
    lines = [f"# Healthy LR per shape ({meta['date']}, commit {meta['commit'][:7]})", ""]
    lines += [
        f"Mean eval loss over seeds {', '.join(map(str, SEEDS))} at {meta['budget_tokens']} "
        "tokens (the split's budget); the lowest, in bold, is families.HEALTHY_LR. "
        "Findings `hyprun diagnose` puts on each run are listed under the table.",
        "",
    ]
    for optim, lrs in GRID.items():
        lines += [f"| {optim} | " + " | ".join(f"{lr:g}" for lr in lrs) + " |"]
        lines += ["| --- " * (len(lrs) + 1) + "|"]
        for shape in SHAPES:
            cells = []
            for lr in lrs:
                mean = means.get((shape, optim, lr))
                cell = "-" if mean is None else f"{mean:.3f}"
                cells.append(f"**{cell}**" if best.get(shape, {}).get(optim) == lr else cell)
            lines += [f"| {shape} | " + " | ".join(cells) + " |"]
        lines += [""]
    findings = [f"- {r['name']}: {', '.join(r['findings'])}" for r in rows if r.get("findings")]
    return "\n".join([*lines, "Findings:", "", *(findings or ["- none"]), ""])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.diagnosis.healthy_lr", description=__doc__
    )
    parser.add_argument("--workdir", help="MLflow file and checkpoints (resumable)")
    parser.add_argument("--out", default=str(RESULTS))
    args = parser.parse_args(argv)
    root = str(Path(__file__).resolve().parents[2])
    if root not in sys.path:
        sys.path.insert(0, root)
    import torch

    from bench.diagnosis.split import load_split, run_entry
    from hyprun.runner.provenance import git_state

    torch.set_num_threads(1)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="hyprun-lr-")).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    os.chdir(workdir)  # MLflow's default artifact root is relative to the cwd
    store = workdir / "healthy_lr.json"
    done = {r["name"]: r for r in json.loads(store.read_text())} if store.exists() else {}
    common = load_split()["common"]
    for item in grid_items():
        if item["name"] not in done:
            out = run_entry(item, common, workdir, {})
            keep = ("eval_loss", "status", "error", "seconds")
            done[item["name"]] = {k: item[k] for k in ("name", "shape", "optim", "lr", "seed")}
            done[item["name"]].update({k: out.get(k) for k in keep})
            done[item["name"]]["findings"] = [f["id"] for f in out.get("findings", [])]
            store.write_text(json.dumps(list(done.values()), indent=1))
            print(item["name"], out.get("eval_loss"), out.get("error") or "", flush=True)
    rows = list(done.values())
    sha, dirty = git_state()
    budget = next(int(o.split("=")[1]) for o in common if o.startswith("budget.tokens="))
    meta = {"date": time.strftime("%Y-%m-%d %H:%M %Z"), "commit": sha, "dirty": dirty}
    meta["budget_tokens"] = budget
    text = render(rows, meta)
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "healthy_lr.md").write_text(text)
    (out / "healthy_lr.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
