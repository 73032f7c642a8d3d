"""L0 checks of a run hyprun did not configure: what the live optimizer and model say.

An app's config is its own (HF `TrainingArguments`, a Lightning module's hyperparameters): no
key of ours names its LR or its clipping. What the optimizer holds at the first steps does. The
probe (runner/job/probe.py) gathers those facts; this module judges them with the very rules,
bands and texts of the job's L0 checks (diag/static.py, tables/static.yaml): the facts are put
in the shape of a job config and the same check functions read it, so an LR band or a
weight-decay range means the same for an app as for the built-in job. Two checks only a live
run can make have rows of their own: trainable parameters missing from the optimizer, and
trainable parameters the first backward gave no gradient; and the invariants of
hyprun.diag.invariants read over the whole run (gradients reset between steps, modules in
train mode while training and in eval mode while evaluating, most parameters frozen, the LR
schedule collapsing, replicas disagreeing, cross-entropy given probabilities, targets that are
not the next tokens or padding, a loss whose scale grows with accumulation, the same batch two
steps in a row, a declared clipping not applied before the step), each check named by the cause
it proves.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field

from hyprun.diag import invariants
from hyprun.diag.rules import static_table
from hyprun.diag.static import (
    Check,
    DataSample,
    check_betas,
    check_decay_norms,
    check_grad_clip,
    check_lr,
    check_momentum,
    check_weight_decay,
)

L0_TAG = "hyprun.l0_checks"
"""Tag of a probe-recorded run: these checks' results, a JSON list of Check fields, split over
this tag and L0_TAG.1, L0_TAG.2, ... (l0_tags)."""
L0_CHUNKS_TAG = f"{L0_TAG}.chunks"
"""How many chunks the latest write of the checks holds (l0_tags)."""
TAG_CHUNK = 7000
"""Characters per tag: MLflow truncates a tag's value at 8000, and the checks' JSON is longer."""
NAMES_SHOWN = 3
"""Parameter names quoted in a check's one line; the rest are counted."""


