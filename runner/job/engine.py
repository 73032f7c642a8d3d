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


def check_extra(ds: DictConfig) -> None:
    """`ds.extra` read by DeepSpeed's own config parser (its pydantic models and batch checks)
    before a job is claimed; the rest of `ds` is checked by validate(). A world of one: the
    geometry is hyprun's, checked by Plan."""
    if not ds.extra:
        return  # nothing free-form: skip DeepSpeed's import
    from deepspeed.runtime.config import DeepSpeedConfig

    from hyprun.runner.compose import one_line
    from hyprun.runner.errors import BadInput

    try:
        DeepSpeedConfig(deepspeed_config(ds))
    except Exception as error:  # pydantic's ValidationError, DeepSpeed's asserts
        raise BadInput(
            f"ds.extra: DeepSpeed refuses the config: {one_line(error)[:300]}: fix or remove "
            "the key in ds.extra"
        ) from None


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
