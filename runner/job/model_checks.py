"""Facts of a model's forward, read once on the probe's held-out batch with the weights before
the first scanned step (the model as initialised) for hyprun.diag.invariants:

- repeatable: in eval mode the same batch at the same weights gives the same loss
  (eval_not_repeatable);
- causal: the output at a position does not move when only later input ids change
  (future_visible);
- a residual stream: the inputs of a block's norm layers carry the stream from one to the next
  (stream_not_carried);
- nonlinear: no linear layer is fed another's output unchanged (linear_without_activation);
- a training forward at the scale of evaluation: dropout keeps each unit's expectation, so the
  stream a norm layer reads is about as large in train mode as in eval mode
  (dropout_misscaled);
- the held-out targets against the held-out inputs: the reference the training targets are
  read against (labels_unpaired);
- rows apart: a row's output does not move when only the batch's other rows change
  (rows_mixed), nor when only its place in the batch does (batch_index_read);
- padding unread: the outputs at real positions do not move when only the embeddings at padded
  positions change (padding_read);
- dropout on the branches: the stream a later norm layer reads holds no more exact zeros in
  train mode than in eval mode (stream_dropped);
- attention scaled and normalised: q.k divided by sqrt(head_dim), weights summing to one over
  the keys (attention_scale_wrong, attention_rows_unnormalised; runner/job/attention_reads.py);
- twins each in their place: no child module is left uncalled while its twin (same class and
  parameter shapes, same parent) runs more often than their parent (twin_called_instead);
- the logits as returned: a next-token cross-entropy reads the model's logits, not a multiple of
  them (logits_rescaled);
- no parameter read cut from the graph (`.data`, `.detach()`) (outputs_unused).

Twenty forwards per run, all in eval mode but one, all but the last without autograd (the cut
reads need the graph; no backward runs), inside a forked RNG: the training that follows draws
the same random numbers as without them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from hyprun.runner.job.attention_reads import AttentionReads, attention_reads


def repeat_gap(model: nn.Module, loss: Callable[[], Any]) -> float:
    """|a - b| / |a| of two eval-mode losses of the same batch at the same weights."""
    with _evaluating(model):
        first, second = float(loss()), float(loss())
    return abs(first - second) / max(abs(first), 1e-12)


def future_influence(model: nn.Module, batch: Any, loss: Callable[[Any], Any]) -> float | None:
    """How far the model's per-position output over the first quarter of the positions moves
    when the ids of the second half change (rolled across rows), over the largest of those
    outputs. The quarter leaves room for a loss that feeds the model its ids shifted by one
    (`tokens[:, :-1]`). None: the batch holds no (rows, positions) ids, or no module returned
    an output per row and position."""
    ids = input_ids(batch)
    if ids is None or ids.shape[1] < 8:
        return None
    changed = ids.clone()
    half = ids.shape[1] // 2
    source = ids.roll(1, 0) if ids.shape[0] > 1 else ids.flip(1)
    changed[:, half:] = source[:, half:]
    quarter = ids.shape[1] // 4
    return _output_move(model, batch, loss, changed, lambda out: out[:, :quarter])


def row_influence(model: nn.Module, batch: Any, loss: Callable[[Any], Any]) -> float | None:
    """How far the last row's per-position output moves when every other row's ids change
    (each of those rows rolled by one position), over the largest of those outputs. In eval mode
    a row's output is a function of that row alone. The last row: a causal mask laid over the
    batch by mistake lets it read every row before it (the first reads only itself). None: fewer
    than two rows of (rows, positions) ids, or no module returned an output per row and
    position."""
    ids = input_ids(batch)
    if ids is None or ids.shape[0] < 2 or ids.shape[1] < 2:
        return None
    changed = ids.clone()
    changed[:-1] = ids[:-1].roll(1, 1)
    return _output_move(model, batch, loss, changed, lambda out: out[-1])


def index_influence(model: nn.Module, batch: Any, loss: Callable[[Any], Any]) -> float | None:
    """How far each row's per-position output moves when only its place in the batch changes
    (every per-row tensor of the batch rolled by one row, the outputs rolled back), over the
    largest output. In eval mode a row's output is a function of that row alone, wherever it
    sits. None: fewer than two distinct rows of (rows, positions) ids, or no module returned an
    output per row and position."""
    ids = input_ids(batch)
    if ids is None or ids.shape[0] < 2 or torch.equal(ids, ids.roll(1, 0)):
        return None
    moved = _rows_rolled(batch, ids.shape[0])
    with _evaluating(model):
        before = _last_output(model, lambda: loss(batch), ids.shape)
        after = _last_output(model, lambda: loss(moved), ids.shape)
    if before is None or after is None or before.shape != after.shape:
        return None
    back = after.roll(-1, 0).float()
    return float((before.float() - back).abs().max() / before.float().abs().max().clamp_min(1e-12))


def padding_influence(
    model: nn.Module,
    batch: Any,
    loss: Callable[[Any], Any],
    embedding: nn.Module | None,
    pad_id: int | None,
) -> float | None:
    """How far the outputs at real positions move when only the token embeddings at padded
    positions change (noise the size of the embeddings added there, the ids kept, so a mask the
    model derives from them stays as it was), over the largest of those outputs. Padding: where
    the batch's attention_mask is 0, else each row's leading or trailing run of `pad_id`. None:
    no padded position beside real ones, no token embedding, or no output per position."""
    ids = input_ids(batch)
    padded = _padding(batch, ids, pad_id) if ids is not None else None
    if embedding is None or padded is None or not padded.any() or padded.all():
        return None

    def noisy(module, args, output):
        if not torch.is_tensor(output) or output.dim() != 3 or output.shape[0] != ids.shape[0]:
            return output
        where = padded[:, : output.shape[1]].unsqueeze(-1).to(output.device)
        noise = torch.randn(output.shape, generator=torch.Generator().manual_seed(0))
        return output + where * noise.to(output) * output.float().std().to(output.dtype)

    with _evaluating(model):
        before = _last_output(model, lambda: loss(batch), ids.shape)
        handle = embedding.register_forward_hook(noisy)
        try:
            after = _last_output(model, lambda: loss(batch), ids.shape)
        finally:
            handle.remove()
    if before is None or after is None or before.shape != after.shape:
        return None
    real = ~padded[:, : before.shape[1]].to(before.device)
    kept, moved = before.float()[real], after.float()[real]
    return float((kept - moved).abs().max() / kept.abs().max().clamp_min(1e-12))


def _padding(batch: Any, ids: torch.Tensor, pad_id: int | None) -> torch.Tensor | None:
    """(rows, positions) True at padding: the batch's attention_mask == 0, else each row's
    leading or trailing run of pad_id (invariant_hooks.padding_mask); None: neither is there."""
    from hyprun.runner.job.invariant_hooks import padding_mask

    mask = batch.get("attention_mask") if isinstance(batch, dict) else None
    if torch.is_tensor(mask) and mask.shape == ids.shape:
        return mask == 0
    return padding_mask(ids, pad_id) == 0 if pad_id is not None else None


def _rows_rolled(batch: Any, rows: int) -> Any:
    """The batch with every tensor of `rows` rows rolled by one row, same container types."""
    if torch.is_tensor(batch):
        return batch.roll(1, 0) if batch.dim() >= 1 and batch.shape[0] == rows else batch
    if isinstance(batch, dict):
        return type(batch)({k: _rows_rolled(v, rows) for k, v in batch.items()})
    if isinstance(batch, list | tuple):
        items = [_rows_rolled(v, rows) for v in batch]
        return type(batch)(*items) if hasattr(batch, "_fields") else type(batch)(items)
    return batch


def _output_move(model: nn.Module, batch: Any, loss, changed: torch.Tensor, part) -> float | None:
    """In eval mode, how far `part` of the per-position output moves when the batch's ids are
    replaced by `changed`, over the largest of `part` before. None: nothing changed, or no
    module returned an output per row and position."""
    ids = input_ids(batch)
    if torch.equal(changed, ids):
        return None
    with _evaluating(model):
        before = _last_output(model, lambda: loss(batch), ids.shape)
        after = _last_output(model, lambda: loss(_replaced(batch, ids, changed)), ids.shape)
    if before is None or after is None or before.shape != after.shape:
        return None
    kept, moved = part(before).float(), part(after).float()
    return float((kept - moved).abs().max() / kept.abs().max().clamp_min(1e-12))


def attention(model: nn.Module, loss: Callable[[], Any]) -> AttentionReads | None:
    """How the model's attention scales q.k and normalises its weights, on one eval forward
    (runner/job/attention_reads.py). None: no attention read."""
    with _evaluating(model):
        return attention_reads(model, loss)


def heldout_label_offsets(model: nn.Module, loss: Callable[[], Any]) -> tuple | None:
    """Per offset of hyprun.diag.invariants.LABEL_OFFSETS, the share of the held-out batch's
    cross-entropy targets equal to the input id that many positions later (the reference the
    training targets are read against: invariants.labels_unpaired). None: no cross-entropy
    call whose targets pair with the forward's ids."""
    from hyprun.runner.job.invariant_hooks import label_offsets, read_ids

    reads: list[tuple] = []
    seen: dict[str, torch.Tensor] = {}

    def keep_ids(module, args, kwargs) -> None:
        ids = read_ids(args, kwargs)
        if ids is not None:
            seen["ids"] = ids

    class Targets(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is F.cross_entropy and len(args) >= 2 and "ids" in seen:
                target = args[1]
                if torch.is_tensor(target) and not target.is_floating_point():
                    ignore = int(kwargs.get("ignore_index", -100))
                    found = label_offsets(seen["ids"], target.detach(), ignore)
                    if found is not None:
                        reads.append(found)
            return func(*args, **kwargs)

    handle = model.register_forward_pre_hook(keep_ids, with_kwargs=True)
    try:
        with _evaluating(model), Targets():
            loss()
    finally:
        handle.remove()
    return reads[0] if reads else None


NORMS = (nn.LayerNorm, nn.RMSNorm)
"""Norm layers applied per position, torch's own; a class named *LayerNorm or *RMSNorm counts
too (Hugging Face's, a model's own). Their input is the residual stream where a block normalises
it before each branch (pre-norm) or after adding each branch (post-norm)."""


def structure(
    model: nn.Module, loss: Callable[[], Any]
) -> tuple[dict[str, tuple[float, float]], list[str]]:
    """One eval forward read by hooks: (by "first -> second", each two norm layers of one block
    called one after the other: the mean cosine over positions between their inputs and the
    second input's RMS over the first's; the linear pairs whose second layer's input is the
    first's output unchanged, as "first -> second"). A block's norm layers are siblings of one
    parent module; a linear pair counts only
    without a bottleneck (the middle width at least the narrower end's), so a low-rank
    factorisation (LoRA) is not one."""
    pairs: dict[str, tuple[float, float]] = {}
    chains: list[str] = []
    names = {id(module): name for name, module in model.named_modules()}
    parents = _norm_parents(model)
    last_norm: list = [None]  # (parent, name, input) of the norm layer that ran last
    last_linear: list = [None]  # (name, widths, output) of the linear layer that ran last

    def norm_input(module, args) -> None:
        x = args[0].detach() if args and torch.is_tensor(args[0]) else None
        if x is None:
            return
        parent, name = parents[id(module)], names[id(module)]
        previous = last_norm[0]
        if previous and previous[0] == parent and previous[2].shape == x.shape:
            first, second = previous[2].float(), x.float()
            cosine = float(F.cosine_similarity(first, second, dim=-1).mean())
            growth = float(
                second.pow(2).mean().sqrt() / first.pow(2).mean().sqrt().clamp_min(1e-12)
            )
            pairs[f"{previous[1]} -> {name}"] = (cosine, growth)
        last_norm[0] = (parent, name, x)

    def linear_output(module, args, output) -> None:
        widths = _linear_widths(module)
        x = args[0] if args and torch.is_tensor(args[0]) else None
        previous = last_linear[0]
        fed = previous and x is not None and _collapses(previous[1], widths)
        if fed and previous[2].shape == x.shape and torch.equal(previous[2], x):
            chains.append(f"{previous[0]} -> {names[id(module)]}")
        last_linear[0] = (names[id(module)], widths, output.detach().clone())

    handles = [
        module.register_forward_pre_hook(norm_input)
        for module in model.modules()
        if id(module) in parents
    ]
    handles += [
        module.register_forward_hook(linear_output)
        for module in model.modules()
        if _linear_widths(module) is not None
    ]
    _hooked_eval_forward(model, loss, handles)
    return pairs, chains


def sibling_calls(
    model: nn.Module, loss: Callable[[], Any]
) -> list[tuple[str, dict[str, int], int]]:
    """One eval forward's call counts of twin modules: per parent module, each set of two or
    more children of one class whose parameters have the same shapes (a block's two norm
    layers, its query and key projections, a stack's layers), as (the parent, calls by child,
    calls of the parent)."""
    calls: dict[int, int] = {}

    def count(module, _args) -> None:
        calls[id(module)] = calls.get(id(module), 0) + 1

    handles = [module.register_forward_pre_hook(count) for module in model.modules()]
    _hooked_eval_forward(model, loss, handles)
    found = []
    for parent_name, parent in model.named_modules():
        for twins in _twin_children(parent).values():
            if len(twins) > 1:
                by_child = {
                    f"{parent_name}.{name}".lstrip("."): calls.get(id(child), 0)
                    for name, child in twins
                }
                found.append(
                    (parent_name or type(model).__name__, by_child, calls.get(id(parent), 0))
                )
    return found


def _twin_children(parent: nn.Module) -> dict[tuple, list[tuple[str, nn.Module]]]:
    """The parent's own children that hold parameters, grouped by class and parameter shapes."""
    groups: dict[tuple, list[tuple[str, nn.Module]]] = {}
    for name, child in parent.named_children():
        shapes = tuple(tuple(p.shape) for p in child.parameters())
        if shapes:
            groups.setdefault((type(child), shapes), []).append((name, child))
    return groups


def detached_reads(model: nn.Module, loss: Callable[[], Any]) -> list[str]:
    """The trainable parameters whose values one forward (autograd on) read through a tensor
    cut from the graph (`param.data`, `param.detach()`): an operand that shares a parameter's
    storage and does not require a gradient. A view taken the usual way (`weight[:T]`) still
    requires one, so only a cut read counts."""
    by_storage: dict[int, list[str]] = {}
    for name, param in model.named_parameters():
        if param.requires_grad and param.numel():
            by_storage.setdefault(param.untyped_storage().data_ptr(), []).append(name)
    # one storage under several parameters (a flat buffer) is ambiguous: not read
    storages = {pointer: names[0] for pointer, names in by_storage.items() if len(names) == 1}
    found: list[str] = []
    with _evaluating(model), torch.enable_grad(), _CutReads(storages, found):
        loss()
    return found


class _CutReads(TorchFunctionMode):
    """Collects the parameters (by name, from `storages`) that an operation reads through a
    tensor that shares their storage and does not require a gradient."""

    def __init__(self, storages: dict[int, str], found: list[str]):
        super().__init__()
        self.storages, self.found = storages, found

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for operand in (*args, *kwargs.values()):
            if torch.is_tensor(operand) and not operand.requires_grad and operand.numel():
                name = self.storages.get(operand.untyped_storage().data_ptr())
                if name is not None and name not in self.found:
                    self.found.append(name)
        return func(*args, **kwargs)


def loss_logit_scale(model: nn.Module, loss: Callable[[], Any]) -> float | None:
    """The factor c by which the cross-entropy the loss calls reads the model's own logits
    (c x the logits, all positions or all but the last), in one eval forward: 1 when the loss
    reads the logits as they are. None: the model returned no (rows, positions, classes)
    logits, or no cross-entropy read a multiple of them."""
    seen: list[torch.Tensor] = []
    logits: list[torch.Tensor] = []

    def keep(_module, _args, output) -> None:
        found = output if torch.is_tensor(output) else getattr(output, "logits", None)
        if found is None and isinstance(output, dict):
            found = output.get("logits")
        if torch.is_tensor(found) and found.dim() == 3 and found.is_floating_point():
            logits.append(found.detach())

    handle = model.register_forward_hook(keep)
    try:
        with _evaluating(model), _CrossEntropyInputs(seen):
            loss()
    finally:
        handle.remove()
    if not logits:
        return None
    factors = [_factor(scores, logits[-1]) for scores in seen]
    return next((factor for factor in factors if factor is not None), None)


class _CrossEntropyInputs(TorchFunctionMode):
    """Keeps the input of each F.cross_entropy call made while active."""

    def __init__(self, seen: list[torch.Tensor]):
        super().__init__()
        self.seen = seen

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.cross_entropy:
            scores = args[0] if args else kwargs.get("input")
            if torch.is_tensor(scores) and scores.is_floating_point():
                self.seen.append(scores.detach())
        return func(*args, **kwargs)


def _factor(scores: torch.Tensor, logits: torch.Tensor) -> float | None:
    """c where scores = c x logits (every position, or all but the last: labels or logits
    shifted) to float32 rounding, else None."""
    for kept in (logits, logits[:, :-1]):
        if kept.numel() != scores.numel():
            continue
        given, own = scores.float().flatten(), kept.float().flatten()
        factor = float(given @ own / (own @ own).clamp_min(1e-30))
        if float((given - factor * own).norm()) <= 1e-4 * float(given.norm()):
            return factor
    return None


def train_eval_scale(model: nn.Module, loss: Callable[[], Any]) -> float | None:
    """The largest ratio, over the per-position norm layers, of the RMS of the input a norm
    layer reads in a train-mode forward to the one it reads in an eval-mode forward of the same
    batch at the same weights (no autograd, the RNG forked). None: no norm layer was called."""
    train = _norm_inputs(model, loss, _rms, training=True)
    evaluation = _norm_inputs(model, loss, _rms, training=False)
    ratios = [train[k] / evaluation[k] for k in train if evaluation.get(k, 0) > 0]
    return max(ratios) if ratios else None


def stream_zeros(model: nn.Module, loss: Callable[[], Any]) -> dict[str, float] | None:
    """By per-position norm layer, all but the first one called: the share of exact zeros in
    the input it reads in a train-mode forward, less that share in an eval-mode forward of the
    same batch at the same weights (no autograd, the RNG forked). Dropout on a branch's output
    leaves none in the stream once the branch is added to it; dropout on the stream itself
    leaves its rate. The first norm layer reads the embedding, which a model may drop on
    purpose. None: fewer than two norm layers called."""
    train = _norm_inputs(model, loss, _zero_share, training=True)
    evaluation = _norm_inputs(model, loss, _zero_share, training=False)
    later = list(train)[1:]
    if not later:
        return None
    return {name: train[name] - evaluation.get(name, 0.0) for name in later}


def _norm_inputs(model, loss, measure, training: bool) -> dict[str, float]:
    """By per-position norm layer, in the order first called: `measure` of its first input in
    one forward in the given mode."""
    names = {id(module): name for name, module in model.named_modules() if is_norm(module)}
    found: dict[str, float] = {}

    def read(module, args) -> None:
        name = names[id(module)]
        if args and torch.is_tensor(args[0]) and name not in found:
            found[name] = measure(args[0].detach())

    handles = [m.register_forward_pre_hook(read) for m in model.modules() if id(m) in names]
    try:
        with _evaluating(model):
            model.train(training)
            torch.manual_seed(0)
            loss()
    finally:
        for handle in handles:
            handle.remove()
    return found


def _rms(x: torch.Tensor) -> float:
    return float(x.float().pow(2).mean().sqrt())


def _zero_share(x: torch.Tensor) -> float:
    return float((x == 0).float().mean())


def _norm_parents(model: nn.Module) -> dict[int, str]:
    """id of each per-position norm layer -> the name of the module that holds it."""
    return {
        id(child): parent_name
        for parent_name, parent in model.named_modules()
        for child in parent.children()
        if is_norm(child)
    }


def is_norm(module: nn.Module) -> bool:
    """A norm layer applied per position (NORMS)."""
    name = type(module).__name__
    return isinstance(module, NORMS) or name.endswith(("LayerNorm", "RMSNorm"))


def _linear_widths(module: nn.Module) -> tuple[int, int] | None:
    """(in, out) of a linear layer: torch's nn.Linear, or transformers' Conv1D (GPT-2's, its
    weight stored (in, out)); None for any other module."""
    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features
    if type(module).__name__ == "Conv1D" and getattr(module, "weight", None) is not None:
        rows, columns = module.weight.shape
        return int(rows), int(columns)
    return None


def _collapses(first: tuple[int, int], second: tuple[int, int]) -> bool:
    """Two linear maps in a row with no bottleneck between them: the pair is one linear map
    (W2 W1) with more parameters, so the layer between them adds no function."""
    return first[1] == second[0] and first[1] >= min(first[0], second[1])


def _hooked_eval_forward(model: nn.Module, loss: Callable[[], Any], handles: list) -> None:
    """One eval-mode forward of `loss()` read by the hooks in `handles`, removed after it."""
    try:
        with _evaluating(model):
            loss()
    finally:
        for handle in handles:
            handle.remove()


class _evaluating:
    """Eval mode, no autograd and a forked RNG for the duration; the mode is put back."""

    def __init__(self, model: nn.Module):
        self.model, self.training = model, model.training
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        self.fork = torch.random.fork_rng(devices=range(torch.cuda.device_count()) if cuda else [])
        self.grad = torch.no_grad()

    def __enter__(self):
        self.fork.__enter__()
        self.grad.__enter__()
        self.model.eval()

    def __exit__(self, *exc):
        self.model.train(self.training)
        self.grad.__exit__(*exc)
        self.fork.__exit__(*exc)


def _last_output(model: nn.Module, forward: Callable[[], Any], ids_shape) -> torch.Tensor | None:
    """The last tensor any module of `model` returned with one row per batch row and at least
    half the positions (the head's logits, the model's own output), under a fixed seed so a
    forward that still draws dropout draws the same masks both times."""
    rows, width = ids_shape
    seen: list[torch.Tensor] = []

    def keep(module, inputs, output) -> None:
        per_position = torch.is_tensor(output) and output.is_floating_point()
        per_position = per_position and output.dim() == 3 and output.shape[0] == rows
        if per_position and output.shape[1] >= width // 2:
            seen.append(output.detach())

    handles = [m.register_forward_hook(keep) for m in model.modules()]
    try:
        torch.manual_seed(0)
        forward()
    finally:
        for handle in handles:
            handle.remove()
    return seen[-1] if seen else None


def input_ids(batch: Any) -> torch.Tensor | None:
    """The batch's input ids: `input_ids`, else its first integer (rows, positions) tensor."""
    if isinstance(batch, dict):
        candidates = [batch["input_ids"]] if "input_ids" in batch else list(batch.values())
    elif isinstance(batch, list | tuple):
        candidates = list(batch)
    else:
        candidates = [batch]
    for value in candidates:
        if torch.is_tensor(value) and not value.is_floating_point() and value.dim() == 2:
            return value
    return None


def _replaced(batch: Any, old: torch.Tensor, new: torch.Tensor) -> Any:
    """The batch with the tensor `old` (by identity) swapped for `new`, same container types."""
    if batch is old:
        return new
    if isinstance(batch, dict):
        return type(batch)({k: _replaced(v, old, new) for k, v in batch.items()})
    if isinstance(batch, list | tuple):
        items = [_replaced(v, old, new) for v in batch]
        return type(batch)(*items) if hasattr(batch, "_fields") else type(batch)(items)
    return batch