@dataclass
class LiveFacts:
    """What a training loop's optimizer and model said at its first two optimizer steps."""

    optimizer: str = ""
    """The optimizer's class name (`AdamW`), matched against the table's families."""
    peak_lr: float = 0.0
    """The LR the schedule leads to: a group's `max_lr` (OneCycle) or `initial_lr` (any torch
    scheduler), else the LR applied at the first step."""
    first_lr: float = 0.0
    """The LR applied at the first optimizer step."""
    second_lr: float | None = None
    """The LR applied at the second step (None: the run took one step)."""
    weight_decay: float = 0.0
    """The largest weight decay of the optimizer's groups."""
    betas: tuple[float, float] | None = None
    """Adam's betas of the first group, if it has them."""
    momentum: float | None = None
    """SGD's momentum of the first group, if it has one."""
    decayed_norms_biases: list[str] = field(default_factory=list)
    """1-D parameters (norm gains, biases) in a group with weight decay > 0."""
    grad_clip: float | None = None
    """The clipping threshold the loop applies, when told (a Trainer's `max_grad_norm`, a
    Lightning `gradient_clip_val`; 0: none); None: judged from what was observed."""
    clipped_to: float | None = None
    """The gradient norm when the optimizer stepped, if below the norm after the backward
    (clipping seen at work); None: the gradient was left as it was."""
    first_grad_norm: float | None = None
    """The global gradient norm after the first backward, before any clipping."""
    missing_from_optimizer: list[str] = field(default_factory=list)
    """Trainable parameters in no optimizer group."""
    no_grad: list[str] = field(default_factory=list)
    """Trainable parameters whose `.grad` was None after the first backward."""
    no_grad_share: float = 0.0
    """Their share of the trainable parameters' elements: near 1, almost nothing learns."""
    tokens_per_step: int = 0
    """Tokens of one optimizer step over all processes."""
    width: int | None = None
    """The model's width (hidden size) for the LR band; None: the band's reference width."""
    heads: int | None = None
    """Attention heads, when the model says (the betas advice is for transformers)."""
    stale_grads: dict[int, float] = field(default_factory=dict)
    """By checked optimizer step: the norm of the gradients already there at its first
    backward (0 when zero_grad ran)."""
    emptied_grads: dict[int, tuple[int, int]] = field(default_factory=dict)
    """By checked optimizer step of several micro-batches: (later backwards that found their
    parameter's .grad emptied, later backwards) (invariants.accumulation_discarded)."""
    eval_at_train: list[str] = field(default_factory=list)
    """Dropout/batch-norm modules in eval mode at a forward an optimizer step trained on."""
    train_at_eval: list[str] = field(default_factory=list)
    """Dropout/batch-norm modules in train mode at a forward without gradients (evaluation)."""
    trainable_elements: int = 0
    """Parameter elements with requires_grad, at attach."""
    total_elements: int = 0
    """All parameter elements, at attach."""
    lrs: list[float] = field(default_factory=list)
    """The LR (group 0) after each optimizer step so far."""
    total_steps: int | None = None
    """The run's optimizer steps, when told (Probe(total_steps=), a trainer's max_steps)."""
    replica_checksums: list[float] | None = None
    """Each rank's float64 parameter sum after the first step (None: one process)."""
    stream: list[tuple[int, float, float]] = field(default_factory=list)
    """(step, its training batch's loss before the update, the held-out loss at the same
    weights) on probed steps with a step scan."""
    epoch_steps: int | None = None
    """Optimizer steps in one pass over the training data, when told (Probe(epoch_steps=))."""
    loss_inputs: list[tuple[float, float, float]] = field(default_factory=list)
    """Per cross-entropy call of the first steps: (min, max, max |row sum - 1|) of its input."""
    label_reads: list[tuple[float, ...]] = field(default_factory=list)
    """Per cross-entropy call of the first steps whose targets pair with the input ids: the
    share of targets equal to the input 0, 1, 2 positions on (invariants.labels_misaligned)."""
    ids_beyond_training: tuple[int, int] | None = None
    """(held-out tokens whose id is above every training input id of the checked steps,
    held-out tokens) (invariants.ids_beyond_training); None: not read."""
    masked_token: tuple[int, int, int] | None = None
    """(the id most often masked out of the loss at a real position and never counted as a
    target, its masked positions, all real positions masked) over the first steps
    (invariants.token_never_taught); None: no next-token targets read beside a mask."""
    padding_influence: float | None = None
    """How far the outputs at real positions moved when only the embeddings at padded positions
    changed (invariants.padding_read); None: no padding read."""
    stream_zeros: dict[str, float] | None = None
    """By norm layer after the first called: the share of exact zeros in its input in a
    train-mode forward over that in eval mode (invariants.stream_dropped); None: not read."""
    loss_logit_scale: float | None = None
    """The factor c by which the cross-entropy reads the model's logits (c x logits) in one
    eval forward of the held-out batch (invariants.logits_rescaled); None: not read."""
    adam_moments: tuple[float, float] | None = None
    """After an Adam optimizer's first step, its first and second moments over (1 - beta) x the
    gradient and its square (invariants.adam_moments_misweighted); None: not read."""
    twin_calls: list[tuple[str, dict[str, int], int]] | None = None
    """Per parent module with twin children (one class, the same parameter shapes): (its name,
    calls by twin, its own calls) in one eval forward (invariants.twin_called_instead); None:
    not read, or no twins."""
    dropout_calls: tuple[int, list[str], list[str]] | None = None
    """One training forward's dropout calls: (those that dropped something, the modules whose
    call's output never reached the loss, those whose call dropped a dropped tensor)
    (invariants.dropout_misapplied); None: not read, or no call dropped anything."""
    index_influence: float | None = None
    """How far the rows' outputs moved when only their places in the held-out batch changed
    (invariants.batch_index_read); None: not read."""
    row_influence: float | None = None
    """How far the held-out batch's last row's outputs moved when only its other rows' ids
    changed (invariants.rows_mixed); None: not read."""
    heldout_labels: tuple[float, ...] | None = None
    """The held-out batch's targets read as label_reads are, on the model checks' forward
    (invariants.labels_unpaired); None: not read."""
    padding_reads: list[tuple[int, int]] = field(default_factory=list)
    """Per cross-entropy call of the first steps with an attention mask: (targets counted at a
    masked position, targets counted) (invariants.loss_on_padding)."""
    epoch_rows: list[tuple[int, int]] = field(default_factory=list)
    """(optimizer step, row hash) of each training row read in the first steps
    (runner/job/invariant_hooks.ROW_READ_STEPS), for rows repeated within an epoch."""
    batch_prints: list[int] = field(default_factory=list)
    """A hash of the input ids of each of the first steps (invariants.repeated_batches)."""
    step_norms: list[float] = field(default_factory=list)
    """The global gradient norm each of the first steps applied, read in the optimizer's step
    post-hook of a loop the probe hooks (invariants.clipping_not_applied)."""
    nll_inputs: list[float] = field(default_factory=list)
    """Per nll_loss call of the first steps: its input's largest |logsumexp| over the classes
    (invariants.nll_not_log_probabilities)."""
    soft_targets: list[float] = field(default_factory=list)
    """Per soft target a hand-written loss of the first steps weighed log-probabilities by:
    its rows' largest |sum - 1| (invariants.soft_targets_unnormalised)."""
    eval_gap: float | None = None
    """Two eval-mode losses of the held-out batch at the same weights: |a - b| / |a|
    (invariants.eval_not_repeatable); None: not read (no step scan)."""
    future_influence: float | None = None
    """How far the first quarter's outputs moved when the held-out batch's later ids changed
    (invariants.future_visible); None: not read."""
    step_forwards: list[int] = field(default_factory=list)
    """Training forwards of each of the first optimizer steps (its micro-batches, as run)."""
    single_steps: list[tuple[float, int]] = field(default_factory=list)
    """Per first step of one micro-batch: (total weight of its tokens in the backpropagated
    loss, its tokens) (invariants.loss_rescaled)."""
    adam_eps: float | None = None
    """The optimizer's eps (group 0), when it has one."""
    decoupled_decay: bool = False
    """Group 0 sets decoupled_weight_decay (torch's Adam, NAdam, RAdam may): AdamW's decay."""
    weight_rms: float | None = None
    """The trainable weights' RMS per element at the first backward."""
    grad_rms: float | None = None
    """The first gradient's RMS per element (its global norm over the square root of the
    elements that got one), before any clipping."""
    dropout_max: tuple[float, list[str]] | None = None
    """The largest rate of the model's dropout modules and the modules at it; None: none with
    p > 0."""
    lost_updates: tuple[int, int] | None = None
    """At the first step read before and after (an LR above 0, finite gradients): (elements with
    a non-zero gradient the step left unchanged, elements with a non-zero gradient)."""
    eps_dominated: tuple[int, int] | None = None
    """At a probed step from the third on: (elements whose Adam denominator eps outweighs, its
    second moment's root below eps, elements Adam holds a non-zero second moment for); None: no
    Adam-family state read."""
    adam_step_excess: tuple[float, int, int, int] | None = None
    """Over the probed steps of an optimizer that calls itself Adam: (the largest step over
    Adam's own bound, elements beyond it, elements judged, the step) at the step with the
    largest; None: none judged (another family, betas without a bound, low-precision weights)."""
    grad_weight_cosines: list[float] = field(default_factory=list)
    """Per probed step: the cosine between the gradient the step used and the weights it began
    from, pooled over the weight matrices (runner/job/probe.py gradient_weight_cosine)."""
    averages: list[tuple[str, float | None, float | None]] | None = None
    """Per copy of the trainable weights the loop keeps (an EMA; runner/job/averages.py): (what
    it is, its median updates per optimizer step, its median effective decay per step); None:
    not looked for yet."""
    dropout_changed: list[str] | None = None
    """Dropout rates (a dropout module's p, a module's float attribute named for dropout) that
    differ at a probed training step from the first step's, as "module.attr: was -> now"; None:
    the model declares no dropout rate."""
    symmetric: list[str] | None = None
    """Trainable weights on the loss's path (with a .grad) of two or more rows, all rows equal,
    read at the first probed step from the third on; None: not read."""
    accumulation: list[tuple[int, float, int]] = field(default_factory=list)
    """Per first step split into micro-batches: (micro-batches, total weight of its tokens in
    the backpropagated loss, its tokens) (invariants.accumulation_scale)."""
    stream_pairs: dict[str, tuple[float, float]] | None = None
    """By pair of one block's norm layers called in a row: the mean cosine over positions of
    their inputs and the second's RMS over the first's, on the model as initialised
    (invariants.stream_not_carried); None: not read."""
    linear_chains: list[str] | None = None
    """Linear pairs without a bottleneck whose second layer was fed the first's output
    unchanged, on the model as initialised (invariants.linear_without_activation); None: not
    read."""
    norm_gains: dict[str, float] = field(default_factory=dict)
    """By torch norm layer (nn.LayerNorm, nn.RMSNorm): its gain's RMS at the first step."""
    train_eval_scale: float | None = None
    """Train-mode over eval-mode RMS of the norm layers' inputs, on the model as initialised
    (invariants.dropout_misscaled); None: not read."""
    heldout_overlap: tuple[int, int] | None = None
    """(held-out rows met among the training rows of the probed steps, the held-out batch's
    rows) (the data check heldout_overlap, read live); None: no held-out batch of ids."""
    state_resets: list[int] | None = None
    """Optimizer steps at which its own step count went back (invariants.optimizer_state_reset);
    None: fewer than two steps' counts read (SGD keeps none)."""
    output_unused: list[str] | None = None
    """Trainable parameters without a gradient from the first backward whose module ran in that
    training forward (invariants.outputs_unused); None: not read."""
    cut_unused: list[str] | None = None
    """Trainable parameters without a gradient from the first backward whose values a forward
    read through a tensor cut from the graph (param.data, param.detach())."""
    padding_idx_attended: int | None = None
    """Attended positions of the first steps' inputs holding the token embedding's padding_idx
    (invariants.padding_idx_real); None: not read."""
    shared_blocks: list[str] | None = None
    """Blocks of the residual stack sharing a parameter with an earlier block
    (invariants.blocks_shared); None: no stack found."""
    freeze_ignored: dict[str, int] | None = None
    """Modules carrying requires_grad=False as a plain attribute, with how many of their
    parameters still require grad (invariants.freeze_on_module_ignored); None: not read."""
    unregistered: dict[str, int] | None = None
    """Modules with trainable weights the training forward ran outside the model, that no
    optimizer step moved, with their parameter tensors (invariants.modules_unregistered);
    None: no optimizer read."""
    untied_heads: list[str] | None = None
    """Models declaring tie_word_embeddings whose output head is not the token embedding's
    tensor (invariants.head_untied); None: no model declares a tie."""
    steps_taken: tuple[int, int] | None = None
    """At the run's end: (the optimizer steps it took, the steps it declared: Probe(total_steps=),
    a trainer's max_steps) (invariants.ended_early); None: still running, its length unknown,
    diverged, or stopped by hyprun."""
    eval_only_target: tuple[int, int, int] | None = None
    """(the id the first evaluation forwards' losses counted in the most rows that the first
    training steps' never did, those rows, the evaluation rows read)
    (invariants.eval_targets_untrained); None: no evaluation or training loss read."""
    scheduler_lead: tuple[int, int] | None = None
    """(the most steps one of the optimizer's LR schedulers took since the first backward, the
    optimizer's steps since) (invariants.scheduler_outpaces_optimizer); None: no scheduler."""
    scheduler_advances: dict[str, list[int]] | None = None
    """Per LR scheduler on the optimizer, the optimizer step at which each of its steps was seen,
    the first SCHEDULER_ADVANCES (invariants.scheduler_period_broken); None: no scheduler."""
    early_scheduler_steps: dict[str, int] | None = None
    """LR schedulers on the optimizer stepped before its first step, with those steps
    (invariants.scheduler_stepped_first); None: no scheduler found, or a resumed optimizer."""
    unstepped_backwards: int | None = None
    """Backwards of a run whose optimizer never stepped (invariants.never_stepped); None: it
    stepped, or was not read."""
    unbacked_steps: list[int] | None = None
    """Checked optimizer steps with no backward since the step before
    (invariants.steps_without_backward); None: gradients not kept in .grad, not read."""
    frozen_moved: list[str] | None = None
    """Trainable tensors whose gradient was zero at each of the first probed steps (two or
    three) that each of those steps moved (invariants.frozen_yet_moved); None: fewer than two
    probed steps read."""
    attention_scales: list[float] | None = None
    """Per attention of the model as initialised: its q.k scale over 1/sqrt(head_dim)
    (invariants.attention_scale_wrong); None: no attention read."""
    attention_rows: list[float] | None = None
    """Per product of softmax weights with the values: the share of queries whose weights do
    not sum to one (invariants.attention_rows_unnormalised); None: none read."""
    weight_rewrites: tuple[int, int, int] | None = None
    """(steps before whose first forward a weight tensor differed from what the last step left,
    the most tensors rewritten before one step, steps read) (invariants.weights_overwritten);
    None: not read."""


