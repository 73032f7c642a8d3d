"""Optimizer construction: parameter groups, then the `optim` group's partial optimizer."""

from __future__ import annotations

from typing import Any

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf


def param_groups(
    model: torch.nn.Module, weight_decay: float, decay_norms_and_biases: bool
) -> list[dict[str, Any]]:
    """Weight decay on matrices only: decaying norm gains and biases pulls them to 0 for nothing."""
    decay, no_decay = [], []
    for param in model.parameters():
        if not param.requires_grad:
            continue
        (decay if param.dim() >= 2 or decay_norms_and_biases else no_decay).append(param)
    groups = [{"params": decay, "weight_decay": weight_decay}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    return groups


def build_optimizer(model: torch.nn.Module, cfg: DictConfig) -> torch.optim.Optimizer:
    spec = OmegaConf.to_container(cfg, resolve=True)
    decay_all = bool(spec.pop("decay_norms_and_biases", False))
    groups = param_groups(model, float(spec.get("weight_decay", 0.0)), decay_all)
    return instantiate(spec, _convert_="all")(groups)
