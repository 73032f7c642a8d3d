"""In-job L1 probes: statistics of gradients, parameters, activations and attention.

Pure torch over tensors and modules; the job (runner/job/instrument.py) decides when they run and
gathers sharded tensors first. Everything here is off the normal path: hooks exist only during
a probed forward pass, and the model's own capture switches are off otherwise.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

STEP_MULTIPLES = (0.0, 1.0, 2.0, 4.0, 8.0)
"""Multiples of a probed step at which the step scan reads the held-out loss (0: the weights
before the step, 1: the step taken); metrics `step/loss_x<multiple>`."""


class ProbeSchedule:
    """Which steps are probed: the first and every `every_steps` after it, while the probes'
    own time stays under `max_overhead` of the run's time so far.

    A probed step costs several plain ones (the step scan alone is five held-out forwards), so
    a fixed interval costs a fixed share however long the run: 16 steps cost ~10% on the tiny
    CPU job. The first `free_probes` probes are always taken, so a short run's evidence (what
    the tables were set on) does not depend on the machine's speed; after them a due probe
    waits while the probes' seconds exceed the share, and a week-long run pays ~max_overhead.
    The probes' time is what the caller reports through `spent`."""

    def __init__(self, every_steps: int, max_overhead: float = 0.0, free_probes: int = 0):
        self.every_steps, self.max_overhead, self.free_probes = (
            every_steps,
            max_overhead,
            free_probes,
        )
        self.taken, self.seconds = 0, 0.0
        self._start: float | None = None

    def due(self, step: int) -> bool:
        """Whether to probe `step` (call once per step, before it runs)."""
        if self._start is None:
            self._start = time.perf_counter()
        if not self.every_steps or step % self.every_steps:
            return False
        elapsed = time.perf_counter() - self._start
        capped = self.max_overhead > 0 and self.taken >= self.free_probes
        if capped and self.seconds > self.max_overhead * elapsed:
            return False
        self.taken += 1
        return True

    def spent(self, seconds: float) -> None:
        """Seconds of probe work (measuring, the step scan) done on a probed step."""
        self.seconds += seconds


def group_of(name: str, depth_of_blocks: int = 2) -> str:
    """The module a parameter belongs to, at the granularity triage reads:
    `blocks.3.attn.qkv.weight` -> `blocks.3`, `tok_emb.weight` -> `tok_emb`."""
    parts = name.split(".")
    if parts[0] == "blocks" and len(parts) > depth_of_blocks:
        return ".".join(parts[:depth_of_blocks])
    return parts[0] if len(parts) > 1 else name


def grouped_norms(named: Iterable[tuple[str, torch.Tensor]]) -> tuple[float, dict[str, float]]:
    """(global L2 norm, L2 norm per module group) of named tensors. One fused norm kernel for
    all tensors and one device sync; squares are summed in float64."""
    items = list(named)
    if not items:
        return 0.0, {}
    names, tensors = zip(*items, strict=True)
    norms = torch.stack(torch._foreach_norm([t.detach() for t in tensors])).double().tolist()
    squares: dict[str, float] = {}
    for name, norm in zip(names, norms, strict=True):
        key = group_of(name)
        squares[key] = squares.get(key, 0.0) + norm * norm
    total = math.sqrt(sum(squares.values()))
    return total, {k: math.sqrt(v) for k, v in squares.items()}


def has_nonfinite(tensors: Iterable[torch.Tensor]) -> bool:
    return any(not bool(torch.isfinite(t).all()) for t in tensors)


@dataclass
class BlockStats:
    """What a probed forward pass saw at each block of the residual stream."""

    rms: dict[str, float] = field(default_factory=dict)
    """RMS of each block's output."""
    write_ratio: dict[str, float] = field(default_factory=dict)
    """RMS(block output - block input) / RMS(block input): how much a block rewrites the stream."""


def find_blocks(model: nn.Module) -> tuple[str, nn.ModuleList] | None:
    """(path, list) of the model's residual blocks: `model.blocks` when it has one (the built-in
    GPT, the `_target_` protocol), else the `nn.ModuleList` of same-type modules that holds the
    most parameters (`transformer.h` of a Hugging Face GPT-2, `model.layers` of a Llama). None
    when there is no such list: block probes are then skipped, not guessed."""
    blocks = getattr(model, "blocks", None)
    if isinstance(blocks, nn.ModuleList) and len(blocks):
        return "blocks", blocks
    best, best_size = None, 0
    for path, module in model.named_modules():
        if not isinstance(module, nn.ModuleList) or len(module) < 2:
            continue
        if len({type(child) for child in module}) != 1:
            continue
        size = sum(p.numel() for p in module.parameters())
        if size > best_size:
            best, best_size = (path, module), size
    return best