def l0_tags(checks: list[dict]) -> dict[str, str]:
    """The checks' JSON as tags of at most TAG_CHUNK characters: L0_TAG, then L0_TAG.1, ...,
    with their count in L0_CHUNKS_TAG: a run's checks are logged again as it goes, and a later
    write of fewer chunks leaves the earlier write's last ones in place (a tag is never
    deleted), which the count tells the reader to leave out."""
    text = json.dumps(checks, default=str)
    chunks = [text[i : i + TAG_CHUNK] for i in range(0, len(text), TAG_CHUNK)] or ["[]"]
    tags = {_chunk_tag(i): chunk for i, chunk in enumerate(chunks)}
    return {**tags, L0_CHUNKS_TAG: str(len(chunks))}


def read_l0_tags(tags: dict[str, str]) -> list[dict]:
    """The checks l0_tags wrote (empty when none were, or they do not parse). A run recorded
    before the count was written has none: its chunks are read until one is missing."""
    count = int(tags.get(L0_CHUNKS_TAG, 0))
    if count:
        chunks = [tags.get(_chunk_tag(i), "") for i in range(count)]
    else:
        chunks, index = [tags.get(L0_TAG, "[]")], 1
        while _chunk_tag(index) in tags:
            chunks.append(tags[_chunk_tag(index)])
            index += 1
    try:
        checks = json.loads("".join(chunks))
    except ValueError:
        return []
    return checks if isinstance(checks, list) else []


