"""The `ds` config group translated into a DeepSpeed config, and the engine built from it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig, OmegaConf

if TYPE_CHECKING:  # torch is imported by the job that builds the engine; validate() needs none
    import torch

PRECISIONS = ("fp32", "bf16", "fp16")


def deepspeed_config(ds: DictConfig) -> dict[str, Any]:
    """The DeepSpeed JSON config for the `ds` group. No `optimizer` section: hyprun passes a torch
    optimizer (DeepSpeed's own would compile FusedAdam and hide the one under test)."""
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": int(ds.micro_batch),
        "gradient_accumulation_steps": int(ds.grad_accum),
        "gradient_clipping": float(ds.grad_clip),
        "zero_optimization": {"stage": int(ds.zero_stage)},
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": bool(ds.wall_clock_breakdown),
    }
    if ds.precision == "bf16":
        config["bf16"] = {"enabled": True}
    elif ds.precision == "fp16":
        config["fp16"] = {
            "enabled": True,
            "loss_scale": float(ds.loss_scale),
            "initial_scale_power": int(ds.initial_scale_power),
        }
    extra = OmegaConf.to_container(ds.extra, resolve=True) if ds.extra else {}
    return _merge(config, extra)


def build_engine(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    ds: DictConfig,
):
    import deepspeed

    engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=optimizer, lr_scheduler=scheduler, config=deepspeed_config(ds)
    )
    return engine


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value
    return base
