"""The family benchmark's healthy LR (families.HEALTHY_LR) is measured, not assumed: it is the
grid LR each shape trains best at (bench/diagnosis/healthy_lr.py, results/healthy_lr.md)."""

from __future__ import annotations

import json
import math

from bench.diagnosis import healthy_lr
from bench.diagnosis.families import HEALTHY_LR, OPTIMIZERS, SHAPES

RECORDED = json.loads((healthy_lr.RESULTS / "healthy_lr.json").read_text())


def row(lr: float, loss: float, seed: int = 0, status: str = "completed") -> dict:
    return dict(shape="tiny2", optim="adamw", lr=lr, seed=seed, eval_loss=loss, status=status)


def test_the_lowest_mean_loss_wins_and_a_diverged_seed_never_does():
    rows = [row(1e-3, 5.0), row(1e-3, 5.2, 1), row(1e-2, 4.0), row(1e-2, 4.4, 1)]
    assert healthy_lr.best_lr(rows) == {"tiny2": {"adamw": 1e-2}}
    rows += [row(3e-2, 1.0), row(3e-2, math.nan, 1, status="diverged")]
    assert healthy_lr.best_lr(rows) == {"tiny2": {"adamw": 1e-2}}


def test_the_grid_covers_every_shape_the_split_runs():
    names = {(i["shape"], i["optim"]) for i in healthy_lr.grid_items()}
    assert names == {(shape, optim) for shape in SHAPES for optim in OPTIMIZERS}


def test_families_run_at_the_measured_best_lr():
    assert healthy_lr.best_lr(RECORDED["rows"]) == HEALTHY_LR


def test_each_best_lr_has_a_worse_lr_on_both_sides_in_the_grid():
    """A best LR at the edge of the grid says only that the grid is too narrow."""
    for shape, by_optimizer in HEALTHY_LR.items():
        for optimizer, lr in by_optimizer.items():
            grid = healthy_lr.GRID[optimizer]
            assert grid[0] < lr < grid[-1], (shape, optimizer, lr)