def _chunk_tag(index: int) -> str:
    return L0_TAG if index == 0 else f"{L0_TAG}.{index}"


def as_job_config(facts: LiveFacts) -> dict:
    """The facts in the shape of the built-in job's config, as the L0 checks read it."""
    model: dict = {}
    if facts.width:
        model["d_model"] = facts.width
    if facts.heads:
        model["n_head"] = facts.heads
    optim = {
        "_target_": facts.optimizer,
        "lr": facts.peak_lr,
        "weight_decay": facts.weight_decay,
        "decay_norms_and_biases": bool(facts.decayed_norms_biases),
    }
    if facts.betas is not None:
        optim["betas"] = list(facts.betas)
    if facts.momentum is not None:
        optim["momentum"] = facts.momentum
    return {"optim": optim, "model": model, "ds": {"grad_clip": facts.grad_clip or 0.0}}


def live_checks(facts: LiveFacts) -> list[Check]:
    """The L0 checks a live optimizer and model can answer, in the job's order."""
    rules = {k: {**v, "id": k} for k, v in static_table()["checks"].items()}
    config, sample = as_job_config(facts), DataSample([], [], [])
    checks = [
        check_lr(config, sample, None, rules["lr_plausible"]),
        _warmup(facts, rules["warmup"]),
        check_betas(config, sample, None, rules["adam_betas"]),
        check_momentum(config, sample, None, rules["sgd_momentum"]),
        check_weight_decay(config, sample, None, rules["weight_decay"]),
        _decay_norms(facts, config, sample, rules["decay_norms_biases"]),
        _grad_clip(facts, config, sample, rules["grad_clip"]),
        _tokens_per_step(facts, rules["tokens_per_step"]),
        _named_list(rules["optimizer_coverage"], facts.missing_from_optimizer, "missing", "fail"),
        _gradient_reach(facts, rules["gradient_reach"]),
        _adam_eps(facts, rules["adam_eps"]),
        _adam_coupled_decay(facts, rules["adam_coupled_decay"]),
        _dropout_rate(facts, rules["dropout_rate"]),
        *invariant_checks(facts, rules),
    ]
    return checks