def canonical_name(name: str, blocks_path: str | None) -> str:
    """A parameter or module name in the job's vocabulary, so per-block evidence reads the same
    for any model: `transformer.h.3.mlp.c_fc.weight` -> `blocks.3.mlp.c_fc.weight`, and the
    blocks' siblings lose their common prefix (`transformer.wte.weight` -> `wte.weight`)."""
    if not blocks_path or blocks_path == "blocks":
        return name
    if name.startswith(blocks_path + "."):
        return "blocks." + name[len(blocks_path) + 1 :]
    parent = blocks_path.rpartition(".")[0]
    if parent and name.startswith(parent + "."):
        return name[len(parent) + 1 :]
    return name


def _first_tensor(values) -> torch.Tensor | None:
    for value in values:
        if torch.is_tensor(value) and value.is_floating_point():
            return value
    return None


@contextmanager
def block_probe(
    model: nn.Module, blocks: Iterable[nn.Module] | None = None
) -> Iterator[BlockStats]:
    """Forward hooks on the residual blocks (`blocks`, default `model.blocks`) for one forward
    pass (first call per block only, so an activation-checkpointing recompute does not count
    twice). A block's stream is its first floating-point input (positional, else keyword) and
    its output (or the output's first element: Hugging Face blocks may return tuples); a block
    whose output shape differs from its input's is not a residual block and is skipped."""
    stats = BlockStats()
    if blocks is None:
        blocks = getattr(model, "blocks", None)
    handles = []
    for i, block in enumerate(blocks or []):
        name = f"blocks.{i}"

        def hook(module, args, kwargs, output, name=name) -> None:
            if name in stats.rms:
                return
            x = _first_tensor(args) if args else None
            x = x if x is not None else _first_tensor(kwargs.values())
            y = output[0] if isinstance(output, tuple | list) and output else output
            if x is None or not torch.is_tensor(y) or y.shape != x.shape:
                return
            x, y = x.detach().float(), y.detach().float()
            rms_in = x.pow(2).mean().sqrt()
            stats.rms[name] = float(y.pow(2).mean().sqrt())
            stats.write_ratio[name] = float((y - x).pow(2).mean().sqrt() / rms_in.clamp_min(1e-12))

        handles.append(block.register_forward_hook(hook, with_kwargs=True))
    try:
        yield stats
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def attention_capture(model: nn.Module, heads: int) -> Iterator[dict[str, float]]:
    """Ask each block's attention for the entropy of `heads` sampled heads during one forward.

    Fused attention returns no probabilities, so the built-in GPT recomputes them for a few
    heads and rows when `capture_heads` is set; other models are skipped."""
    entropies: dict[str, float] = {}
    modules = [
        (f"blocks.{i}", b.attn)
        for i, b in enumerate(getattr(model, "blocks", []) or [])
        if hasattr(getattr(b, "attn", None), "capture_heads")
    ]
    for _, attn in modules:
        attn.capture_heads = heads
    try:
        yield entropies
    finally:
        for name, attn in modules:
            attn.capture_heads = 0
            entropy = getattr(attn, "last_entropy", None)
            if entropy is not None and torch.isfinite(entropy).all():
                entropies[name] = float(entropy.float().mean())
            attn.last_entropy = None


def moe_stats(model: nn.Module) -> dict[str, float]:
    """Load imbalance (max/mean routed share per expert: 1 balanced, n_experts collapsed) per MoE
    block and the mean auxiliary loss, from what the MoE layers kept of their last forward."""
    found: dict[str, float] = {}
    aux = []
    for i, block in enumerate(getattr(model, "blocks", []) or []):
        load = getattr(getattr(block, "mlp", None), "last_load", None)
        if load is None:
            continue
        load = load.float()
        found[f"moe/imbalance/blocks.{i}"] = float(load.max() / load.mean().clamp_min(1e-12))
        if getattr(block.mlp, "last_aux_loss", None) is not None:
            aux.append(float(block.mlp.last_aux_loss))
    if aux:
        found["moe/aux_loss"] = sum(aux) / len(aux)
    return found


