"""A toy Hydra app with a closed-form loss curve: the fastest app that logs to MLflow the way
users' apps do (`mlflow.start_run()` picks up MLFLOW_RUN_ID), for tests of what hyprun does
around an app (declarations, the one-variable rule on its tree, errors, where it runs). The
proof with real training is in tests/apps/hf_gpt2 and tests/apps/lightning_gpt."""

from __future__ import annotations

import math
import random
import time

import hydra
import mlflow
from omegaconf import DictConfig


def loss_at(step: int, lr: float, noise: float) -> float:
    """A loss that falls faster with a larger learning rate, towards 1.0."""
    return 1.0 + 3.0 * math.exp(-lr * step) + noise


@hydra.main(config_path="conf", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    rng = random.Random(cfg.seed * 7919 + cfg.data.seed)
    if cfg.crash:
        raise RuntimeError("out of memory in block 3")
    with mlflow.start_run():
        for step in range(cfg.eval_every, cfg.max_steps + 1, cfg.eval_every):
            time.sleep(cfg.pace * cfg.eval_every)  # "training" between evaluations
            value = loss_at(step, cfg.opt.lr, rng.gauss(0.0, 0.005))
            mlflow.log_metric(cfg.metric_name, value, step=step)


if __name__ == "__main__":
    main()