def invariant_checks(facts: LiveFacts, rules: dict) -> list[Check]:
    """The run-long invariants (hyprun.diag.invariants), one check each, named by the cause a
    violation proves; `fail` where the violation is the fault itself, `warn` where it is only
    a risk (most parameters frozen is also what fine-tuning does on purpose)."""
    stale = invariants.stale_gradients(facts.stale_grads)
    collapse = (
        invariants.schedule_collapse(facts.lrs, facts.total_steps) if facts.total_steps else None
    )
    replicas = (
        invariants.replicas_disagree(facts.replica_checksums)
        if facts.replica_checksums is not None
        else None
    )
    frozen = invariants.mostly_frozen(facts.trainable_elements, facts.total_elements)
    return [
        _violations(rules["grads_not_reset"], stale if facts.stale_grads else None, "fail"),
        _violations(
            rules["accumulation_grads_discarded"],
            invariants.accumulation_discarded(facts.emptied_grads) if facts.emptied_grads else None,
            "fail",
        ),
        _named_list(rules["eval_mode_in_training"], facts.eval_at_train, "eval_mode", "fail"),
        _named_list(rules["eval_in_train_mode"], facts.train_at_eval, "train_mode", "fail"),
        _violations(rules["params_frozen"], frozen if facts.total_elements else None, "warn"),
        _violations(rules["lr_schedule_collapse"], collapse, "fail"),
        _judged(rules["warmup_starts_at_zero"], facts.lrs or None, invariants.steps_at_zero_lr),
        _judged(
            rules["decay_restarts_after_warmup"],
            facts.lrs or None,
            invariants.decay_jumps_after_warmup,
        ),
        _violations(rules["replicas_disagree"], replicas, "fail"),
        _fair_stream(facts, rules["unshuffled_data"]),
        _violations(
            rules["probabilities_into_cross_entropy"],
            invariants.probabilities_into_loss(facts.loss_inputs) if facts.loss_inputs else None,
            "fail",
        ),
        _violations(
            rules["logits_nonnegative"],
            invariants.logits_clamped(facts.loss_inputs) if facts.loss_inputs else None,
            "fail",
        ),
        _violations(
            rules["labels_misaligned"],
            invariants.labels_misaligned(facts.label_reads)
            if invariants.labels_judged(facts.label_reads)
            else None,
            "fail",
        ),
        _violations(
            rules["labels_shuffled_apart"],
            invariants.labels_unpaired(facts.label_reads, facts.heldout_labels)
            if facts.label_reads and facts.heldout_labels
            else None,
            "fail",
        ),
        _violations(
            rules["loss_on_padding"],
            invariants.loss_on_padding(facts.padding_reads) if facts.padding_reads else None,
            "fail",
        ),
        _violations(
            rules["repeated_batch"],
            invariants.repeated_batches(facts.batch_prints) if _draws_batches(facts) else None,
            "fail",
        ),
        _violations(
            rules["clip_ineffective"],
            invariants.clipping_not_applied(facts.grad_clip, facts.step_norms)
            if facts.grad_clip and facts.step_norms
            else None,
            "fail",
        ),
        _violations(
            rules["accumulation_loss_scale"],
            invariants.accumulation_scale(facts.accumulation) if facts.accumulation else None,
            "fail",
        ),
        _violations(
            rules["softmax_wrong_dim"],
            invariants.nll_not_log_probabilities(facts.nll_inputs) if facts.nll_inputs else None,
            "fail",
        ),
        _judged(
            rules["label_smoothing_wrong"],
            facts.soft_targets or None,
            invariants.soft_targets_unnormalised,
        ),
        _violations(
            rules["loss_divided_twice"],
            invariants.loss_rescaled(facts.single_steps) if facts.single_steps else None,
            "fail",
        ),
        _violations(
            rules["loss_summed"],
            invariants.losses_summed(facts.single_steps) if facts.single_steps else None,
            "warn",
        ),
        _measured(
            rules["functional_dropout_in_eval"],
            facts.eval_gap,
            invariants.eval_not_repeatable,
            f"gap <= {invariants.REPEAT_TOL:g}",
        ),
        _violations(rules["warmup_never_ends"], _warmup_reach(facts), "fail"),
        _violations(
            rules["symmetric_init"],
            invariants.symmetric_weights(facts.symmetric) if facts.symmetric is not None else None,
            "fail",
        ),
        _measured(
            rules["updates_below_precision"],
            facts.lost_updates[0] / facts.lost_updates[1] if facts.lost_updates else None,
            lambda _: invariants.updates_lost(*facts.lost_updates),
            f"share <= {invariants.LOST_UPDATE_SHARE:g}",
        ),
        _measured(
            rules["adam_eps_dominates"],
            facts.eps_dominated[0] / facts.eps_dominated[1] if facts.eps_dominated else None,
            lambda _: invariants.eps_dominates(*facts.eps_dominated, facts.adam_eps),
            f"share <= {invariants.EPS_BOUND_SHARE:g}",
        ),
        _measured(
            rules["adam_step_beyond_bound"],
            facts.adam_step_excess[0] if facts.adam_step_excess else None,
            lambda _: invariants.adam_step_beyond(*facts.adam_step_excess),
            "largest step / bound <= 1",
        ),
        _measured(
            rules["gradient_along_weights"],
            statistics.median(facts.grad_weight_cosines) if facts.grad_weight_cosines else None,
            invariants.gradient_along_weights,
            f"median cosine <= {invariants.GRADIENT_ALONG_WEIGHTS:g}",
        ),
        _judged(rules["dropout_rate_changed"], facts.dropout_changed, invariants.dropout_changed),
        _measured(
            rules["rows_repeat_within_epoch"],
            invariants.distinct_share(facts.epoch_rows, facts.epoch_steps),
            invariants.rows_repeat,
            f"distinct share >= {invariants.DISTINCT_ROWS:g}",
        ),
        _judged(rules["ema_update_wrong"], _read_averages(facts), invariants.average_decay_wrong),
        _judged(
            rules["ema_updated_per_micro_batch"],
            _read_averages(facts),
            invariants.average_updated_per_micro_batch,
        ),
        _measured(
            rules["residual_connection_dropped"],
            invariants.lowest_stream_cosine(facts.stream_pairs or {}),
            lambda _: invariants.stream_not_carried(facts.stream_pairs),
            f"cosine >= {invariants.STREAM_CARRY:g}",
        ),
        _measured(
            rules["dropout_scale_wrong"],
            facts.train_eval_scale,
            invariants.dropout_misscaled,
            f"ratio < {invariants.DROPOUT_SCALE:g}",
        ),
        _step_forwards(facts, rules["step_forwards"]),
        _heldout_overlap(facts, rules["heldout_overlap"]),
        _judged(
            rules["activation_missing"], facts.linear_chains, invariants.linear_without_activation
        ),
        _judged(
            rules["norm_gains_small"], facts.norm_gains or None, invariants.norm_gains_small, "warn"
        ),
        _judged(
            rules["optimizer_state_reset"], facts.state_resets, invariants.optimizer_state_reset
        ),
        _judged(
            rules["adam_moments_misweighted"],
            facts.adam_moments,
            invariants.adam_moments_misweighted,
        ),
        _judged(
            rules["sublayer_output_discarded"],
            facts.output_unused,
            lambda names: invariants.outputs_unused(names, facts.cut_unused or []),
        ),
        _measured(
            rules["padding_idx_on_real_token"],
            facts.padding_idx_attended,
            invariants.padding_idx_real,
            f"positions < {invariants.MASKED_TOKEN_MIN}",
        ),
        _judged(rules["layer_weights_shared"], facts.shared_blocks, invariants.blocks_shared),
        _judged(
            rules["freeze_set_on_module"], facts.freeze_ignored, invariants.freeze_on_module_ignored
        ),
        _judged(
            rules["modules_not_registered"], facts.unregistered, invariants.modules_unregistered
        ),
        _judged(rules["tied_head_untied"], facts.untied_heads, invariants.head_untied),
        _judged(rules["frozen_weights_decayed"], facts.frozen_moved, invariants.frozen_yet_moved),
        _judged(
            rules["attention_scale_wrong"], facts.attention_scales, invariants.attention_scale_wrong
        ),
        _judged(
            rules["attention_rows_unnormalised"],
            facts.attention_rows,
            invariants.attention_rows_unnormalised,
        ),
        _judged(
            rules["scheduler_stepped_before_optimizer"],
            facts.early_scheduler_steps,
            invariants.scheduler_stepped_first,
        ),
        _judged(rules["run_ended_early"], facts.steps_taken, invariants.ended_early),
        _judged(
            rules["scheduler_outpaces_optimizer"],
            facts.scheduler_lead,
            invariants.scheduler_outpaces_optimizer,
        ),
        _judged(
            rules["eval_counts_untrained_targets"],
            facts.eval_only_target,
            invariants.eval_targets_untrained,
        ),
        _judged(
            rules["scheduler_stepped_off_period"],
            {
                name: steps
                for name, steps in (facts.scheduler_advances or {}).items()
                if invariants.stepped_every_few(steps)
            }
            or None,
            invariants.scheduler_period_broken,
        ),
        _judged(
            rules["optimizer_step_missing"], facts.unstepped_backwards, invariants.never_stepped
        ),
        _judged(
            rules["steps_without_backward"], facts.unbacked_steps, invariants.steps_without_backward
        ),
        _measured(
            rules["weights_overwritten"],
            facts.weight_rewrites[0] if facts.weight_rewrites else None,
            lambda _: invariants.weights_overwritten(facts.weight_rewrites),
            "0 steps",
        ),
        _measured(
            rules["token_ids_overflow"],
            facts.ids_beyond_training[0] / facts.ids_beyond_training[1]
            if facts.ids_beyond_training
            else None,
            invariants.ids_beyond_training,
            f"share <= {invariants.IDS_BEYOND_SHARE:g}",
        ),
        _judged(
            rules["real_token_masked_as_padding"], facts.masked_token, invariants.token_never_taught
        ),
        _measured(
            rules["batch_first_mismatch"],
            facts.row_influence,
            invariants.rows_mixed,
            f"move <= {invariants.FUTURE_TOL:g}",
        ),
        _measured(
            rules["padding_attended"],
            facts.padding_influence,
            invariants.padding_read,
            f"move <= {invariants.FUTURE_TOL:g}",
        ),
        _judged(
            rules["dropout_on_residual_stream"],
            facts.stream_zeros if facts.dropout_max and facts.dropout_max[0] < 0.5 else None,
            lambda shares: invariants.stream_dropped(shares, facts.dropout_max[0]),
        ),
        _judged(
            rules["dropout_not_as_declared"], facts.dropout_calls, invariants.dropout_misapplied
        ),
        _judged(
            rules["module_called_for_its_twin"], facts.twin_calls, invariants.twin_called_instead
        ),
        _measured(
            rules["loss_reads_scaled_logits"],
            facts.loss_logit_scale if _next_token_task(facts) else None,
            invariants.logits_rescaled,
            f"|c - 1| <= {invariants.LOGIT_FACTOR_TOL:g}",
        ),
        _measured(
            rules["batch_index_encoded"],
            facts.index_influence,
            invariants.batch_index_read,
            f"move <= {invariants.FUTURE_TOL:g}",
        ),
        _measured(
            rules["causal_mask_missing"],
            facts.future_influence if _next_token_task(facts) else None,
            invariants.future_visible,
            f"move <= {invariants.FUTURE_TOL:g}",
        ),
    ]