class StepScan:
    """The held-out loss with a step just taken scaled by each of STEP_MULTIPLES (0: the
    weights before it, 1: the step taken). Where the loss bottoms out along the step's own
    direction says whether longer steps would have paid: a best multiple far above 1 is a step
    far shorter than the loss surface allows.

    The weights move in place to `taken + (multiple - 1) * delta` and are put back bit for bit
    from a buffer allocated once and reused by every scan (a week-long run does not allocate a
    copy of the model per probe); the forwards run in eval mode (no dropout draws) without
    autograd, so training is unchanged."""

    def __init__(self, multiples: tuple[float, ...] = STEP_MULTIPLES):
        self.multiples = multiples
        self._taken: list[torch.Tensor] = []

    @torch.no_grad()
    def __call__(
        self,
        model: nn.Module,
        params: list[torch.Tensor],
        delta: list[torch.Tensor],
        heldout_loss: Callable[[], Any],
        before_step: Callable[[], Any] | None = None,
    ) -> dict[str, float]:
        """{`step/loss_x<multiple>`: loss}. `params`: the live weights (`.data`); `delta`: the
        step just taken, fp32, same shapes; `heldout_loss()`: one forward on the held-out batch;
        `before_step()`: called once with the weights as they were before the step (at the first
        step, the model as initialised)."""
        if [t.shape for t in self._taken] != [p.shape for p in params]:
            self._taken = [torch.empty_like(p) for p in params]
        torch._foreach_copy_(self._taken, params)
        training = model.training
        model.eval()
        losses: dict[str, float] = {}
        try:
            if before_step is not None:
                torch._foreach_add_(params, delta, alpha=-1.0)
                before_step()
            for multiple in self.multiples:
                torch._foreach_copy_(params, self._taken)
                if multiple != 1.0:
                    torch._foreach_add_(params, delta, alpha=multiple - 1.0)
                losses[f"step/loss_x{multiple:g}"] = float(heldout_loss())
        finally:
            torch._foreach_copy_(params, self._taken)
            model.train(training)
        return losses


def first_nonfinite_module(model: nn.Module, forward) -> str | None:
    """Replay `forward()` with hooks on every module; name the first (in execution order) whose
    output holds a NaN or Inf: where the numbers went bad, not where they ended up."""
    first: list[str] = []
    handles = []
    for name, module in model.named_modules():
        if not name:
            continue

        def hook(module, inputs, output, name=name) -> None:
            outputs = output if isinstance(output, tuple | list) else (output,)
            tensors = [t for t in outputs if torch.is_tensor(t) and t.is_floating_point()]
            if not first and has_nonfinite(tensors):
                first.append(name)

        handles.append(module.register_forward_hook(hook))
    try:
        with torch.no_grad():
            forward()
    finally:
        for handle in handles:
            handle.remove()
    return first[0] if first else None


@dataclass
class LayerTimes:
    """Seconds spent in each named module, forward and backward, summed over profiled steps."""

    forward: dict[str, float] = field(default_factory=dict)
    backward: dict[str, float] = field(default_factory=dict)


@contextmanager
def layer_timer(modules: dict[str, nn.Module], sync=lambda: None) -> Iterator[LayerTimes]:
    """Time each module's forward and backward with hooks (`sync` waits for the device, e.g.
    torch.cuda.synchronize, so the clock measures the work and not its launch)."""
    times = LayerTimes()
    started: dict[tuple[str, str], float] = {}
    handles = []

    def start(kind: str, name: str):
        def hook(*_):
            sync()
            started[(kind, name)] = time.perf_counter()

        return hook

    def stop(kind: str, name: str, into: dict[str, float]):
        def hook(*_):
            sync()
            into[name] = into.get(name, 0.0) + time.perf_counter() - started.pop((kind, name))

        return hook

    for name, module in modules.items():
        handles += [
            module.register_forward_pre_hook(start("f", name)),
            module.register_forward_hook(stop("f", name, times.forward)),
            module.register_full_backward_pre_hook(start("b", name)),
            module.register_full_backward_hook(stop("b", name, times.backward)),
        ]
    try:
        yield times
    finally:
        for handle in handles:
            handle.remove()
