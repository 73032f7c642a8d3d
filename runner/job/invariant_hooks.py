"""The torch hooks hyprun.diag.invariants needs, on any model: what they read, at which step.

Attached by the probe (runner/job/probe.py) and the corpus bench's watch. Per step they cost a
read of a few modules' `.training` per forward and one Python call per parameter per backward;
the only pass over gradient values is on the steps `checked` names, and only where a `.grad`
is already there (zero_grad(set_to_none=True), torch's default, leaves None: nothing to read).
"""

from __future__ import annotations

import math
import weakref
from collections import Counter
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode, _get_current_function_mode_stack

from hyprun.diag.invariants import LABEL_MATCH, LABEL_OFFSETS, REWRITE_SHARE
from hyprun.runner.job.attention_reads import AttentionReads
from hyprun.runner.job.dropout_calls import DropoutCalls
from hyprun.runner.job.eval_targets import EVAL_FORWARDS, EvalTargets

MODE_MODULES = (nn.Dropout, nn.modules.batchnorm._BatchNorm)
"""Modules whose forward depends on train/eval mode."""
MIN_LABELS = 16
"""Targets a label read needs at every offset (fewer: a classifier's few labels, not judged)."""
ROW_READ_STEPS = 64
"""Optimizer steps whose training rows are hashed, for rows repeated within an epoch: the
first epoch's, or this many of them (any prefix of an epoch holds each row once)."""
LOSS_READ_STEPS = 3
"""Optimizer steps whose first training forward and loss are read for cross-entropy's input
(a bug of the code is there from the first step; every op of those forwards passes through
Python once)."""
SCHEDULER_ADVANCES = 64
"""Steps of each LR scheduler placed among the optimizer's steps (enough to see its period;
a per-step scheduler would otherwise grow the list with the run)."""
WEIGHT_SAMPLE = 8
"""Elements read per weight tensor, spread evenly over it, to see a tensor rewritten between an
optimizer step and the next forward: a copy of other weights (an average, a checkpoint, a fresh
init) changes almost every element, so a few per tensor show it, and the read costs one small
copy per step instead of a pass over the model."""


LOG_SOFTMAX = (F.log_softmax, torch.log_softmax, torch.Tensor.log_softmax)
PRODUCTS = (torch.mul, torch.Tensor.mul, torch.Tensor.__mul__, torch.Tensor.__rmul__)