def _step_forwards(facts: LiveFacts, rule: dict) -> Check:
    """A reading, not a judgement: the most training forwards one of the first optimizer steps
    took. Triage holds it against the micro-batches the run declares (diag/features.py), which
    the probe does not know."""
    if not facts.step_forwards:
        return _check(rule, "skip", "skip", None, "not measured")
    most = max(facts.step_forwards)
    return _check(rule, "pass", "pass", most, "the declared accumulation", forwards=most)


def _warmup_reach(facts: LiveFacts) -> list[invariants.Violation] | None:
    """The LR against its set value over the run's first WARMUP_WINDOW: judged once the run, of
    a known length, is past it."""
    window = int((facts.total_steps or 0) * invariants.WARMUP_WINDOW)
    if not facts.total_steps or len(facts.lrs) <= window:
        return None
    return invariants.warmup_never_ends(facts.lrs, facts.total_steps, facts.peak_lr)


def _heldout_overlap(facts: LiveFacts, rule: dict) -> Check:
    """The data check heldout_overlap (static.py) read live: the share of the held-out batch's
    rows met among the training rows of the probed steps."""
    threshold = f"held-out rows met in training (probed steps) <= {rule['fail_above']:g}"
    if not facts.heldout_overlap or not facts.heldout_overlap[1]:
        return _check(rule, "skip", "skip", None, threshold)
    seen, rows = facts.heldout_overlap
    share = round(seen / rows, 4)
    if share <= rule["fail_above"]:
        return _check(rule, "pass", "pass", share, threshold)
    return _check(rule, "fail", "leaked", share, threshold)


