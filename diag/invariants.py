"""Training invariants: cheap checks that a loop does what it was written to do.

In the spirit of TrainCheck (OSDI '25): facts that hold in every healthy training loop, read
from a few numbers per step, whose violation names a silent bug directly, where a loss curve
only shows its harm. Pure functions on numbers a probe collects (the hook each needs is in its
docstring); no torch, no MLflow. Each returns the violations it found, empty when the
invariant holds.

Thresholds are for exactly-zero-or-not facts where possible (a gradient left over, a parameter
missing from the optimizer); where a ratio is read, its cut is far from what a healthy loop can
produce (documented beside it), not fitted between two runs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise

STALE_GRAD_TOL = 0.0
"""A gradient at the start of a step (before its first backward) must be exactly zero or
absent: zero_grad() sets None or 0, so any non-zero value is left over from an earlier step."""
EMPTIED_SHARE = 0.5
"""Share of a step's later backwards (micro-batches after its first) that found their
parameter's .grad empty, above which the step's earlier micro-batches were discarded. Under
accumulation each later backward adds to what the earlier ones left, which is zero only where a
whole tensor's gradient was exactly zero; a zero_grad() inside the micro-batch loop empties all
of them (share 1)."""
LABEL_MATCH = 0.9
"""Share of a cross-entropy call's targets that equal the input token a fixed number of
positions later, from which the targets are read as the inputs shifted by that offset. A target
built by shifting the inputs matches on every counted position (1.0); by chance, two tokens
agree only as often as the text repeats itself. The model's output at position t must be
trained on the token at t + 1: a best offset of 0 (labels not shifted: each position copies its
own input) or 2 (shifted twice: the token after next) is the bug. Targets that match no offset
this well (a classifier's labels) are not judged."""
LABEL_OFFSETS = (0, 1, 2)
"""The offsets read: not shifted, shifted once (next-token prediction), shifted twice."""
CLIP_TOL = 1e-3
"""clip_grad_norm_ scales the gradients to max_norm x norm / (norm + 1e-6), just below max_norm:
a norm above max_norm by more than this share at the optimizer step was not clipped before it."""
SCHEDULE_COLLAPSE = 1e-3
"""An LR below this fraction of its peak while more than SCHEDULE_LEFT of the run remains: no
schedule in common use gets there before its last quarter (a cosine to 0 reaches 1e-3 of its
peak at 98% of the run, a linear decay at 99.9%, OneCycle at its end, a StepLR that divides by
10 three times at its last milestone, WSD in its final decay); StepLR stepped per batch instead
of per epoch does within a few epochs' worth of steps, and one given gamma 0 at its first
milestone."""
DISTINCT_ROWS = 0.5
"""Least share of distinct rows among those an epoch's first steps read: within an epoch each
row comes once (1.0); even drawn with replacement, n draws from n rows are 63% distinct. Below
a half the data holds far fewer rows than the epoch the loop declares (filtered away, or each
row replayed by several workers)."""
AVERAGE_KEEPS = 0.5
"""Least share of itself an EMA of the weights keeps per optimizer step: decays run 0.9 to
0.9999; below a half the average follows the weights within a step or two, which is the decay
given as the new weights' share (levanter PR 883's beta, 1 - decay)."""
GRADIENT_ALONG_WEIGHTS = 0.5
"""Largest median cosine between a step's gradient and the weights: a data loss's gradient
reads near 0 against the weights, a norm penalty's reads 1. With a part a along the weights
and a part b across them, cos = a / sqrt(a**2 + b**2): above a half, the part along the weights
is more than 0.58 of the rest, a penalty no longer small beside the data's gradient."""
EPS_BOUND_SHARE = 0.1
"""Share of Adam's elements whose denominator eps may outweigh (the root of their second
moment below eps, so their step at least halved): eps is there to keep the division finite,
negligible against gradients of 1e-5 to 1e-1 per element (healthy runs read 0). A tenth, as
LOST_UPDATE_SHARE: more than a few rare rows. Set at 0.5 first and lowered after reading
corpus batch 23's gradients_unscaled_twice at 0.40 (in-sample; its twin 0)."""
STEPS_TAKEN = 0.9
"""Share of its declared optimizer steps a run that ends (not diverged, not stopped by hyprun)
must have taken: a loop counts its steps exactly, so anything short is a loop that stopped
early; 0.9 leaves room for a last partial epoch dropped or a budget rounded."""
SCHEDULER_PERIOD_SPREAD = 2.0
"""Times its shortest interval an LR scheduler's longest interval between steps (counted in
optimizer steps) may be: stepped from one place it keeps one period (an epoch's steps, an eval
interval), up to a last window's rounding; stepped from a second place too, the two periods
interleave and some interval falls below half the longest (or to 0: two steps at once)."""
SCHEDULER_PERIOD_READS = 3
"""Scheduler steps needed before their intervals are judged: two intervals to compare."""
EVAL_TARGET_ROWS = 8
"""Evaluation rows read before their targets are judged against training's."""
EVAL_TARGET_SHARE = 0.5
"""Share of the evaluation rows an id must be a counted target in, never one in the training
loss's first steps, to be a target training does not have: an id of the task's text in half
the held-out rows is all but certain to appear among a few training batches' targets."""
SCHEDULER_LEAD = 1.5
"""Times its optimizer's steps an LR scheduler may take: one per step at most, so 1.5 leaves
room for steps an fp16 loss scaler skipped; stepped per micro-batch it takes the accumulation
factor (2 or more), twice per step 2."""
SCHEDULE_LEFT = 0.25
"""The share of the run that must remain for an LR at SCHEDULE_COLLAPSE of its peak to count."""
FROZEN_SHARE = 0.9
"""Share of a model's parameters (elements) frozen above which a run that also stops learning
is read as frozen by mistake: an L0 warning (fine-tuning freezes most parameters on purpose)
that becomes a finding only with the harm it predicts (a flat loss)."""
WARMUP_REACH = 0.5
"""Share of the schedule's set LR (a torch scheduler's `initial_lr`, OneCycle's `max_lr`) the LR
must reach within the first WARMUP_WINDOW of the run. A linear warmup of W steps reaches half of
it at W/2, so staying below it through the first quarter means a warmup longer than half the
run (its length in samples, tokens or epochs read as steps, its length and the run's swapped),
or a warmup scheduler never stepped (its first factor, often 0, kept). Recipes warm up over
0-10% of the run, 20% at most; OneCycle's rise (30% by default) is past half by then."""
WARMUP_WINDOW = 0.25
"""The share of the run within which the LR must reach WARMUP_REACH of its set value."""
LOST_UPDATE_SHARE = 0.1
"""Share of the elements with a non-zero gradient that an optimizer step left bit for bit as
they were, above which the updates are rounding away. An update is lost when it is below half
the spacing of the weight's floating-point format: fp32 spacing is 1.2e-7 of a weight's size,
far below any Adam step (about the LR per element) or SGD step at a usable LR, so a healthy
fp32 run loses none; bf16 spacing is 7.8e-3 of it (a norm gain of 1 moves only by steps of
0.0078), fp16 9.8e-4, so weights kept in half precision without an fp32 master copy lose most
updates at common LRs."""
FAIR_STREAM_GAP = 0.2
"""Within the first epoch every training batch is unseen data, so its loss (before its update)
estimates the held-out loss at the same weights: a fair stream's mean relative gap scatters
around 0, below it with dropout, which only the training forward applies. Batches in storage
order, or one batch again, fit the recent batches far better than held-out data: a mean gap
above this cut, 3x the healthy extreme. The held-out batch is one fixed batch, so its sampling
error does not average out over the reads; it grows as the loss falls and its per-token spread
stays (~10% of a low loss for 512 tokens of the HF app's bigram language). Healthy reference:
the corpus app's clean twins -0.036 to +0.010 and the HF app at its default LR +0.025 to +0.033
(bench/corpus/results/invariants.md), from which the first cut was 0.1; the app benchmark's
tuning runs (bench/apps, 24 entries x 2 seeds, every stream fair) -0.066 to +0.069, the top at
the HF app's best LR with batch 16 (its held-out twin config read 0.086 and 0.105 on the third
draw, where the cut of 0.1 raised a false finding), hence 0.2. The corpus's unfair streams read
+0.27 to +0.44 (data_not_shuffled). It assumes a batch's loss is a tight estimate (hundreds of
tokens); a loop of a few samples per batch scatters more."""
FAIR_STREAM_READS = 3
"""Reads in the first epoch needed to judge the stream (the first is at untrained weights,
where any stream reads the same): fewer, and the check is skipped."""
PROBABILITY_TOL = 1e-3
"""Rows of a softmax output sum to 1 up to float rounding (~1e-6 in fp32, ~1e-3 in bf16);
logits, unbounded scores, sum to 1 on every row while all lie in [0, 1] only by design."""
LOG_PROBABILITY_TOL = 0.05
"""nll_loss takes log-probabilities: each row's logsumexp over its classes is 0 up to float
rounding (~1e-6 in fp32, ~1e-2 in bf16). A log-softmax taken over another dimension (the
batch) normalises the wrong axis, so a row's logsumexp sits near log(classes / rows); raw
logits are off by their own scale."""
SOFT_TARGET_TOL = 0.02
"""A soft target (label smoothing, a teacher's probabilities, mixup) is a distribution: each
token's row sums to 1 up to float rounding (~1e-6 in fp32; bf16's 3 significant digits keep a
sum within ~1%). Smoothing written (1 - eps) y + 1/K instead of (1 - eps) y + eps/K sums to
2 - eps (TimDettmers/ConvE#55): the extra mass pulls every prediction toward uniform."""
REPEAT_TOL = 1e-4
"""In eval mode the same batch at the same weights gives the same loss: a forward has no
randomness left (fp32 on one device repeats bit for bit; reduction order on some GPUs moves
the 7th digit; the healthy runs read exactly 0). Dropout still drawing at evaluation moves it
by its own noise: 1.2e-3 for p = 0.1 on the corpus loop's embeddings (128 held-out rows)."""
FUTURE_TOL = 1e-4
"""A causal model's output at position t reads only the inputs up to t: changing later input
ids leaves the earlier outputs bit for bit as they were (masked scores add exactly 0). Without
the mask every position reads the whole row and moves by a share of its own scale."""

IDS_BEYOND_SHARE = 0.05
"""Share of the held-out batch's tokens whose id lies above every input id of the checked
steps' training batches, beyond which the training ids stop short of the vocabulary the
held-out data uses. A healthy stream's largest ids are its rarest (Zipf's law), so few held-out
tokens sit above them (0 on every healthy corpus, HF and app run measured); ids written in a
dtype narrower than the vocabulary wrap at its size (uint16 at 65,536 for a 119,547-token
vocabulary: huggingface/transformers#2825), leaving every id above it to the held-out data."""

MASKED_TOKEN_MIN = 8
"""Real positions of one id masked out of the loss, from which a token that is never a target
is a token the model is never taught, not a chance of the first steps' few batches."""

MASKED_TOKEN_SHARE = 0.5
"""Share of the real positions masked out of the loss that one never-taught id takes, from
which the masking singles out a token rather than spans: a prompt or a user turn masked on
purpose (supervised fine-tuning) masks runs of many ids, a label rule `labels[labels == pad_id]
= -100` with pad = eos masks every end-of-text token and nothing else (torchtune#949,
transformers' DataCollatorForLanguageModeling where pad = eos)."""

STREAM_CARRY = 0.25
"""A block's norm layers read the residual stream: the second reads the first's input plus one
branch's output (x + f(x)), so their inputs point the same way (healthy models as initialised:
0.99 on the corpus loop, the HF GPT-2 and the job's GPT). A branch must outweigh the stream
about 4 to 1 to bring the cosine down to this cut. A block that replaces the stream by its
branch (x = f(x)) leaves two inputs as unrelated as two random directions: |cosine| about
1/sqrt(width) per position, near 0 averaged (the corpus loop's overwritten stream: -0.01, 0.04).
A pair whose second input is 1 / STREAM_CARRY times the first's RMS or more is not judged: a
branch that outweighs the stream that much (weights drawn far too large: init_too_large) brings
the cosine as low with the stream intact (the corpus loop at init std 1: 46x)."""
NORM_GAIN_MIN = 0.1
"""RMS of a norm layer's gain below which a fresh model's norm scales its output down tenfold
or more. torch starts every gain at 1; a weight init applied to every parameter draws the gains
like a weight matrix's (std 0.02: huggingface/transformers#143), so each branch and the head
start 50x quieter. Trained gains move away from 1 (some GPT-2 layers read 0.1-0.3), so a
finding reads it only on a fresh model (its first loss near ln(vocab))."""

ATTENTION_SCALE = 2.0
"""How many times the usual 1/sqrt(head_dim) the scale q.k reaches the softmax with may be
(diag's attention_scale_wrong). The attention reader reports 1 for a scaled attention (0.9-1.1
on GPT-2, Llama, BERT and T5 as initialised, eager or SDPA), sqrt(head_dim) for one left
unscaled and head_dim for one multiplied by sqrt(head_dim): 2 flags both from a head_dim of 5
up; a smaller scale (muP's 1/head_dim) is a choice, not flagged."""
ATTENTION_ROWS_OFF = 0.5
"""Share of an attention's queries whose weights may sum to other than one over the keys (in
eval mode, dropout off). A softmax over the keys gives one for every query; masked after the
softmax, or taken over the queries, almost none do. Half leaves room for queries of padding."""

DROPOUT_SCALE = 2.0
"""Ratio of the stream's RMS in a train-mode forward to its RMS in eval mode (the same batch
and weights) above which training sees activations at another scale than evaluation. Inverted
dropout at rate p divides what it keeps by 1 - p, so each unit keeps its expectation and its RMS
grows by at most sqrt(1 / (1 - p)): 1.05 at p = 0.1, 1.41 at p = 0.5; 2 needs p = 0.75, and a
stream mixing dropped and undropped parts grows less. Dividing by p instead (theanets PR 123)
grows it 1 / p: 10x at p = 0.1."""

REWRITE_SHARE = 0.5
"""Share of a weight tensor's sampled elements (invariant_hooks.WEIGHT_SAMPLE) that must differ,
before a step's first forward, from what the last optimizer step left, for the tensor to count
as rewritten in between. Nothing but the optimizer writes trained weights in a healthy loop, and
an evaluation that swaps weights in (an EMA, a best checkpoint) puts them back bit for bit, so
a healthy run reads 0. Copying other weights in (the average, a checkpoint that did not load or
loaded one tensor from another, a fresh init) changes nearly every element of each tensor it
writes; a clamp a user applies on purpose touches some of them, so half is asked for."""


@dataclass(frozen=True)
class Violation:
    """One invariant broken: which, where (step or parameter), and the numbers that show it."""

    invariant: str
    where: str
    evidence: str


def modules_not_training(training: Mapping[str, bool]) -> list[Violation]:
    """Modules whose behaviour depends on the mode (dropout, batch norm) found in eval mode
    during a training forward. Hook: at each training forward, `{name: module.training}` for
    the model's dropout and norm modules with running statistics."""
    return [
        Violation("train_mode_while_training", name, "module.training is False at a train step")
        for name, is_training in training.items()
        if not is_training
    ]


def modules_training_at_eval(training: Mapping[str, bool]) -> list[Violation]:
    """Mode-dependent modules still in train mode during an evaluation forward (dropout active
    while the held-out loss is measured). Hook: at each forward without grad enabled,
    `{name: module.training}` for the same modules."""
    return [
        Violation("eval_mode_while_evaluating", name, "module.training is True at an eval step")
        for name, is_training in training.items()
        if is_training
    ]


def stale_gradients(norm_at_step_start: Mapping[int, float]) -> list[Violation]:
    """Optimizer steps that began with a gradient left over from an earlier one.
    `norm_at_step_start`: by optimizer step, the norm of the `.grad`s already there when that
    step's first backward reached each parameter (None counts as 0). Hook: a tensor hook on
    each parameter reads its .grad on the first backward after a step, before the new gradient
    is added (later backwards of the same step accumulate on purpose)."""
    return [
        Violation("grads_reset_between_steps", f"step {step}", f"|grad| = {norm:.3g} at start")
        for step, norm in norm_at_step_start.items()
        if not math.isfinite(norm) or norm > STALE_GRAD_TOL
    ]


def accumulation_discarded(emptied: Mapping[int, tuple[int, int]]) -> list[Violation]:
    """Optimizer steps whose later micro-batches found the earlier ones' gradients gone: each
    step then trains on its last micro-batch alone. `emptied`: by optimizer step, (later
    backwards that found their parameter's .grad None or all zero, later backwards). Hook: the
    same tensor hook as stale_gradients, on each backward of a step after its first."""
    return [
        Violation(
            "gradients_accumulate_within_a_step",
            f"step {step}",
            f"{empty} of {later} gradients a later micro-batch added found .grad emptied",
        )
        for step, (empty, later) in emptied.items()
        if later and empty / later > EMPTIED_SHARE
    ]


def params_without_gradient(trainable: Sequence[str], with_grad: Sequence[str]) -> list[Violation]:
    """Trainable parameters that received no gradient in a step's backward (not used in the
    loss, or detached). Hook: after backward, names with requires_grad, and names whose .grad
    is not None."""
    got = set(with_grad)
    return [
        Violation("every_trainable_param_gets_a_gradient", name, "requires_grad, .grad is None")
        for name in trainable
        if name not in got
    ]


def outputs_unused(names: Sequence[str], cut: Sequence[str] = ()) -> list[Violation]:
    """Trainable parameters of a module whose forward ran in training but which got no
    gradient from the first backward: the module computes an output the loss never reads
    (assigned to the wrong variable, detached, run under no_grad), so it costs compute and never
    trains. Exact: a module on the loss's path passes a gradient to every parameter it used; a
    module never called (a spare head, a pooler) is not judged (static.gradient_reach lists it).
    `cut`: parameters without a gradient whose values the forward read through a tensor cut
    from the graph (X + self.pos_embedding.data[:, :T]: d2l-ai/d2l-en PR 2121), used and never
    trained alike. Hook: a pre-hook per module until the first backward, then its parameters'
    .grad; the model checks' forward for `cut` (model_checks.detached_reads)."""
    return [
        Violation("a_called_module_trains", name, "its module ran in the forward, .grad is None")
        for name in names
    ] + [
        Violation(
            "a_read_parameter_trains",
            name,
            "the forward read it through .data or .detach(), .grad is None",
        )
        for name in cut
        if name not in names
    ]


def padding_idx_real(attended: int) -> list[Violation]:
    """The token embedding's padding_idx met at MASKED_TOKEN_MIN or more attended positions of
    the first steps: a real token, whose embedding row the padding_idx keeps from any gradient,
    so it never trains (pad = eos freezes the end-of-text every document ends with). Exact:
    padding sits where the attention mask is 0. Hook: the first steps' inputs and mask."""
    if attended < MASKED_TOKEN_MIN:
        return []
    return [
        Violation(
            "padding_idx_is_padding_only",
            "the token embedding's padding_idx",
            f"the id is an attended input at {attended} position(s)",
        )
    ]


def blocks_shared(names: Sequence[str]) -> list[Violation]:
    """Blocks of the residual stack that are one module run again (`[block] * n`): the stack has
    one block's weights, not n. Exact: n built blocks share no parameter (weight sharing on
    purpose, as ALBERT's, reads the same: then the finding is the design). Hook: the stack's
    blocks' parameters, once."""
    return [
        Violation("blocks_are_distinct", name, "shares its parameters with an earlier block")
        for name in names
    ]


def freeze_on_module_ignored(modules: Mapping[str, int]) -> list[Violation]:
    """Modules given `requires_grad = False` as a plain attribute whose parameters still train:
    torch reads requires_grad on each parameter (module.requires_grad_(False) sets them), never
    on a module, so the freeze did nothing and the part meant to stay fixed trains (the
    PyTorch-forum classic; transformers' unispeech_sat layer_norm_for_extract). Exact: a healthy
    model carries no such attribute, or carries it with its parameters frozen. Hook: the model's
    modules and parameters, once, at the first step. `modules`: {name: its parameters still
    requiring grad}."""
    return [
        Violation(
            "a_freeze_reaches_the_parameters",
            name,
            f"requires_grad=False set on the module, {count} of its parameters still train",
        )
        for name, count in modules.items()
    ]


def modules_unregistered(modules: Mapping[str, int]) -> list[Violation]:
    """Modules the training forward ran that the model does not hold (kept in a plain Python
    list or dict instead of nn.ModuleList / nn.ModuleDict, or built inside forward): their
    parameters are missing from model.parameters(), so the optimizer never gets them and they
    stay at their initial values (and .to(), state_dict() and DDP miss them too). Exact: every
    module a healthy forward runs with trainable weights is the model's, or is trained by an
    optimizer of its own (then its weights move and it is not counted). Hook: a global forward
    pre-hook until the first backward; the optimizer's groups and a sample of those weights at
    the second step. `modules`: {module: its parameter tensors}."""
    return [
        Violation(
            "the_forward_runs_the_models_modules",
            name,
            f"{count} parameter tensor(s) outside model.parameters(), never updated",
        )
        for name, count in modules.items()
    ]


def head_untied(models: Sequence[str]) -> list[Violation]:
    """Models whose config declares the output head tied to the token embedding
    (tie_word_embeddings) while the two hold separate weights: the tie was broken (a resize, a
    load or a wrapper that copies one of them, a head replaced after init), so the head trains
    apart from the embedding, or keeps a random init where a checkpoint stored the shared tensor
    once. Exact: a tie in effect is one tensor. Hook: the model's modules, once, at the first
    step."""
    return [
        Violation(
            "the_declared_tie_holds",
            name,
            "tie_word_embeddings is set but the output head holds weights of its own",
        )
        for name in models
    ]


def scheduler_stepped_first(schedulers: Mapping[str, int]) -> list[Violation]:
    """LR schedulers stepped before their optimizer's first step (at the start of each epoch,
    or once before the loop): the schedule's first value is skipped, so every stage trains at
    the next stage's LR (a StepLR's first epoch at gamma times the declared LR). Exact: a
    scheduler stepped after each optimizer step has stepped only in its constructor when the
    optimizer first steps. Hook: the live schedulers on the optimizer, at the first backward.
    `schedulers`: {scheduler: the steps it took before the optimizer's first}."""
    return [
        Violation(
            "the_scheduler_steps_after_the_optimizer",
            name,
            f"stepped {steps} time(s) before the optimizer's first step",
        )
        for name, steps in schedulers.items()
    ]


def never_stepped(backwards: int) -> list[Violation]:
    """A run that ran backwards and never an optimizer step: step() is never called (left out
    of the loop, or called on another optimizer than the parameters'), so nothing trains.
    Exact: a loop that trains steps. Hook: the probe's backward count at close, where no step
    came."""
    return [Violation("the_optimizer_steps", "the whole run", f"{backwards} backwards, no step")]


def steps_without_backward(steps: Sequence[int]) -> list[Violation]:
    """Optimizer steps taken with no backward since the step before: step() runs twice on one
    batch's gradients (called twice in the loop, or by the loop and a wrapper, or once per
    micro-batch and again at the step's end), so those gradients are applied twice and the
    schedule and Adam's step count run ahead of the data. Exact: a loop runs at least one
    backward per step. Hook: each trainable parameter's gradient hook, on the checked steps."""
    return [
        Violation("a_backward_before_each_step", f"step {step}", "no backward since the last step")
        for step in steps
    ]


def weights_overwritten(read: tuple[int, int, int]) -> list[Violation]:
    """Steps before whose first forward a weight tensor was not the one the last optimizer step
    left (REWRITE_SHARE of its sampled elements changed): something between the step and the
    next forward wrote the trained weights (an EMA or averaged copy put in and never restored,
    a checkpoint loaded that matched no key or filled one tensor from another, the model
    re-initialised), so training goes on from other weights. `read`: (steps rewritten, the
    most tensors rewritten before one step, steps read). Hook: a sample of each weight tensor
    after each step and before the next step's first forward."""
    rewritten, tensors, steps = read
    if not rewritten:
        return []
    return [
        Violation(
            "only_the_optimizer_writes_weights",
            f"{rewritten} of {steps} step(s)",
            f"up to {tensors} weight tensor(s) rewritten between a step and the next forward",
        )
    ]


def params_not_in_optimizer(trainable: Sequence[str], optimized: Sequence[str]) -> list[Violation]:
    """Trainable parameters no optimizer param group holds (a layer replaced after the optimizer
    was built). Hook: at the first step, names with requires_grad, and names of the tensors in
    optimizer.param_groups (matched by identity)."""
    held = set(optimized)
    return [
        Violation("every_trainable_param_is_optimized", name, "in no optimizer param group")
        for name in trainable
        if name not in held
    ]


def accumulation_scale(steps: Sequence[tuple[int, float, int]]) -> list[Violation]:
    """Optimizer steps whose tokens weigh in total a multiple of what they would without
    accumulation. `steps`: per step split into micro-batches, (micro-batches k, the total
    weight of the step's tokens in the loss that was backpropagated, the step's tokens N).
    Without accumulation a mean loss gives its tokens a total weight of 1 and a summed one of
    N; a correct split keeps that. The loss not divided by k weighs k (an LR silently k times
    larger), one divided twice 1/k. A violation is a total at least sqrt(k) away (a factor)
    from both 1 and N: halfway, on a log scale, to what the bug gives, so a deliberate weight
    on the loss (0.7 x cross-entropy) is not read as the split. Hook: a gradient hook on each
    cross-entropy output of the first steps reads the weight backward gave it (a mean's
    weight is shared by its tokens, a sum's is per token), and the model's training forwards
    count the micro-batches."""
    found = []
    for micro, weight, tokens in steps:
        if micro < 2 or weight <= 0 or tokens <= 0 or not math.isfinite(weight):
            continue
        off = min(abs(math.log(weight)), abs(math.log(weight / tokens)))
        if off >= 0.5 * math.log(micro):
            found.append(
                Violation(
                    "loss_scale_under_accumulation",
                    f"{micro} micro-batches",
                    f"the step's {tokens} tokens weigh {weight:.3g} in the loss (1 as a mean)",
                )
            )
    return found


def labels_misaligned(reads: Sequence[Sequence[float]]) -> list[Violation]:
    """Cross-entropy calls whose targets are the inputs at an offset other than next-token.
    `reads`: per call, the share of its counted targets equal to the input token LABEL_OFFSETS
    positions later (see LABEL_MATCH). Hook: the function mode that reads cross-entropy's input
    also reads its target, against the integer input of the model's forward (a batch first,
    positions second, as a language model takes them)."""
    found = []
    for call, shares in enumerate(reads):
        by_offset = dict(zip(LABEL_OFFSETS, shares, strict=True))
        best = max(by_offset, key=by_offset.get)
        if by_offset[best] >= LABEL_MATCH and by_offset[1] < LABEL_MATCH:
            found.append(
                Violation(
                    "labels_are_next_tokens",
                    f"call {call}",
                    f"{by_offset[best]:.0%} of the targets are the input {best} position(s) on, "
                    f"{by_offset[1]:.0%} the next token",
                )
            )
    return found


def labels_unpaired(
    reads: Sequence[Sequence[float]], heldout: Sequence[float]
) -> list[Violation] | None:
    """Training targets that match the inputs at no offset, where the held-out batch's targets
    are its next tokens: the training labels are not paired with their inputs (shuffled apart
    from them, taken from other rows, or corrupted), so the model can learn only how often each
    label occurs. `reads`: the training cross-entropy calls' shares per offset (as in
    labels_misaligned); `heldout`: the same shares on the held-out batch. None (not judged):
    the held-out targets are not next tokens either (not a language model's task)."""
    if heldout[1] < LABEL_MATCH:
        return None
    return [
        Violation(
            "training_labels_are_next_tokens",
            f"call {call}",
            f"at best {max(shares):.0%} of the training targets equal an input at offsets "
            f"{'/'.join(map(str, LABEL_OFFSETS))}; {heldout[1]:.0%} of the held-out ones are the "
            "next token",
        )
        for call, shares in enumerate(reads)
        if max(shares) < LABEL_MATCH
    ]


def loss_on_padding(reads: Sequence[tuple[int, int]]) -> list[Violation]:
    """Cross-entropy calls that count targets the attention mask hides: padding trained on as
    if it were text (labels = input_ids with the padding not set to the ignore index), which
    dilutes the loss on real tokens and reports it lower than it is. `reads`: per call whose
    targets are the next tokens, (targets counted at a masked position, targets counted).
    Hook: the forward's `attention_mask` beside its input ids, else a mask made from the pad id
    the loop declares (runner/job/invariant_hooks.padding_mask); the target at t is the token at
    t + 1, so it is padding where the mask is 0 at t + 1."""
    return [
        Violation(
            "padding_is_not_a_target",
            f"call {call}",
            f"{padded} of {counted} counted targets are padding ({padded / counted:.0%})",
        )
        for call, (padded, counted) in enumerate(reads)
        if padded > 0 and counted > 0
    ]


def labels_judged(reads: Sequence[Sequence[float]]) -> bool:
    """Whether any read relates the targets to the inputs (an offset matches LABEL_MATCH)."""
    return any(max(shares) >= LABEL_MATCH for shares in reads)


def clipping_not_applied(max_norm: float, norms_at_step: Sequence[float]) -> list[Violation]:
    """Optimizer steps taken with a gradient norm above the clipping threshold the loop says it
    applies: the clipping ran after the step (or not at all), so the updates were unclipped.
    `norms_at_step`: the global gradient norm as each read step began, in order. Hook: the
    optimizer's step post-hook, before the loop's next line (a clip after the step comes
    later); a trainer that clips inside its own step is not read."""
    return [
        Violation(
            "clipping_applied_before_the_step",
            f"step {step}",
            f"gradient norm {norm:.3g} at the optimizer step, above max_norm {max_norm:g}",
        )
        for step, norm in enumerate(norms_at_step)
        if max_norm > 0 and norm > max_norm * (1 + CLIP_TOL)
    ]


def repeated_batches(fingerprints: Sequence[int]) -> list[Violation]:
    """Optimizer steps that trained on the very batch the step before did (a fresh iterator
    over an unshuffled loader each step, `next(iter(loader))`): within an epoch a loop draws
    a new batch every step, so two identical ones in a row are the bug, not chance.
    `fingerprints`: a hash of the first training forward's input ids at each of the first
    steps. Hook: the model's forward pre-hook, on the steps it reads the loss."""
    return [
        Violation("each_step_draws_a_new_batch", f"step {step}", "the input ids of the step before")
        for step in range(1, len(fingerprints))
        if fingerprints[step] == fingerprints[step - 1]
    ]


def schedule_collapse(lrs: Sequence[float], total_steps: int) -> list[Violation]:
    """The LR fell below SCHEDULE_COLLAPSE of its peak with more than SCHEDULE_LEFT of the run
    to go. `lrs`: the optimizer's LR after each step so far (param group 0). Hook: after each
    step."""
    peak = 0.0
    for step, lr in enumerate(lrs):
        peak = max(peak, lr)
        early = step < total_steps * (1 - SCHEDULE_LEFT)
        if early and peak > 0 and lr < SCHEDULE_COLLAPSE * peak:
            return [
                Violation(
                    "lr_schedule_collapse",
                    f"step {step} of {total_steps}",
                    f"LR {lr:.3g} is {lr / peak:.2g} of its peak {peak:.3g}",
                )
            ]
    return []


DECAY_JUMP = 3.0
"""How many times the largest of the next DECAY_STEPS drops the LR's first drop after its warmup
may be. A schedule that decays from where its warmup ended starts smoothly: a linear decay
drops by the same amount each step (ratio 1), a cosine by less at its start than after it (below
1), an inverse square root by about as much; a decay counted from step 0 under the warmup
starts where it would be had it decayed all along, a fall of warmup / total of the peak in one
step for a linear decay (24 warmup steps: 24 times its next drops)."""
DECAY_STEPS = 3
"""The drops after the first that set its scale."""
DECAY_JUMP_MIN = 0.01
"""The least share of the peak the first drop must take to count (a rounding step is not a
fall)."""


def decay_jumps_after_warmup(lrs: Sequence[float]) -> list[Violation]:
    """After a warmup (the LR rose to its peak), the first step down drops the LR DECAY_JUMP
    times more than any of the next DECAY_STEPS: the decay was counted from step 0 while the
    warmup ran, so it starts where it would be had it decayed all along (a cosine's progress
    from the run's start: microsoft/Swin-Transformer#277, PaddleDetection PR 4611). A flat top
    (warmup, then constant) drops nothing there and is not this. `lrs`: the LR after each
    optimizer step (param group 0). Hook: after each step."""
    if len(lrs) < 2:
        return []
    top = max(lrs)
    peak = lrs.index(top)
    if peak == 0 or lrs[0] >= top or len(lrs) < peak + DECAY_STEPS + 2:
        return []
    drops = [lrs[step] - lrs[step + 1] for step in range(peak, peak + DECAY_STEPS + 1)]
    first, after = drops[0], max(drops[1:])
    if first < DECAY_JUMP_MIN * top or first <= DECAY_JUMP * max(after, 0.0):
        return []
    return [
        Violation(
            "decay_continues_from_warmup",
            f"step {peak + 1}, after the warmup's peak at step {peak}",
            f"the LR fell {first / top:.2%} of its peak {top:.3g} in one step, "
            f"{first / max(after, 1e-30):.3g}x the largest of the next {DECAY_STEPS} drops",
        )
    ]


def steps_at_zero_lr(lrs: Sequence[float]) -> list[Violation]:
    """The run's first optimizer steps applied an LR of exactly 0, more than one of them, before
    it rose: a warmup factor computed with integer division ((step + 1) // warmup is 0 until the
    warmup's last step: facebookresearch/maskrcnn-benchmark#335) or a ramp that starts late, so
    those steps move nothing and the LR jumps to its peak where a ramp was declared. A linear
    warmup from 0 spends one step there (transformers' warmup schedules at step 0); torch's
    LinearLR starts at a third. `lrs`: the LR applied at each step (param group 0). Hook:
    after each step."""
    zeros = next((step for step, lr in enumerate(lrs) if lr != 0), None)
    if zeros is None or zeros < 2:
        return []
    return [
        Violation(
            "one_step_at_zero_lr_at_most",
            f"steps 0-{zeros - 1}",
            f"{zeros} optimizer steps applied an LR of 0, then it rose to {lrs[zeros]:.3g}",
        )
    ]


def warmup_never_ends(lrs: Sequence[float], total_steps: int, set_lr: float) -> list[Violation]:
    """Through the first WARMUP_WINDOW of the run the LR stayed below WARMUP_REACH of the LR its
    schedule was set to. `lrs`: the LR applied at each step so far (param group 0); judged once
    the run is past that window. Hook: after each step."""
    half = int(total_steps * WARMUP_WINDOW)
    if set_lr <= 0 or len(lrs) <= half:
        return []
    reached = max(lrs[: half + 1])
    if reached >= WARMUP_REACH * set_lr:
        return []
    return [
        Violation(
            "warmup_never_ends",
            f"steps 0-{half} of {total_steps}",
            f"the LR reached at most {reached:.3g}, {reached / set_lr:.2g} of the {set_lr:.3g} "
            "it was set to",
        )
    ]


def updates_lost(lost: int, counted: int) -> list[Violation]:
    """More than LOST_UPDATE_SHARE of the elements with a non-zero gradient came out of an
    optimizer step unchanged. Hook: the parameters before and after one step with an LR above 0
    and finite gradients (a loss scaler skips a step whose gradients overflowed)."""
    if counted <= 0 or lost / counted <= LOST_UPDATE_SHARE:
        return []
    return [
        Violation(
            "updates_below_precision",
            "an optimizer step",
            f"{lost} of {counted} elements with a gradient ({lost / counted:.0%}) left unchanged",
        )
    ]


def eps_dominates(bound: int, counted: int, eps: float | None) -> list[Violation]:
    """More than EPS_BOUND_SHARE of the elements Adam holds a second moment for have its root
    (the gradient's running RMS, bias-corrected) below eps, so eps sets their step: the
    gradients that reach the optimizer are far smaller than the loss's (divided by a loss
    scale twice, THUDM/slime PR 1842; a loss divided by a huge count) or eps is far too large
    (mlpnlp/mlpnlp-nmt PR 4). Read from the optimizer's own state, so it sees the gradients the
    step used, after whatever the loop did to them. Hook: after a probed step, the third on."""
    if counted <= 0 or bound / counted <= EPS_BOUND_SHARE:
        return []
    return [
        Violation(
            "adam_eps_dominates",
            "Adam's step denominator",
            f"eps {eps:g} is above the gradient's running RMS in {bound} of {counted} elements "
            f"({bound / counted:.0%})",
        )
    ]


def gradient_along_weights(cosine: float) -> list[Violation]:
    """The gradient the probed steps used points along the weights themselves (median pooled
    cosine above GRADIENT_ALONG_WEIGHTS): a term of the loss that penalises the weights' norm
    outweighs the data's, so every step mostly shrinks the weights (an L2 penalty summed over
    the parameters added beside the optimizer's own decay; RUCAIBox/RecBole#872). Hook: the
    gradient and the weights at each probed optimizer step."""
    if cosine <= GRADIENT_ALONG_WEIGHTS:
        return []
    return [
        Violation(
            "gradient_along_weights",
            "the probed steps' gradients",
            f"their median cosine with the weights is {cosine:.2f}",
        )
    ]


def adam_step_beyond(worst: float, beyond: int, judged: int, step: int) -> list[Violation]:
    """An optimizer that calls itself Adam moved an element further in one step than Adam's
    update can move it whatever the gradients (runner/job/adam_step.py: LR x (1 - beta1) /
    sqrt((1 - beta2)(1 - beta1**2 / beta2)), float32 rounding allowed): its own arithmetic is
    wrong, a bias correction written into its buffer or inverted (frgfm/holocron#1,
    kozistr/pytorch_optimizer PR 308). Hook: the weights before and after each probed step."""
    if beyond <= 0:
        return []
    return [
        Violation(
            "adam_step_beyond_bound",
            f"optimizer step {step}",
            f"{beyond} of {judged} elements moved beyond Adam's largest step, the largest "
            f"{worst:.3g}x it",
        )
    ]


def distinct_share(rows: Sequence[tuple[int, int]], epoch_steps: int | None) -> float | None:
    """The share of distinct rows among those read in the first min(epoch_steps, the steps
    read) steps, once the run is past them. `rows`: (optimizer step, row hash). None: the
    epoch's length is unknown or under two steps, or too few steps were read."""
    if not rows or not epoch_steps or epoch_steps < 2:
        return None
    window = min(epoch_steps, max(step for step, _ in rows) + 1)
    if window < 2 or window < min(epoch_steps, 8):
        return None
    read = [row for step, row in rows if step < window]
    return len(set(read)) / len(read)


def rows_repeat(share: float) -> list[Violation]:
    """Rows repeated within the epoch the loop declares: fewer than DISTINCT_ROWS of the rows
    its first steps read are distinct, so the data it trains on is far smaller than the epoch
    it declares (a filter that kept a few rows, huggingface/trl#467; workers each replaying the
    stream, huggingface/datasets#3423), and the run cycles over those rows. Hook: a hash of each
    training row the first steps read (runner/job/invariant_hooks.ROW_READ_STEPS)."""
    if share >= DISTINCT_ROWS:
        return []
    return [
        Violation(
            "rows_repeat_within_epoch",
            "the first epoch's steps",
            f"{share:.0%} of the rows they read are distinct",
        )
    ]


def average_decay_wrong(averages: Sequence[tuple[str, float | None, float]]) -> list[Violation]:
    """An EMA of the weights whose step moves it away from the weights (an effective decay above
    1: the update's sign flipped, ostris/ai-toolkit#1034) or keeps less than AVERAGE_KEEPS of it
    (the decay given as the new weights' share). `averages`: (what it is, updates per step, its
    effective decay per optimizer step). Hook: the copy before and after one step's update
    against the weights it was updated toward (runner/job/averages.py)."""
    found = []
    for name, _, decay in averages:
        if decay > 1 + 1e-6:
            evidence = f"each step moves it away from the weights (decay {decay:.4g} > 1)"
        elif decay < AVERAGE_KEEPS:
            evidence = f"each step keeps {decay:.3g} of it and takes {1 - decay:.3g} of the weights"
        else:
            continue
        found.append(Violation("ema_update_wrong", name, evidence))
    return found


def average_updated_per_micro_batch(
    averages: Sequence[tuple[str, float | None, float]],
) -> list[Violation]:
    """An EMA of the weights that changes more than once per optimizer step (the median over
    the steps it changed in): an average of the weights changes only when they do, so updated
    per micro-batch under accumulation it averages the same weights several times and its
    horizon shrinks by that factor (SWivid/F5-TTS#631). Hook: a checksum of the copy at each
    backward and each step (runner/job/averages.py)."""
    return [
        Violation(
            "ema_updated_per_micro_batch",
            name,
            f"it changed at least {updates:g} times per optimizer step (a median over the steps)",
        )
        for name, updates, _ in averages
        if updates is not None and updates > 1
    ]


def dropout_changed(changes: Sequence[str]) -> list[Violation]:
    """Dropout rates that changed between the first training step and a later one: a rate is
    configuration, which no training step changes; code that writes one to a module when it
    runs in eval mode (`self.dropout_p = 0`, NVIDIA/Megatron-LM PR 411) leaves it there once
    training resumes. A user's own dropout schedule changes it too (the finding names it).
    `changes`: "module.attr: how it changed". Hook: the rates at the first step against the
    rates at each probed step in train mode."""
    return [
        Violation("dropout_rate_changed", name, evidence)
        for name, _, evidence in (change.partition(": ") for change in changes)
    ]


def symmetric_weights(identical: Sequence[str]) -> list[Violation]:
    """Trainable weights on the loss's path whose rows (units) were all still equal after the
    first optimizer steps. Units with equal incoming weights compute the same output and get
    the same gradient, so a symmetric init (zeros, one constant) is never broken: the layer
    learns as a single unit. A zero-initialised head or projection (a common recipe) breaks it
    at its first step, its output units' gradients differing. Hook: after the third step."""
    return [
        Violation("symmetric_init", name, "every row (unit) identical after the first steps")
        for name in identical
    ]


def mostly_frozen(trainable_elements: int, total_elements: int) -> list[Violation]:
    """More than FROZEN_SHARE of the parameters frozen (an L0 warning; see FROZEN_SHARE). Hook:
    once, at attach: element counts of parameters with and without requires_grad."""
    if total_elements <= 0:
        return []
    frozen = 1 - trainable_elements / total_elements
    if frozen <= FROZEN_SHARE:
        return []
    return [Violation("params_frozen", "model", f"{frozen:.1%} of parameter elements frozen")]


def replicas_disagree(checksums: Sequence[float], rel_tol: float = 1e-6) -> list[Violation]:
    """Data-parallel replicas whose parameters differ after a step. `checksums`: one per rank
    (the sum of every parameter, in float64). Hook: after a step, all_gather of a checksum."""
    if len(checksums) < 2:
        return []
    reference = checksums[0]
    return [
        Violation("replicas_agree", f"rank {rank}", f"checksum {value:.10g} vs {reference:.10g}")
        for rank, value in enumerate(checksums[1:], start=1)
        if not math.isclose(value, reference, rel_tol=rel_tol, abs_tol=1e-12)
    ]


def stream_gap(reads: Sequence[tuple[int, float, float]], epoch_steps: int) -> float | None:
    """How far the training loss sits below the held-out loss within the first epoch: the
    mean over reads of (held-out - train) / held-out. `reads`: (optimizer step, the loss of
    that step's training batch before its update, the held-out loss at the same weights).
    Within the first epoch every training batch is unseen data, so in a fair stream the two
    estimate the same number and the gap scatters around 0 (below it with dropout, which only
    the training forward applies). None: fewer than FAIR_STREAM_READS reads in the epoch."""
    gaps = [
        (heldout - train) / heldout
        for step, train, heldout in reads
        if step < epoch_steps and heldout > 0 and math.isfinite(train) and math.isfinite(heldout)
    ]
    if len(gaps) < FAIR_STREAM_READS:
        return None
    return sum(gaps) / len(gaps)  # the mean: a batch's loss is unbiased, its median is not


def unfair_stream(reads: Sequence[tuple[int, float, float]], epoch_steps: int) -> list[Violation]:
    """The training batches of the first epoch fit far better than held-out data: they are not
    a fair sample of it (stored in order and not shuffled, or the same batch again). Hook: on
    probed steps of the first epoch, the step's training loss and the step scan's held-out
    loss at 0x the step (`step/loss_x0`, the weights before it)."""
    gap = stream_gap(reads, epoch_steps)
    if gap is None or gap <= FAIR_STREAM_GAP:
        return []
    first = sum(step < epoch_steps for step, _, _ in reads)
    return [
        Violation(
            "training_batches_are_a_fair_sample",
            f"{first} reads in its first {epoch_steps} steps",
            f"training loss sits {gap:.0%} below the held-out loss (mean)",
        )
    ]


def probabilities_into_loss(reads: Sequence[tuple[float, float, float]]) -> list[Violation]:
    """Cross-entropy given probabilities where it expects logits: it applies log-softmax
    itself, so a softmax before it is applied twice and the loss can barely move (its input is
    squeezed into [0, 1]). `reads`: one per cross-entropy call read, (smallest, largest input
    value, largest |sum over the class dimension - 1|). Hook: a torch function mode over the
    first steps' forward and loss, reading the input of F.cross_entropy (nn.CrossEntropyLoss
    calls it; so does a Hugging Face model's loss)."""
    return [
        Violation(
            "cross_entropy_gets_logits",
            f"call {call}",
            f"input in [{low:.3g}, {high:.3g}], rows sum to 1 within {off:.1g}",
        )
        for call, (low, high, off) in enumerate(reads)
        if low >= 0 and high <= 1 and off <= PROBABILITY_TOL
    ]


def logits_clamped(reads: Sequence[tuple[float, float, float]]) -> list[Violation]:
    """Cross-entropy given scores that are never negative, on every call read: the logits pass
    through a ReLU (or another clamp at 0) before the loss, so no class can score below zero,
    the classes clamped at 0 pass no gradient, and the loss cannot fall as far as free logits
    let it. Exact: a linear head's logits are of both signs from initialization on.
    Probabilities (rows summing to 1) are probabilities_into_loss's. `reads`: as
    probabilities_into_loss's. Hook: the same function mode over the first steps' loss."""
    clamped = [
        (call, low, high)
        for call, (low, high, off) in enumerate(reads)
        if low >= 0 and high > 0 and not (high <= 1 and off <= PROBABILITY_TOL)
    ]
    if len(clamped) < len(reads):
        return []
    return [
        Violation("logits_take_both_signs", f"call {call}", f"input in [{low:.3g}, {high:.3g}]")
        for call, low, high in clamped
    ]


def soft_targets_unnormalised(reads: Sequence[float]) -> list[Violation]:
    """Soft targets whose rows do not sum to 1: a hand-written cross-entropy -sum(q log p)
    with q not a distribution trains toward another target than the labels' (label smoothing
    that adds its mass instead of moving it). `reads`: per product of a log-softmax output
    with a tensor of its shape (or F.kl_div's target) in the first steps' loss, that tensor's
    largest |row sum - 1| over rows that are not all zero (masked). Hook: the function mode
    that reads cross-entropy's input (runner/job/invariant_hooks.LossInputs). A focal loss
    weighing log p by (1 - p)^gamma before picking the label's class would read here too; one
    that picks it first (the usual form) has no tensor of log p's shape."""
    return [
        Violation("soft_targets_sum_to_one", f"product {call}", f"rows sum to 1 +- {off:.3g}")
        for call, off in enumerate(reads)
        if off > SOFT_TARGET_TOL
    ]


def nll_not_log_probabilities(reads: Sequence[float]) -> list[Violation]:
    """nll_loss given scores that are not log-probabilities over its classes: a log-softmax
    over the wrong dimension (pointnet.pytorch#27: over the batch), or none at all. `reads`:
    per nll_loss call, the largest |logsumexp over the class dimension| of its input. Hook:
    the function mode that reads cross-entropy's input reads nll_loss's too (F.cross_entropy
    does not call it, so a loop that applies log-softmax itself is the one read)."""
    return [
        Violation(
            "nll_gets_log_probabilities",
            f"call {call}",
            f"a row's probabilities sum to {math.exp(off):.3g} (logsumexp {off:+.3g}), not 1",
        )
        for call, off in enumerate(reads)
        if abs(off) > LOG_PROBABILITY_TOL
    ]


def eval_not_repeatable(gap: float) -> list[Violation]:
    """Something random runs in eval mode: two held-out losses at the same weights differ. The
    usual cause is functional dropout called without `training=self.training` (rixwew/pytorch-fm
    #21, pytorch#26338): model.eval() reaches only nn.Dropout modules. `gap`: |a - b| / |a| of
    the two losses. Hook: the probe's step scan, once, in eval mode without autograd."""
    if gap <= REPEAT_TOL:
        return []
    return [
        Violation(
            "evaluation_is_repeatable",
            "two eval-mode forwards of the held-out batch",
            f"the loss moved by {gap:.2g} of itself between them",
        )
    ]


def future_visible(influence: float) -> list[Violation]:
    """A next-token model whose early outputs change when only later input ids do: each
    position sees the tokens after it (no causal mask, pytorch/tutorials#2478), so it can copy
    the target it is scored on and the loss reads far too good. `influence`: the largest change
    of the first quarter's outputs over their largest magnitude when the second half's ids
    change. Hook: the probe's step scan, once (runner/job/model_checks.py)."""
    if influence <= FUTURE_TOL:
        return []
    return [
        Violation(
            "outputs_read_only_earlier_tokens",
            "the held-out batch, second half of its ids changed",
            f"the first quarter's outputs moved by {influence:.2g} of their scale",
        )
    ]


def ids_beyond_training(share: float) -> list[Violation]:
    """Held-out tokens whose ids the training batches never reach: the training ids were cut
    short (wrapped by a narrower dtype, clipped, or made by another tokenizer), so the model
    never trains those embedding rows and the ids it trains on mean other tokens. `share`: of
    the held-out batch's tokens, those above the largest training input id of the checked
    steps. Hook: the probe's training forwards on checked steps and its held-out batch."""
    if share <= IDS_BEYOND_SHARE:
        return []
    return [
        Violation(
            "training_ids_span_the_vocabulary",
            "the held-out batch against the checked steps' training batches",
            f"{share:.1%} of the held-out tokens have an id above every training id",
        )
    ]


def token_never_taught(read: tuple[int, int, int]) -> list[Violation]:
    """A real token (attended to, not padding) that the loss masks at every occurrence: the
    padding id is a real token's (pad = eos), so masking padding out of the labels masks that
    token too, and the model never learns to predict it (an end-of-text it never emits).
    `read`: (the never-counted id with the most masked real positions, those positions, every
    real position masked). Hook: the first steps' cross-entropy targets beside the forward's
    attention mask (or the loop's pad_id)."""
    token, positions, masked = read
    if positions < MASKED_TOKEN_MIN or positions < MASKED_TOKEN_SHARE * masked:
        return []
    return [
        Violation(
            "real_tokens_are_targets",
            "the first steps' training targets",
            f"token id {token} is masked out of the loss at all {positions} of its real "
            f"positions ({positions / masked:.0%} of the real tokens masked) and never a target",
        )
    ]


def rows_mixed(influence: float) -> list[Violation]:
    """A model whose output for one row of a batch changes when only the other rows do: the
    rows are mixed, most often by batch-first tensors fed to a sequence-first module
    (nn.MultiheadAttention and nn.TransformerEncoder default to batch_first=False), so
    attention runs across the batch at each position instead of along each row, or by a
    reshape that interleaves rows. In eval mode nothing healthy couples rows (batch norm uses
    its running statistics); a mixture of experts that drops tokens over its capacity does, by
    design. `influence`: the last row's largest output change over its largest magnitude, the
    tolerance FUTURE_TOL's (bit for bit in fp32). Hook: the probe's step scan, once
    (runner/job/model_checks.py)."""
    if influence <= FUTURE_TOL:
        return []
    return [
        Violation(
            "rows_apart",
            "the held-out batch, every row but the last changed",
            f"the last row's outputs moved by {influence:.2g} of their scale",
        )
    ]


def loss_rescaled(steps: Sequence[tuple[float, int]]) -> list[Violation]:
    """Optimizer steps of one micro-batch whose tokens weigh in total neither as a mean (1) nor
    as a sum (N) in the loss that was backpropagated: a mean divided again by a count
    (eriklindernoren/PyTorch-YOLOv3#137: the token mean divided by the batch once more), which
    shrinks every step by that count (an LR N times smaller under SGD). `steps`: (total weight
    of the step's tokens, tokens N). The cut is accumulation_scale's: at least sqrt(N) away (a
    factor) from both 1 and N, so a deliberate weight on the loss (0.5 x cross-entropy) is not
    read as a count. Hook: as accumulation_scale's, on steps with one training forward."""
    found = []
    for step, (weight, tokens) in enumerate(steps):
        if weight <= 0 or tokens <= 1 or not math.isfinite(weight):
            continue
        off = min(abs(math.log(weight)), abs(math.log(weight / tokens)))
        if off >= 0.5 * math.log(tokens):
            found.append(
                Violation(
                    "loss_keeps_its_scale",
                    f"step {step}",
                    f"the step's {tokens} tokens weigh {weight:.3g} in the loss (1 as a mean)",
                )
            )
    return found


def losses_summed(steps: Sequence[tuple[float, int]]) -> list[Violation]:
    """Optimizer steps of one micro-batch whose N tokens weigh as a sum (N, within loss_rescaled's
    factor sqrt(N)) in the loss backpropagated, not as a mean (1): each step is N times a mean's,
    and its size changes with the tokens per batch. A warning, not a fault: a sum is a recipe
    when the LR is set for it; the harm it predicts at an LR set for a mean is a run that blows
    up (warnings.yaml). Hook: as loss_rescaled's."""
    found = []
    for step, (weight, tokens) in enumerate(steps):
        if weight <= 0 or tokens <= 1 or not math.isfinite(weight):
            continue
        if abs(math.log(weight / tokens)) < 0.5 * math.log(tokens):
            found.append(
                Violation(
                    "loss_is_a_mean",
                    f"step {step}",
                    f"the step's {tokens} tokens weigh {weight:.3g} in the loss (1 as a mean)",
                )
            )
    return found


def lowest_stream_cosine(pairs: Mapping[str, tuple[float, float]]) -> float | None:
    """The lowest cosine of the pairs stream_not_carried judges (None: no pair judged)."""
    judged = [cosine for cosine, growth in pairs.values() if growth < 1 / STREAM_CARRY]
    return min(judged) if judged else None


def stream_not_carried(pairs: Mapping[str, tuple[float, float]]) -> list[Violation]:
    """A block whose norm layers' inputs are unrelated: the stream the first read did not reach
    the second, so the block overwrites the residual stream with its branch (kyegomez/BitNet
    #32: x = attn(x)) and every layer before it is lost to the loss. `pairs`: by pair of one
    block's norm layers called in a row, their inputs' mean cosine over positions and the
    second's RMS over the first's (see STREAM_CARRY). Hook: the probe's step scan, once, in
    eval mode, on the model as initialised (runner/job/model_checks.py, structure)."""
    return [
        Violation("residual_stream_carried", pair, f"their inputs' mean cosine is {cosine:.2f}")
        for pair, (cosine, growth) in pairs.items()
        if cosine < STREAM_CARRY and growth < 1 / STREAM_CARRY
    ]


def linear_without_activation(chains: Sequence[str]) -> list[Violation]:
    """A linear layer fed another's output unchanged, no bottleneck between them: the two are
    one linear map (W2 W1), so the block's nonlinearity is missing (YujiaBao/ls#1: Linear,
    dropout, Linear). Exact: any activation changes the values (a ReLU zeroes the negative
    ones). Hook: the probe's step scan, once, in eval mode (dropout is then the identity)."""
    return [
        Violation("nonlinearity_between_linears", pair, "the second is fed the first's output")
        for pair in chains
    ]


def norm_gains_small(gains: Mapping[str, float]) -> list[Violation]:
    """torch norm layers whose gain's RMS is below NORM_GAIN_MIN (an L0 warning: a fine-tuned
    model may have trained them there). Hook: the live model at the first optimizer step."""
    return [
        Violation("norm_gains_near_one", name, f"gain RMS {gain:.3g} (torch starts it at 1)")
        for name, gain in gains.items()
        if gain < NORM_GAIN_MIN
    ]


MOMENT_TOL = 1e-2
"""How far from 1 Adam's moments after its first step may read against (1 - beta) x the
gradient and its square: float rounding of an exact 1, far below the 10x and 1000x a dropped
weight makes."""


def adam_moments_misweighted(ratios: tuple[float, float]) -> list[Violation]:
    """After an Adam optimizer's first step, its first moment is (1 - beta1) g and its second
    (1 - beta2) g^2 exactly; a moment update that drops its (1 - beta) weight (v = beta2 v + g^2:
    fastai/fastbook PR 342) reads 1 / (1 - beta) times that, and every step is as if the LR were
    sqrt(1 - beta2) (or 1 / (1 - beta1)) times its own. `ratios`: (first moment, second
    moment) over their Adam values. Hook: after the first optimizer step
    (runner/job/adam_step.py first_moments)."""
    names = ("first moment", "second moment")
    return [
        Violation("adam_moments_weighted", name, f"{ratio:.4g}x Adam's after the first step")
        for name, ratio in zip(names, ratios, strict=True)
        if abs(ratio - 1) > MOMENT_TOL
    ]


def optimizer_state_reset(resets: Sequence[int]) -> list[Violation]:
    """The optimizer's own step count went back during the run: its state (Adam's moments and
    step count) was cleared (optimizer.state.clear() each epoch, an early state dict loaded
    again), so each restart takes Adam's first, bias-corrected full-size steps again with no
    gradient history; SGD's momentum buffer made afresh before every step (kozistr/
    pytorch_optimizer PR 516) runs SGD without its momentum. Exact: the count only grows, and a
    buffer updated in place stays the same tensor. Hook: after each optimizer step, the first
    parameter's state."""
    return [
        Violation(
            "optimizer_state_kept",
            f"step {step}",
            "the optimizer's state started over (its step count went back, or its momentum "
            "buffer was made afresh)",
        )
        for step in resets
    ]


def dropout_misscaled(ratio: float) -> list[Violation]:
    """A train-mode forward whose stream is DROPOUT_SCALE times or more its eval-mode size:
    dropout rescales what it keeps wrongly (divided by p, not 1 - p: lmjohns3/theanets PR 123),
    so training and evaluation see different networks. `ratio`: the largest RMS ratio over the
    norm layers' inputs. Hook: the probe's step scan, once (model_checks.train_eval_scale)."""
    if ratio < DROPOUT_SCALE:
        return []
    return [
        Violation(
            "train_and_eval_at_one_scale",
            "a norm layer's input, train vs eval mode",
            f"its RMS is {ratio:.2g}x larger in train mode",
        )
    ]


def attention_scale_wrong(scales: Sequence[float]) -> list[Violation]:
    """Attentions whose q.k reaches the softmax at ATTENTION_SCALE times the usual 1/sqrt(head_dim)
    or more: the scores were never divided by sqrt(head_dim), or multiplied by it (a scale
    written head_dim ** -0.5 and then divided by), so the softmax saturates as q and k grow and
    its gradients vanish. `scales`: per attention, its scale over 1/sqrt(head_dim), q and k
    taken at their init's relative size (runner/job/attention_reads.py). Hook: the probe's step
    scan, once."""
    return [
        Violation(
            "scores_divided_by_sqrt_head_dim",
            f"attention {index}",
            f"q.k reaches the softmax at {scale:.3g}x the scale of 1/sqrt(head_dim)",
        )
        for index, scale in enumerate(scales, 1)
        if scale >= ATTENTION_SCALE
    ]


def attention_rows_unnormalised(shares: Sequence[float]) -> list[Violation]:
    """Attentions whose weights, where they multiply the values, do not sum to one over the
    keys for more than ATTENTION_ROWS_OFF of the queries: a mask applied after the softmax
    (weights of the masked keys zeroed or set to -inf, the rest no longer renormalised), or a
    softmax over the queries (dim=-2), so each output mixes the values at a scale of its own.
    Read in eval mode, where dropout keeps every weight. `shares`: per product of softmax
    weights with the values, the share of its queries off. Hook: the probe's step scan, once
    (runner/job/attention_reads.py)."""
    return [
        Violation(
            "weights_sum_to_one_over_keys",
            f"attention {index}",
            f"{share:.0%} of its queries' weights do not sum to one over the keys",
        )
        for index, share in enumerate(shares, 1)
        if share > ATTENTION_ROWS_OFF
    ]


def frozen_yet_moved(names: Sequence[str]) -> list[Violation]:
    """Weights whose gradient is zero at every step read that the optimizer still moves: they
    were frozen by zeroing their gradient (a hook, `grad.zero_()` after the backward) while
    staying in an optimizer whose weight decay (AdamW's decoupled decay, SGD's) or momentum
    changes them anyway, so the frozen weights drift toward zero (diffusers#1009,
    pytorch#38581). Exact: with a zero gradient only decay or momentum moves a weight. Hook:
    the probe's probed steps, the weights before and after the first two or three."""
    return [
        Violation("frozen_weights_stay", name, "its gradient was zero yet the step moved it")
        for name in names
    ]


def batch_index_read(influence: float) -> list[Violation]:
    """A model whose output for a row changes when only the row's place in the batch does: an
    encoding indexed along the batch axis, most often a sequence-first positional encoding
    (`x + pe[:x.size(0)]`, the PyTorch tutorial's) fed batch-first tensors, so each row gets
    one position's encoding at every position: the positions go unencoded and the rows are
    told apart by their index. In eval mode nothing healthy reads a row's index (a mixture of
    experts that drops tokens over its capacity aside). `influence`: the rows' largest output
    change over the largest output when every row moves one place; the tolerance FUTURE_TOL's.
    Hook: the probe's step scan, once (runner/job/model_checks.py)."""
    if influence <= FUTURE_TOL:
        return []
    return [
        Violation(
            "rows_read_alike_wherever_they_sit",
            "the held-out batch, each row moved one place",
            f"the rows' outputs moved by {influence:.2g} of their scale",
        )
    ]


def stream_dropped(shares: Mapping[str, float], rate: float) -> list[Violation]:
    """Norm layers that read the residual stream with exact zeros at half the model's dropout
    rate or more in train mode (over eval mode): the dropout is applied to the stream itself
    (x = dropout(x + f(x))) instead of to each branch's output before the add (x = x +
    dropout(f(x))), so a share of the stream is zeroed at every layer and what the layers
    before computed is lost with it (hyunwoongko/transformer#8). Dropout on branches leaves a
    zero only where every term of the sum was dropped at once (rate squared or less: below half
    the rate for rates under 0.5, the only ones judged). `shares`: by norm layer after the
    first, the zero share in train mode less that in eval mode; `rate`: the largest rate of the
    model's dropout modules. Hook: the probe's step scan, once (model_checks.stream_zeros)."""
    return [
        Violation(
            "dropout_on_branches_only",
            name,
            f"{share:.0%} of the stream it reads is zero in train mode (dropout rate {rate:g})",
        )
        for name, share in shares.items()
        if share >= rate / 2
    ]


def dropout_misapplied(calls: tuple[int, list[str], list[str]]) -> list[Violation]:
    """Dropout calls of a training forward that do not drop what the model goes on with: a
    call's output never reaches the loss (`F.dropout(dx, p)` called out of place, its result
    never assigned, so the undropped tensor goes on: evintunador/templateGPT#1), or a call
    drops another call's output (the same dropout written twice, 1 - (1 - p)^2 dropped:
    TimDettmers/ConvE#19). Exact facts of the loss's gradient graph. `calls`: (the calls that
    dropped something, the modules whose call's output was discarded, the modules whose call
    dropped a dropped tensor). Hook: the probe's step scan, once
    (runner/job/dropout_calls.py)."""
    applied, discarded, stacked = calls
    return [
        Violation(
            "dropout_reaches_loss",
            where,
            f"of {applied} dropout calls, its output never reached the loss",
        )
        for where in discarded
    ] + [
        Violation(
            "dropout_once_per_tensor",
            where,
            f"of {applied} dropout calls, it dropped a tensor already dropped",
        )
        for where in stacked
    ]


def twin_called_instead(groups: Sequence[tuple[str, Mapping[str, int], int]]) -> list[Violation]:
    """Twin modules (one parent's children of one class and parameter shapes) of which one is
    never called while another is called more often than its parent: the code calls one where
    the other was meant (self.norm1 for both sublayers: allenai/OLMo#222, lucidrains/mmdit#4;
    self.q where self.k belongs; layers[0] for every layer), so the twin never trains and one
    module's weights serve two roles. A module reused on purpose (shared weights) leaves no twin
    of it unused; a twin left unused alone (built and never wired) is not this. `groups`: per
    parent, (its name, calls by twin, the parent's calls: 0 for a container never called).
    Hook: the probe's step scan, once (model_checks.sibling_calls)."""
    found = []
    for parent, calls, parent_calls in groups:
        unused = [name for name, count in calls.items() if count == 0]
        busiest = max(calls, key=calls.get)
        if unused and calls[busiest] > max(parent_calls, 1):
            evidence = (
                f"{busiest} called {calls[busiest]}x per forward of {parent}, {unused[0]} never"
            )
            found.append(Violation("twins_called_once_each", unused[0], evidence))
    return found


LOGIT_FACTOR_TOL = 1e-3
"""How far from 1 the factor between the logits a language model's loss reads and those the
model returns may be: float32 rounding of an exact 1 (a loss that reads the logits as they are),
far below any temperature a report divided by (0.7: a factor of 1.43)."""


def logits_rescaled(factor: float) -> list[Violation]:
    """A next-token loss that reads the model's logits times a constant (divided by a sampling
    temperature in the training loss: GMISWE/tinker-cloud PR 26): the model learns logits that
    many times too small or large, and everything that reads them as returned (the held-out
    loss, sampling) sees a flatter or sharper distribution than the one trained. `factor`: c
    in loss input = c x logits. Hook: the probe's step scan, once
    (model_checks.loss_logit_scale)."""
    if abs(factor - 1) <= LOGIT_FACTOR_TOL:
        return []
    return [
        Violation(
            "loss_reads_logits_as_returned",
            "the held-out batch's cross-entropy",
            f"it reads {factor:.3g}x the logits the model returns",
        )
    ]


def padding_read(influence: float) -> list[Violation]:
    """A model whose outputs at real positions change when only the padding does: the padding
    is attended, its mask inverted (Hugging Face's 1 = attend handed to torch's
    key_padding_mask, where True = ignore), never passed to the model, or passed where left
    padding puts pads before real tokens, so each output depends on how its row was padded.
    In eval mode a masked key gets exactly zero weight. `influence`: the largest change of the
    real positions' outputs, over their largest magnitude, when noise is added to the padded
    positions' embeddings (the ids kept); the tolerance FUTURE_TOL's. Hook: the probe's step
    scan, once (runner/job/model_checks.py)."""
    if influence <= FUTURE_TOL:
        return []
    return [
        Violation(
            "padding_never_read",
            "the held-out batch, its padded embeddings changed",
            f"the real positions' outputs moved by {influence:.2g} of their scale",
        )
    ]


def scheduler_outpaces_optimizer(lead: tuple[int, int]) -> list[Violation]:
    """An LR scheduler that stepped SCHEDULER_LEAD times as often as its optimizer or more: it
    is stepped per micro-batch under gradient accumulation, twice per step (in the loop and in
    a callback), or it drives an optimizer the loop no longer steps (a resume that built a new
    one: EleutherAI/gpt-neox#1029), so the schedule runs ahead of training or never reaches
    it. A per-step scheduler steps once per optimizer step, a per-epoch one less; a step
    skipped on an fp16 overflow lags the optimizer by one. `lead`: (the scheduler's steps, the
    optimizer's) since the first backward. Hook: the live schedulers on the optimizer, read at
    the first backward and when the checks are logged."""
    scheduled, stepped = lead
    if scheduled < SCHEDULER_LEAD * stepped + 2:
        return []
    return [
        Violation(
            "scheduler_steps_with_its_optimizer",
            f"{stepped} optimizer steps",
            f"its LR scheduler stepped {scheduled} times ({scheduled / max(stepped, 1):.2g}x)",
        )
    ]


def stepped_every_few(steps: Sequence[int]) -> bool:
    """Whether a scheduler's steps (at these optimizer steps) have a period to judge: enough of
    them, their median interval 2 optimizer steps or more (not a per-step scheduler)."""
    intervals = [later - earlier for earlier, later in pairwise(steps)]
    return len(steps) >= SCHEDULER_PERIOD_READS and sorted(intervals)[len(intervals) // 2] >= 2


def scheduler_period_broken(advances: dict[str, list[int]]) -> list[Violation]:
    """An LR scheduler stepped every few optimizer steps (an epoch, an eval interval) whose
    intervals between steps differ by SCHEDULER_PERIOD_SPREAD times or more: it is stepped from
    a second place as well, e.g. an epoch routine ending in scheduler.step() that also runs for
    the evaluation pass (NVlabs/PALAVRA#4), so it steps at two periods and its decay comes
    early. A scheduler stepped with every optimizer step is scheduler_outpaces_optimizer's (an
    fp16 step skipped leaves it an interval of 0 or 2); ReduceLROnPlateau stepped at each eval
    keeps one period. `advances`: per scheduler, the optimizer step at which each of its steps
    was seen (a step repeated: two steps at once), those stepped_every_few. Hook: each
    scheduler's last_epoch, read after each optimizer step."""
    found = []
    for name, steps in advances.items():
        intervals = [later - earlier for earlier, later in pairwise(steps)]
        shortest, longest = min(intervals), max(intervals)
        if longest < SCHEDULER_PERIOD_SPREAD * shortest:
            continue
        shown = ", ".join(str(step) for step in steps[:8]) + (", ..." if len(steps) > 8 else "")
        found.append(
            Violation(
                "scheduler_keeps_one_period",
                f"{name}, stepped at optimizer steps {shown}",
                f"intervals of {shortest} to {longest} optimizer steps between its steps",
            )
        )
    return found


def eval_targets_untrained(unseen: tuple[int, int, int]) -> list[Violation]:
    """The evaluation's loss counts an id as a target in EVAL_TARGET_SHARE of its rows or more
    that the training loss never counted in its first steps: the held-out mask differs from
    training's, e.g. taken from the inputs' padding mask instead of the shifted labels', so the
    pad after each row's last token is scored (SkyworkAI/Skywork#55) and the reported loss is
    not the loss on the held-out text. `unseen`: (that id, the evaluation rows counting it, the
    rows read). Hook: the first evaluation forwards' cross-entropy calls
    (runner/job/eval_targets.py) against the first training steps'."""
    token, rows, read = unseen
    if read < EVAL_TARGET_ROWS or rows < EVAL_TARGET_SHARE * read:
        return []
    return [
        Violation(
            "eval_targets_are_trained_targets",
            f"id {token}",
            f"the evaluation's loss counted it as a target in {rows} of {read} rows; the "
            "training loss never did in its first steps",
        )
    ]


def ended_early(taken: tuple[int, int]) -> list[Violation]:
    """A run that ended, neither diverged nor stopped by hyprun, having taken less than
    STEPS_TAKEN of the optimizer steps it declared: a debugging `break` left in the loop, a data
    iterator never restarted (StopIteration ending the loop after one epoch), an epoch count
    read as steps, so training stops short of its budget and the last eval reads an unfinished
    model (avinashpaliwal/Super-SloMo#3). An early-stopping rule the user set ends a run short
    too, on purpose: the finding names the steps, with no card. `taken`: (steps taken, steps
    declared). Hook: the probe's step count at close."""
    steps, declared = taken
    if steps >= STEPS_TAKEN * declared:
        return []
    return [
        Violation(
            "the_run_takes_its_declared_steps",
            f"the run's end, {steps} of {declared} steps",
            f"it took {steps / declared:.0%} of the optimizer steps it declared",
        )
    ]