class LossInputs(TorchFunctionMode):
    """While active, reads each F.cross_entropy call for hyprun.diag.invariants, into `hooks`:
    what it is given (smallest, largest value, largest |sum over the class dimension - 1|), how
    its targets sit against the forward's input ids, and the weight backward gives its tokens;
    each F.nll_loss call's input (whether its rows are log-probabilities); and the soft targets
    a hand-written loss weighs log-probabilities by (a product with a log-softmax output of the
    same shape, F.kl_div's target): how far their rows' sums are from 1."""

    def __init__(self, hooks: InvariantHooks):
        super().__init__()
        self.hooks = hooks
        self.log_probs: list[torch.Tensor] = []
        """This read's log-softmax outputs (kept until the backward is done)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func in LOG_SOFTMAX and torch.is_tensor(out):
            self.log_probs.append(out)
        elif func in PRODUCTS and len(args) == 2:
            self._read_soft_targets(*args)
        elif func is F.kl_div and len(args) >= 2 and not kwargs.get("log_target", False):
            self._read_soft_targets(args[0], args[1], given=True)
        if func is F.nll_loss:
            scores = args[0] if args else kwargs.get("input")
            if torch.is_tensor(scores) and scores.is_floating_point() and scores.numel():
                self.hooks.nll_inputs.append(class_normaliser(scores.detach()))
        if func is F.cross_entropy:
            scores = args[0] if args else kwargs.get("input")
            target = args[1] if len(args) > 1 else kwargs.get("target")
            if torch.is_tensor(scores) and scores.is_floating_point() and scores.numel():
                self.hooks.loss_inputs.append(class_spread(scores.detach()))
            if _is_ids(target) and len(args) <= 2:  # positional weight/reduction: not read
                self.hooks.read_targets(target.detach(), kwargs, out)
        return out

    def _read_soft_targets(self, first, second, given: bool = False) -> None:
        """A product of log-probabilities with a tensor of their shape weighs each class's
        log-probability: a target distribution, whose rows (over the last dimension) must
        sum to 1 (rows of all zeros are masked out). `given`: `second` is such a target
        whatever `first` is (kl_div)."""
        if not given and any(second is seen for seen in self.log_probs):
            first, second = second, first
        elif not given and not any(first is seen for seen in self.log_probs):
            return
        if not (torch.is_tensor(first) and torch.is_tensor(second)):
            return
        if any(second is seen for seen in self.log_probs):  # log p x log p: no target
            return
        if second.shape != first.shape or second.dim() < 1 or not second.is_floating_point():
            return
        if second.shape[-1] < 2:
            return
        sums = second.detach().float().sum(-1).abs().flatten()
        counted = sums[sums > 0]
        if counted.numel():
            self.hooks.soft_targets.append(float((counted - 1).abs().max()))


def label_offsets(inputs: torch.Tensor, target: torch.Tensor, ignore: int) -> tuple | None:
    """Per offset of hyprun.diag.invariants.LABEL_OFFSETS, the share of the counted targets
    equal to the input id that many positions later. The target (flattened or not) is read as
    (batch, positions) against the inputs (batch, positions), its position t as the output at
    input position t. None: the shapes do not pair, or too few targets to read."""
    if inputs.dim() != 2 or target.numel() % inputs.shape[0]:
        return None
    rows, width = inputs.shape
    target = target.reshape(rows, -1)
    length = target.shape[1]
    if length < 2 or length > width:
        return None
    shares = []
    for offset in LABEL_OFFSETS:
        span = min(length, width - offset)
        wanted, counted = target[:, :span], target[:, :span] != ignore
        if int(counted.sum()) < MIN_LABELS:
            return None
        same = (wanted == inputs[:, offset : offset + span]) & counted
        shares.append(float(same.sum()) / float(counted.sum()))
    return tuple(shares)


def padded_targets(mask: torch.Tensor, target: torch.Tensor, ignore: int) -> tuple[int, int]:
    """(targets counted where the next position is masked out, targets counted): the target
    at t is the token at t + 1 (label_offsets read them so)."""
    rows, width = mask.shape
    target = target.reshape(rows, -1)
    span = min(target.shape[1], width - 1)
    counted = target[:, :span] != ignore
    hidden = mask[:, 1 : span + 1] == 0
    return int((counted & hidden).sum()), int(counted.sum())


def masked_real_tokens(
    mask: torch.Tensor, inputs: torch.Tensor, target: torch.Tensor, ignore: int
) -> tuple[Counter, set[int]]:
    """(by id, the real tokens (mask 1) whose target is masked out of the loss; the ids counted
    as targets): the target at t is the token at t + 1, as padded_targets reads it."""
    rows, width = mask.shape
    target = target.reshape(rows, -1)
    span = min(target.shape[1], width - 1)
    wanted, real = target[:, :span], mask[:, 1 : span + 1] != 0
    masked = inputs[:, 1 : span + 1][(wanted == ignore) & real]
    counted = wanted[wanted != ignore]
    return Counter(masked.tolist()), set(counted.unique().tolist())


def padding_mask(ids: torch.Tensor, pad_id: int) -> torch.Tensor:
    """A mask from the ids alone (0: padding): the run of `pad_id` at each row's end (right
    padding) or start (left padding), less its one next to the text, which may be a real
    end-of-text token where the padding reuses its id (GPT-2's habit)."""
    is_pad = (ids == pad_id).long()
    width = ids.shape[1]
    leading = is_pad.cumprod(1).sum(1, keepdim=True)
    trailing = is_pad.flip(1).cumprod(1).sum(1, keepdim=True)
    position = torch.arange(width, device=ids.device)
    padded = (position < leading - 1) | (position > width - trailing)
    return (~padded).long()


def _is_ids(tensor) -> bool:
    return torch.is_tensor(tensor) and not tensor.is_floating_point() and tensor.dim() >= 1


def _fp16_autocast() -> bool:
    """A float16 autocast region: its loss goes through a GradScaler, whose scale the weight
    backward gives the loss would include."""
    return any(
        torch.is_autocast_enabled(device) and torch.get_autocast_dtype(device) == torch.float16
        for device in ("cuda", "cpu")
    )


def class_spread(scores: torch.Tensor) -> tuple[float, float, float]:
    """(min, max, max |row sum - 1|) of a cross-entropy input; classes are dimension 1 of a
    batch (N, C, ...), dimension 0 of one unbatched (C,) row."""
    values = scores.float()
    sums = values.sum(dim=1 if values.dim() >= 2 else 0)
    return float(values.min()), float(values.max()), float((sums - 1).abs().max())


def class_normaliser(scores: torch.Tensor) -> float:
    """The largest |logsumexp over the class dimension| of an nll_loss input (0 for
    log-probabilities); classes are dimension 1 of a batch (N, C, ...), 0 of one (C,) row."""
    values = scores.float()
    return float(values.logsumexp(dim=1 if values.dim() >= 2 else 0).abs().max())


def mode_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Dropout with p > 0 and batch norm with running statistics: the modules whose output
    changes with the mode (a p=0 dropout is the identity in both)."""
    return [
        (name, module)
        for name, module in model.named_modules()
        if (isinstance(module, nn.Dropout) and module.p > 0)
        or (isinstance(module, nn.modules.batchnorm._BatchNorm) and module.track_running_stats)
    ]


@dataclass
class StepLoss:
    """What one of the first steps' cross-entropy calls weighed (invariants.accumulation_scale)."""

    forwards: int = 0
    """Training forwards of the step (its micro-batches)."""
    calls: int = 0
    """Cross-entropy calls whose weight is read (mean or sum, no class weights, not fp16)."""
    reached: int = 0
    """Calls backward reached (a loss only logged is not trained on)."""
    weight: float = 0.0
    """Total weight of their tokens in the backpropagated loss."""
    tokens: int = 0
    """Their counted tokens."""


OWN_FORWARDS: ContextVar[int] = ContextVar("hyprun_own_forwards", default=0)
"""Depth of `own_forwards` blocks: forwards the probe runs of its own."""


@contextmanager
def own_forwards():
    """Forwards a probe runs of its own (the step scan, the model checks, a NaN replay): no
    InvariantHooks reads them as the loop's training or evaluation, the probe's or another's."""
    token = OWN_FORWARDS.set(OWN_FORWARDS.get() + 1)
    try:
        yield
    finally:
        OWN_FORWARDS.reset(token)


def in_own_forward() -> bool:
    return OWN_FORWARDS.get() > 0


class InvariantHooks:
    """Attach to a model; call `stepped(step)` after each optimizer step."""

    def __init__(self, model: nn.Module, checked_steps=lambda step: step < 3):
        self.model = model
        self.modules = mode_modules(model)
        self.checked_steps = checked_steps
        """step -> whether the first backward of that step reads the gradients left over."""
        self.eval_at_train: set[str] = set()
        """Mode modules in eval mode at a forward that an optimizer step then used."""
        self.train_at_eval: set[str] = set()
        """Mode modules in train mode at a forward without gradients (an evaluation)."""
        self.stale: dict[int, float] = {}
        """By checked step: the norm of the gradients already there at its first backward."""
        self.read_accumulation = False
        """Whether later backwards of a step read the .grad they add to (a torch optimizer's
        parameters: a DeepSpeed ZeRO optimizer moves gradients out of .grad after each one)."""
        self.emptied: dict[int, tuple[int, int]] = {}
        """By checked step of several backwards: (later backwards that found their parameter's
        .grad None or all zero, later backwards) (invariants.accumulation_discarded)."""
        self.lrs: list[float] = []
        """The LR (group 0) after each optimizer step."""
        self.schedulers: dict[str, tuple[weakref.ref, int]] = {}
        """By name, the LR schedulers on the optimizer with their last_epoch when last read."""
        self.scheduler_advances: dict[str, list[int]] = {}
        """By scheduler, the optimizer step after which each of its steps was seen (the first
        SCHEDULER_ADVANCES)."""
        self.loss_inputs: list[tuple[float, float, float]] = []
        """What cross-entropy was given in the first LOSS_READ_STEPS steps (LossInputs)."""
        self.nll_inputs: list[float] = []
        """Per nll_loss call of the first steps: its input's largest |logsumexp| over classes."""
        self.soft_targets: list[float] = []
        """Per soft target of the first steps (LossInputs): its rows' largest |sum - 1|."""
        self.eval_gap: float | None = None
        """Two eval-mode held-out losses' relative gap (model_checks.repeat_gap), once read."""
        self.future_influence: float | None = None
        """The early outputs' move when later ids change (model_checks.future_influence)."""
        self.stream_pairs: dict[str, tuple[float, float]] | None = None
        """By pair of one block's norm layers: their inputs' mean cosine and RMS growth."""
        self.linear_chains: list[str] | None = None
        """Linear pairs, the second fed the first's output unchanged (model_checks.structure)."""
        self.state_resets: list[int] = []
        """Optimizer steps at which the optimizer's own step count went back (its state reset)."""
        self.row_influence: float | None = None
        """The rows' output move when only their places in the batch change (model_checks)."""
        self.index_influence: float | None = None
        """The last row's output move when only the other rows change (model_checks)."""
        self.stream_zeros: dict[str, float] | None = None
        """By later norm layer: the train-mode share of exact zeros it reads over eval's."""
        self.detached_reads: list[str] = []
        """Parameters a forward read through a tensor cut from the graph (model_checks)."""
        self.loss_logit_scale: float | None = None
        """c in the loss's input = c x the model's logits (model_checks.loss_logit_scale)."""
        self.twin_calls: list[tuple[str, dict[str, int], int]] | None = None
        """Call counts of twin modules in one forward (model_checks.sibling_calls)."""
        self.dropout_calls: DropoutCalls | None = None
        """One training forward's dropout calls (runner/job/dropout_calls.py)."""
        self.padding_influence: float | None = None
        """The real positions' output move when only padded embeddings change (model_checks)."""
        self.heldout_labels: tuple | None = None
        """The held-out batch's targets against its inputs (model_checks.heldout_label_offsets)."""
        self.train_eval_scale: float | None = None
        """Train-mode over eval-mode RMS of the norm layers' inputs (model_checks), once read."""
        self.attention: AttentionReads | None = None
        """How the model's attention scales q.k and normalises its weights (attention_reads)."""
        self.heldout_rows: set[int] | None = None
        """A hash of each row of the held-out batch's ids, once the probe has read it."""
        self.epoch_rows: list[tuple[int, int]] = []
        """(step, row hash) of each training row read in the first ROW_READ_STEPS steps."""
        self.heldout_ids: torch.Tensor | None = None
        """The held-out batch's ids (on the CPU), once the probe has read it."""
        self.train_id_max: int | None = None
        """The largest input id of the checked steps' training forwards."""
        self.heldout_seen: set[int] = set()
        """Held-out rows met among the training rows of the checked steps."""
        self.masked_real: Counter = Counter()
        """By id, the real tokens of the first steps whose target the loss masked out."""
        self.target_ids: set[int] = set()
        """The ids the first steps' losses counted as targets."""
        self.trained_targets: set[int] = set()
        """The ids the first steps' cross-entropy calls counted as targets, mask or none."""
        self.eval_targets = EvalTargets(in_own_forward)
        """The ids the first evaluation forwards' losses counted (runner/job/eval_targets.py)."""
        self.state_reads = 0
        """Optimizer steps whose step count or momentum buffer was read."""
        self._momentum: torch.Tensor | None = None
        """The first parameter's momentum buffer after the last step read (held, so a new one
        cannot take its place in memory and pass for it)."""
        self.called: set[str] = set()
        """Modules owning trainable parameters (the model itself aside) whose forward ran in
        training before the first backward (`called_modules` ends the read)."""
        self.unbacked: list[int] = []
        """Checked optimizer steps with no backward since the step before (the same gradients
        applied again), read where the gradients stay in .grad (`read_accumulation`)."""
        self.rewrite_reads = 0
        """Steps whose weights were held, before their first forward, against the last step's."""
        self._rewrites: torch.Tensor | None = None
        self._rewritten_tensors: torch.Tensor | None = None
        self._watched: list[nn.Parameter] = []
        self._views: list[torch.Tensor] = []
        self._storage: list[int] = []
        self._sample_of: torch.Tensor | None = None
        """Which watched tensor each element of a weight sample comes from."""
        self._sample_sizes: torch.Tensor | None = None
        self._after_step: torch.Tensor | None = None
        self._state_step: float | None = None
        self.label_reads: list[tuple[float, ...]] = []
        """Per cross-entropy call of the first steps whose targets pair with the forward's
        input ids: the share matching each offset (label_offsets)."""
        self.step_losses: dict[int, StepLoss] = {}
        """By step of the first LOSS_READ_STEPS: what its cross-entropy calls weighed."""
        self.padding_reads: list[tuple[int, int]] = []
        """Per cross-entropy call of the first steps whose targets are the next tokens and
        whose forward had an attention mask: (targets counted where the mask hides the token,
        targets counted) (invariants.loss_on_padding)."""
        self.batch_prints: list[int] = []
        """A hash of the input ids of each of the first LOSS_READ_STEPS steps' first training
        forward (invariants.repeated_batches)."""
        self.read_step_norms = False
        """Whether `stepped` reads the gradient norm the step applied (the probe's own step
        post-hook only: a trainer clips inside its step, a DeepSpeed engine frees them)."""
        self.step_norms: list[float] = []
        """The global gradient norm each of the first LOSS_READ_STEPS steps applied."""
        self.stream: list[tuple[int, float, float]] = []
        """(step, its training batch's loss before the update, the held-out loss at the same
        weights), on the steps whose held-out loss the caller read (`heldout_read`)."""
        counts = [(p.numel(), p.requires_grad) for p in model.parameters()]
        self.trainable_elements = sum(n for n, trainable in counts if trainable)
        self.total_elements = sum(n for n, _ in counts)
        self._step = 0
        self._last_train_modes: set[str] = set()
        self._seen: set[int] = set()
        self._stale_sum = 0.0
        self._later, self._emptied = 0, 0
        self._loss_mode: LossInputs | None = None
        self._inputs: torch.Tensor | None = None
        self._mask: torch.Tensor | None = None
        self.pad_id: int | None = None
        """The padding id a loop named (Probe's pad_id): read when the forward has no mask."""
        self.padding_idx: int | None = None
        """The token embedding's padding_idx (its row gets no gradient), when it has one."""
        self.padding_idx_attended: int | None = None
        """Attended positions of the first steps' inputs holding padding_idx; None: not read
        (no mask, or only the loop's pad id, which is padding_idx itself, to tell padding by)."""
        self._handles = [model.register_forward_pre_hook(self._forward, with_kwargs=True)]
        for parameter in model.parameters():
            if parameter.requires_grad:
                self._handles.append(parameter.register_hook(self._before_accumulation(parameter)))
        self._call_handles = [
            module.register_forward_pre_hook(self._called(name))
            for name, module in model.named_modules()
            if name and any(p.requires_grad for p in module.parameters(recurse=False))
        ]
        self.foreign: list[tuple[str, list[nn.Parameter], torch.Tensor]] = []
        """Modules with trainable parameters of their own that the first training forward ran
        and the model does not hold (held in a plain list or dict, or built in forward): a
        name, their parameters, a copy of a sample of them."""
        self._registered = {id(module) for module in model.modules()}
        self._call_handles.append(
            nn.modules.module.register_module_forward_pre_hook(self._foreign_call)
        )

    def _called(self, name: str):
        def hook(module: nn.Module, args) -> None:
            if not in_own_forward() and (module.training or torch.is_grad_enabled()):
                self.called.add(name)  # an evaluation before training (no grad, eval mode) not

        return hook

    def _foreign_call(self, module: nn.Module, args) -> None:
        """Every module's forward, until the first backward: keep those the model lacks."""
        if id(module) in self._registered or in_own_forward() or not torch.is_grad_enabled():
            return
        self._registered.add(id(module))  # read once
        own = [p for p in module.parameters(recurse=False) if p.requires_grad]
        if own:
            name = f"a {type(module).__name__} outside the model (#{len(self.foreign) + 1})"
            sample = torch.cat([sampled(p).float() for p in own]).clone()
            self.foreign.append((name, own, sample))

    def foreign_untrained(self, optimizer) -> dict[str, int] | None:
        """{module: its parameters} of the foreign modules the optimizer holds none of and whose
        weights have not moved since the first forward: nothing trains them (a module another
        optimizer steps, as a GAN's discriminator run in the generator's loss, moves). None:
        no optimizer to read."""
        groups = getattr(optimizer, "param_groups", None)
        if groups is None:
            return None
        held = {id(p) for group in groups for p in group["params"]}
        return {
            name: len(own)
            for name, own, before in self.foreign
            if not any(id(p) in held for p in own)
            and torch.equal(torch.cat([sampled(p).float() for p in own]), before)
        }

    def called_modules(self) -> set[str]:
        """After the first backward: the modules the training forward ran (the read ends)."""
        for handle in self._call_handles:
            handle.remove()
        self._call_handles = []
        return set(self.called)

    def watch_weights(self, parameters: list[nn.Parameter]) -> None:
        """Hold these weights, before each step's first forward, against what the last optimizer
        step left (invariants.weights_overwritten); weights another owner shards are left out
        by the caller."""
        self._watched = parameters
        self._views = [sampled(p) for p in parameters]
        self._storage = [p.data_ptr() for p in parameters]
        if not parameters:
            return
        device = parameters[0].device
        sizes = torch.tensor([len(view) for view in self._views], device=device)
        self._sample_sizes = sizes.clamp(min=1)
        self._sample_of = torch.arange(len(parameters), device=device).repeat_interleave(sizes)

    def _weight_sample(self) -> torch.Tensor:
        """The watched tensors' samples copied into one tensor: one copy of views made once,
        made again where a weight's storage was replaced (`param.data = ...`, a move)."""
        if [p.data_ptr() for p in self._watched] != self._storage:
            self.watch_weights(self._watched)
        return torch.cat(self._views)  # mixed dtypes promote to the widest

    def weights_in_use(self) -> None:
        """Before a step's first forward (or, for a loop whose forward the hooks do not see, at
        its first backward): which weight tensors differ from what the last step left? Once
        per step; counted on the device, so no step waits for the read (read_invariants takes
        the totals)."""
        if self._after_step is None:
            return
        now, before = self._weight_sample(), self._after_step
        self._after_step = None
        if now.shape != before.shape:  # a weight's storage was swapped for another shape
            return
        self.rewrite_reads += 1
        per_tensor = torch.zeros(len(self._watched), device=now.device)
        per_tensor.index_add_(0, self._sample_of, (now != before).float())
        tensors = (per_tensor / self._sample_sizes >= REWRITE_SHARE).sum()
        if self._rewrites is None:
            self._rewrites, self._rewritten_tensors = (tensors > 0).long(), tensors
        else:
            self._rewrites = self._rewrites + (tensors > 0).long()
            self._rewritten_tensors = torch.maximum(self._rewritten_tensors, tensors)

    def weight_rewrites(self) -> tuple[int, int, int] | None:
        """(steps whose weights were rewritten since the last step, the most weight tensors
        rewritten before one step, steps read), or None before any step was read."""
        if self._rewrites is None:
            return None
        return int(self._rewrites), int(self._rewritten_tensors), self.rewrite_reads

    def _forward(self, module: nn.Module, args, kwargs) -> None:
        if in_own_forward():
            return
        if torch.is_grad_enabled():  # before the forward: an embedding's max_norm renorms in it
            self.eval_read_done()
            self.weights_in_use()
        else:
            self._read_eval(args, kwargs)
        if self._step < LOSS_READ_STEPS and torch.is_grad_enabled():
            self._inputs = read_ids(args, kwargs)
            self._mask = _attention_mask(kwargs, self._inputs)
            given = self._mask is not None
            if self._mask is None and self._inputs is not None and self.pad_id is not None:
                self._mask = padding_mask(self._inputs, self.pad_id)
            if given or self.padding_idx != self.pad_id:
                self._read_padding_idx()
            step = self._step_loss()
            if step.forwards == 0 and self._inputs is not None:  # the step's first micro-batch
                self.batch_prints.append(hash(self._inputs.cpu().numpy().tobytes()))
            step.forwards += 1
            if self._loss_mode is None:
                self._loss_mode = LossInputs(self)  # until the backward is done
                self._loss_mode.__enter__()
        if self._step < ROW_READ_STEPS and torch.is_grad_enabled():
            ids = read_ids(args, kwargs)
            if ids is not None:
                self.epoch_rows += [(self._step, row) for row in row_hashes(ids)]
        if self.heldout_rows and torch.is_grad_enabled() and self.checked_steps(self._step):
            ids = read_ids(args, kwargs)
            if ids is not None:
                self.heldout_seen |= self.heldout_rows & set(row_hashes(ids))
                top = int(ids.max())
                self.train_id_max = (
                    top if self.train_id_max is None else max(top, self.train_id_max)
                )
        if not self.modules:
            return
        if torch.is_grad_enabled():  # the modes a backward, then a step, will train with
            self._last_train_modes = {n for n, m in self.modules if not m.training}
        else:
            self.train_at_eval |= {n for n, m in self.modules if m.training}

    def _read_eval(self, args, kwargs) -> None:
        """An evaluation forward: read its loss's targets until training resumes."""
        reads = self.eval_targets
        if reads.forwards >= EVAL_FORWARDS:  # the last read forward's loss is done: a long
            self.eval_read_done()  # evaluation runs its other batches without the mode
            return
        ids = read_ids(args, kwargs)
        reads.forwards, reads.rows = reads.forwards + 1, None if ids is None else ids.shape[0]
        if not any(mode is reads for mode in _get_current_function_mode_stack()):
            reads.__enter__()

    def eval_read_done(self) -> None:
        """Training resumed (or the hooks are removed): stop reading the evaluation's loss (only
        if no mode entered after ours is still active: modes nest)."""
        stack = _get_current_function_mode_stack()
        if stack and stack[-1] is self.eval_targets:
            self.eval_targets.__exit__(None, None, None)

    def _read_padding_idx(self) -> None:
        """Count the attended positions whose id is the embedding's padding_idx: a real token
        there has an embedding that never trains (invariants.padding_idx_real)."""
        if self.padding_idx is None or self._inputs is None or self._mask is None:
            return
        attended = (self._inputs == self.padding_idx) & self._mask.bool()
        self.padding_idx_attended = (self.padding_idx_attended or 0) + int(attended.sum())

    def _before_accumulation(self, parameter: nn.Parameter):
        def hook(grad: torch.Tensor) -> None:
            if not self.checked_steps(self._step):
                return
            if id(parameter) in self._seen:  # a later backward of the step: accumulation
                if self.read_accumulation:
                    self._later += 1
                    self._emptied += parameter.grad is None or not bool(parameter.grad.any())
                return
            self._seen.add(id(parameter))
            if parameter.grad is not None:
                self._stale_sum += float(parameter.grad.detach().float().pow(2).sum())

        return hook

    def _step_loss(self) -> StepLoss:
        return self.step_losses.setdefault(self._step, StepLoss())

    def read_targets(self, target: torch.Tensor, kwargs: dict, loss: torch.Tensor) -> None:
        """A cross-entropy call of a training forward: its targets against the input ids, and
        a hook for the weight backward gives its tokens (a mean's weight is shared by them)."""
        ignore = int(kwargs.get("ignore_index", -100))
        self.trained_targets |= set(target[target != ignore].unique().tolist())
        if self._inputs is not None:
            shares = label_offsets(self._inputs, target, ignore)
            if shares is not None:
                self.label_reads.append(shares)
            next_tokens = shares is not None and shares[1] >= LABEL_MATCH
            if next_tokens and self._mask is not None:  # padding is judged on next-token targets
                self.padding_reads.append(padded_targets(self._mask, target, ignore))
                masked, counted = masked_real_tokens(self._mask, self._inputs, target, ignore)
                self.masked_real.update(masked)
                self.target_ids |= counted
        reduction = kwargs.get("reduction", "mean")
        readable = reduction in ("mean", "sum") and kwargs.get("weight") is None
        if not (readable and loss.requires_grad and loss.dim() == 0) or _fp16_autocast():
            return
        tokens = int((target != ignore).sum())
        step = self._step_loss()
        step.calls += 1

        def weigh(grad: torch.Tensor) -> None:
            step.reached += 1
            step.weight += float(grad) * (tokens if reduction == "sum" else 1)
            step.tokens += tokens

        loss.register_hook(weigh)

    def accumulation_reads(self) -> list[tuple[int, float, int]]:
        """(micro-batches, total token weight, tokens) of each read step split into several
        micro-batches, each with one cross-entropy loss that backward reached."""
        return [
            (step.forwards, step.weight, step.tokens)
            for step in self.step_losses.values()
            if step.forwards >= 2 and step.calls == step.reached == step.forwards
        ]

    def never_taught(self) -> tuple[int, int, int]:
        """(id, masked real positions, all masked real positions) of the id most often masked
        at a real position and never a target; (-1, 0, n) where every masked id is a target
        somewhere. The loop's named pad id is left out: its mask keeps one pad per row as a
        possible end-of-text (padding_mask), which a correct loop masks."""
        masked = {i: n for i, n in self.masked_real.items() if i != self.pad_id}
        never = {i: n for i, n in masked.items() if i not in self.target_ids}
        token = max(never, key=never.get, default=-1)
        return token, never.get(token, 0), sum(masked.values())

    def forwards_per_step(self) -> list[int]:
        """Training forwards of each read step that ended in an optimizer step."""
        return [step.forwards for at, step in self.step_losses.items() if at < self._step]

    def single_step_reads(self) -> list[tuple[float, int]]:
        """(total token weight, tokens) of each read step of one micro-batch with one
        cross-entropy loss that backward reached."""
        return [
            (step.weight, step.tokens)
            for step in self.step_losses.values()
            if step.forwards == 1 and step.calls == step.reached == 1
        ]

    def loss_read_done(self) -> None:
        """The step's backward is done: stop reading cross-entropy's input (only if no mode
        entered after ours is still active: modes nest)."""
        stack = _get_current_function_mode_stack()
        if self._loss_mode is not None and stack and stack[-1] is self._loss_mode:
            self._loss_mode.__exit__(None, None, None)
            self._loss_mode = None

    def heldout_read(self, train_loss: float, heldout_loss: float) -> None:
        """The step in progress: its training loss and the held-out loss at the same weights."""
        self.stream.append((self._step, train_loss, heldout_loss))

    def stepped(self, optimizer) -> None:
        """After an optimizer step: commit what this step showed, reset for the next."""
        self.loss_read_done()
        if self._seen:
            self.stale[self._step] = math.sqrt(self._stale_sum)
        elif self.read_accumulation and self.trainable_elements and self.checked_steps(self._step):
            self.unbacked.append(self._step)
        if self._later:
            self.emptied[self._step] = (self._emptied, self._later)
        self._seen, self._stale_sum = set(), 0.0
        self._later, self._emptied = 0, 0
        self.eval_at_train |= self._last_train_modes
        if self._watched:
            self._after_step = self._weight_sample()
        if self.read_step_norms and self._step < LOSS_READ_STEPS:
            grads = [p.grad for p in self.model.parameters() if p.grad is not None]
            if grads:
                self.step_norms.append(float(torch.nn.utils.get_total_norm(grads)))
        groups = getattr(optimizer, "param_groups", None)
        if groups:
            self.lrs.append(float(groups[0]["lr"]))
            self._read_state_step(optimizer, groups[0]["params"][:1])
        self._read_schedulers()
        self._step += 1

    def watch_schedulers(self, schedulers: list) -> None:
        """Place the steps of these LR schedulers among the optimizer's from now on."""
        for scheduler in schedulers:
            name, copies = type(scheduler).__name__, 1
            while name in self.schedulers:
                copies += 1
                name = f"{type(scheduler).__name__} #{copies}"
            self.schedulers[name] = (weakref.ref(scheduler), scheduler.last_epoch)
            self.scheduler_advances[name] = []

    def _read_schedulers(self) -> None:
        """Each scheduler's steps since the last optimizer step, placed at this one (two at
        once: the step repeated)."""
        for name, (ref, last) in self.schedulers.items():
            scheduler, advances = ref(), self.scheduler_advances[name]
            if scheduler is None or len(advances) >= SCHEDULER_ADVANCES:
                continue
            now = int(scheduler.last_epoch)
            advances.extend([self._step] * min(max(now - last, 0), SCHEDULER_ADVANCES))
            self.schedulers[name] = (ref, now)

    def _read_state_step(self, optimizer, first: list) -> None:
        """The step count an optimizer keeps per parameter (Adam's, for its bias correction),
        read on the first parameter of group 0: it never goes back unless the state is reset."""
        state = getattr(optimizer, "state", {}).get(first[0], {}) if first else {}
        count = state.get("step") if isinstance(state, dict) else None
        if count is None:
            self._read_momentum(optimizer, first[0] if first else None, state)
            return
        on_device = torch.is_tensor(count) and count.device.type != "cpu"
        if on_device and not self.checked_steps(self._step):
            return  # a fused or capturable Adam keeps it on the GPU: reading it syncs the step
        count, self.state_reads = float(count), self.state_reads + 1
        if self._state_step is not None and count < self._state_step:
            self.state_resets.append(self._step)
        self._state_step = count

    def _read_momentum(self, optimizer, first, state) -> None:
        """SGD keeps no step count, but its momentum buffer: torch's SGD updates it in place
        (buf.mul_(momentum).add_(grad)) and makes a new one only where there is none, as a
        clone of the gradient. A new buffer after a step past the first (torch's SGD), or one
        equal to the step's non-zero gradient (any optimizer that keeps `momentum_buffer`), is a
        state discarded before the step: momentum never carries over."""
        buffer = state.get("momentum_buffer") if isinstance(state, dict) else None
        if not torch.is_tensor(buffer) or first is None:
            return
        self.state_reads += 1
        replaced = isinstance(optimizer, torch.optim.SGD) and self._momentum is not None
        replaced = replaced and buffer is not self._momentum
        grad = first.grad
        fresh = (
            self._momentum is not None
            and self.checked_steps(self._step)
            and grad is not None
            and bool(grad.any())
            and torch.equal(buffer, grad)
        )
        if replaced or fresh:
            self.state_resets.append(self._step)
        self._momentum = buffer

    def remove(self) -> None:
        self.loss_read_done()
        self.eval_read_done()
        for handle in self._handles + self._call_handles:
            handle.remove()
        self._handles, self._call_handles = [], []


def sampled(parameter: nn.Parameter) -> torch.Tensor:
    """WEIGHT_SAMPLE elements of a tensor, evenly spaced over it (a view)."""
    flat = parameter.detach().reshape(-1)
    return flat[:: max(1, flat.numel() // WEIGHT_SAMPLE)][:WEIGHT_SAMPLE]


def row_hashes(ids: torch.Tensor) -> list[int]:
    """A hash of each row of a (rows, positions) tensor of ids, equal for equal rows."""
    rows = ids.detach().to("cpu", torch.int64).numpy()
    return [hash(row.tobytes()) for row in rows]


def read_ids(args: tuple, kwargs: dict) -> torch.Tensor | None:
    """The forward's token ids: `input_ids`, else its first integer (batch, positions) input."""
    given = kwargs.get("input_ids")
    candidates = [given] if given is not None else [*args, *kwargs.values()]
    for value in candidates:
        if _is_ids(value) and value.dim() == 2:
            return value.detach()
    return None


def _attention_mask(kwargs: dict, ids: torch.Tensor | None) -> torch.Tensor | None:
    """The forward's attention mask when it is one per input id (1 attends, 0 is padding)."""
    mask = kwargs.get("attention_mask")
    if ids is None or not torch.is_tensor(mask) or mask.shape != ids.shape:
        return None
    return mask.detach()


def parameter_checksums(parameters: list[nn.Parameter]) -> list[float] | None:
    """Each rank's float64 sum of its parameters (all_gather), or None outside a process group:
    data-parallel replicas hold the same weights after every step."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return None
    if any(hasattr(p, "ds_tensor") for p in parameters):
        return None  # ZeRO-3: each rank holds a different shard by design
    total = sum(p.detach().double().sum() for p in parameters)
    local = torch.as_tensor(total, dtype=torch.float64).reshape(1)
    if torch.distributed.get_backend() == "nccl":
        local = local.cuda()
    gathered = [torch.zeros_like(local) for _ in range(torch.distributed.get_world_size())]
    torch.distributed.all_gather(gathered, local)
    return [float(t.item()) for t in gathered]