def _next_token_task(facts: LiveFacts) -> bool:
    """The loss's targets were read as the input ids shifted by one: a causal language model,
    whose outputs must not read later tokens (an encoder trained on another task may)."""
    return any(shares[1] >= invariants.LABEL_MATCH for shares in facts.label_reads)


def _measured(rule: dict, value: float | None, judge, threshold: str) -> Check:
    """A check on one measured number: skip when not measured, else its value beside the cut
    so a healthy run shows where it sits."""
    if value is None:
        return _check(rule, "skip", "skip", None, threshold)
    shown = float(f"{value:.3g}")
    found = judge(value)
    if not found:
        return _check(rule, "pass", "pass", shown, threshold)
    fields = {"where": found[0].where, "evidence": found[0].evidence}
    return _check(rule, "fail", "violated", shown, threshold, **fields)


def _read_averages(facts: LiveFacts) -> list[tuple[str, float | None, float]] | None:
    """The weight averages whose steps read as a linear update toward or away from the weights
    (an effective decay): only those are an average to judge; None: none read."""
    read = [average for average in facts.averages or [] if average[2] is not None]
    return read or None


def _draws_batches(facts: LiveFacts) -> bool:
    """Two steps' input ids were read, and an epoch (when told) holds more than one batch: a
    one-batch epoch repeats its batch by design."""
    return len(facts.batch_prints) >= 2 and (facts.epoch_steps is None or facts.epoch_steps > 1)


def _fair_stream(facts: LiveFacts, rule: dict) -> Check:
    """The training loss against the held-out loss in the first epoch; the value is the mean
    gap (hyprun.diag.invariants.stream_gap), so a healthy run shows where it sits."""
    gap = invariants.stream_gap(facts.stream, facts.epoch_steps) if facts.epoch_steps else None
    threshold = f"mean gap <= {invariants.FAIR_STREAM_GAP:.0%}"
    if gap is None:
        return _check(rule, "skip", "skip", None, threshold)
    found = invariants.unfair_stream(facts.stream, facts.epoch_steps)
    if not found:
        return _check(rule, "pass", "pass", round(gap, 4), threshold)
    first = found[0]
    fields = {"where": first.where, "evidence": first.evidence}
    return _check(rule, "fail", "violated", round(gap, 4), threshold, **fields)


def _judged(rule: dict, read, judge, status: str = "fail") -> Check:
    """An invariant on one fact: skip when it was not read (None), else judge it."""
    return _violations(rule, judge(read) if read is not None else None, status)


def _violations(rule: dict, found: list[invariants.Violation] | None, status: str) -> Check:
    """None: nothing to judge (skip); empty: the invariant held (pass); else the first one."""
    if found is None:
        return _check(rule, "skip", "skip", None, "not measured")
    if not found:
        return _check(rule, "pass", "pass", 0, "none")
    first = found[0]
    return _check(
        rule, status, "violated", len(found), "none", where=first.where, evidence=first.evidence
    )


