"""The corpus app's config composed in this process (Hydra's compose API), and one training run
of it without MLflow: what harm.py and the tests measure with, in seconds instead of a job."""

from __future__ import annotations

from pathlib import Path

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

APPS = Path(__file__).with_name("apps")


def app_config(form: str, overrides: list[str], folder: Path | None = None) -> DictConfig:
    """The config of the app in `folder` (default: the corpus's app of that form)."""
    with initialize_config_dir(str((folder or APPS / form) / "conf"), version_base="1.3"):
        return compose("train", overrides=overrides)


def final_eval_loss(form: str, overrides: list[str], seed: int) -> float:
    """The held-out loss a run of the app ends at (no MLflow, no probe)."""
    import torch

    from bench.corpus.apps.loop.train import fit

    if form != "loop":
        raise ValueError(f"form {form!r} has no app yet: only loop")
    torch.set_num_threads(1)
    return fit(app_config(form, [*overrides, f"seed={seed}"]), probe=False)
