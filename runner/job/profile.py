"""`hyprun profile`: where a step's time goes, layer by layer (forward and backward), on demand.

Runs a few steps of the configured model and data on this machine's device, outside DeepSpeed,
with timing hooks on each top-level module and each block: the per-layer decomposition the
method asks for once MFU says a step is slow.
"""

from __future__ import annotations

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig

from hyprun.diag.probes import layer_timer


def profile_layers(cfg: DictConfig, steps: int = 5, warmup: int = 2) -> dict[str, dict[str, float]]:
    """{module: {"forward_ms", "backward_ms", "share"}} averaged over `steps` timed steps."""
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    torch.manual_seed(cfg.budget.seed)
    model = instantiate(cfg.model).to(device)
    source = instantiate(cfg.data.source)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    modules = {name: m for name, m in model.named_children() if any(True for _ in m.parameters())}
    blocks = getattr(model, "blocks", None)
    if blocks is not None:
        modules.pop("blocks", None)
        modules.update({f"blocks.{i}": block for i, block in enumerate(blocks)})
    rows = cfg.ds.micro_batch
    for step in range(warmup):
        x, y = source.train(step * rows, rows, cfg.budget.data_seed)
        model(x.to(device), y.to(device)).backward()
    with layer_timer(modules, sync) as times:
        for step in range(warmup, warmup + steps):
            x, y = source.train(step * rows, rows, cfg.budget.data_seed)
            model(x.to(device), y.to(device)).backward()
    total = sum(times.forward.values()) + sum(times.backward.values())
    return {
        name: {
            "forward_ms": 1e3 * times.forward.get(name, 0.0) / steps,
            "backward_ms": 1e3 * times.backward.get(name, 0.0) / steps,
            "share": (times.forward.get(name, 0.0) + times.backward.get(name, 0.0)) / total,
        }
        for name in modules
    }