def _check(rule: dict, status: str, case: str, value, threshold: str, **fields) -> Check:
    return Check(
        rule["id"], status, value, threshold, rule["why"][case].format(**fields), rule["question"]
    )


def _warmup(facts: LiveFacts, rule: dict) -> Check:
    """A warmup shows in the LR itself: below the peak at the first step, or rising after it."""
    threshold = "LR at step 0 below the peak, or rising at step 1 (Adam)"
    if facts.optimizer not in static_table()["optimizer_families"]["adam"]:
        return _check(rule, "skip", "not_adam", facts.first_lr, threshold)
    rising = facts.second_lr is not None and facts.second_lr > facts.first_lr
    if facts.first_lr < facts.peak_lr or rising:
        return _check(rule, "pass", "pass", facts.first_lr, threshold)
    return _check(rule, "warn", "flat_start", facts.first_lr, threshold)


def _decay_norms(facts: LiveFacts, config: dict, sample: DataSample, rule: dict) -> Check:
    check = check_decay_norms(config, sample, None, rule)
    if facts.decayed_norms_biases:
        check.value = _names(facts.decayed_norms_biases)
    return check


def _grad_clip(facts: LiveFacts, config: dict, sample: DataSample, rule: dict) -> Check:
    """Told: the job's rule. Not told: clipping seen at work passes; a gradient left as it was
    proves nothing (the threshold may sit above it), so the check is skipped, not guessed."""
    if facts.grad_clip is not None:
        return check_grad_clip(config, sample, None, rule)
    if facts.clipped_to is not None:
        return _check(rule, "pass", "pass", facts.clipped_to, "clipping seen at step 0")
    norm = facts.first_grad_norm if facts.first_grad_norm is not None else float("nan")
    return _check(rule, "skip", "not_seen", None, "grad_clip > 0 (not told)", norm=norm)


def _tokens_per_step(facts: LiveFacts, rule: dict) -> Check:
    threshold = "needs the run's total tokens and the model's FLOPs"
    return _check(rule, "skip", "no_budget", facts.tokens_per_step, threshold)


def _named_list(rule: dict, names: list[str], case: str, status: str) -> Check:
    if not names:
        return _check(rule, "pass", "pass", 0, "none")
    return _check(rule, status, case, len(names), "none", count=len(names), names=_names(names))


def _gradient_reach(facts: LiveFacts, rule: dict) -> Check:
    """Trainable parameters the first backward left without a gradient; the value is their
    share of the trainable elements (an unused head is a sliver, a detached encoder most)."""
    if not facts.no_grad:
        return _check(rule, "pass", "pass", 0.0, "none")
    share = facts.no_grad_share
    return _check(
        rule,
        "warn",
        "no_grad",
        share,
        "none",
        count=len(facts.no_grad),
        names=_names(facts.no_grad),
        share=f"{share:.1%}",
    )


def _adam_eps(facts: LiveFacts, rule: dict) -> Check:
    """eps against the first gradient's scale per element; the value is their ratio."""
    threshold = f"eps <= {rule['warn_above']:g} x the gradient's RMS per element"
    adam = facts.optimizer in static_table()["optimizer_families"]["adam"]
    if not adam or facts.adam_eps is None or not facts.grad_rms:
        return _check(rule, "skip", "skip", None, threshold)
    ratio = float(f"{facts.adam_eps / facts.grad_rms:.3g}")
    if ratio <= rule["warn_above"]:
        return _check(rule, "pass", "pass", ratio, threshold)
    fields = {"eps": facts.adam_eps, "ratio": ratio, "rms": facts.grad_rms}
    return _check(rule, "warn", "high", ratio, threshold, **fields)


def _adam_coupled_decay(facts: LiveFacts, rule: dict) -> Check:
    """Adam's L2 weight decay (wd x the weights' RMS) against the first gradient's RMS per
    element; the value is their ratio."""
    threshold = f"wd x weight RMS <= {rule['warn_above']:g} x the gradient's RMS per element"
    coupled = facts.optimizer in rule["coupled"] and not facts.decoupled_decay
    if not coupled or facts.weight_decay <= 0 or not facts.grad_rms or not facts.weight_rms:
        return _check(rule, "skip", "skip", None, threshold)
    ratio = float(f"{facts.weight_decay * facts.weight_rms / facts.grad_rms:.3g}")
    if ratio <= rule["warn_above"]:
        return _check(rule, "pass", "pass", ratio, threshold)
    fields = {"optimizer": facts.optimizer, "wd": facts.weight_decay, "ratio": ratio}
    fields |= {"weights": facts.weight_rms, "rms": facts.grad_rms}
    return _check(rule, "warn", "high", ratio, threshold, **fields)


def _dropout_rate(facts: LiveFacts, rule: dict) -> Check:
    """The model's largest dropout rate; the value is that rate."""
    threshold = f"p <= {rule['warn_above']:g}"
    if facts.dropout_max is None:
        return _check(rule, "skip", "skip", None, threshold)
    rate, names = facts.dropout_max
    if rate <= rule["warn_above"]:
        return _check(rule, "pass", "pass", rate, threshold)
    return _check(rule, "warn", "high", rate, threshold, p=rate, names=_names(names))


def _names(names: list[str]) -> str:
    shown = ", ".join(names[:NAMES_SHOWN])
    more = len(names) - NAMES_SHOWN
    return shown + (f" and {more} more" if more > 0 else "")
