"""Typed settings of the L0 checks (`tables/static.yaml`) and the device peaks (`hardware.yaml`).

Each check's thresholds and its `why` texts are a model here, so a misspelt threshold or a
missing outcome text is refused when the table is read (one line naming file, check and field),
not a KeyError in the middle of `hyprun check`. The checks themselves (diag/static.py) read the
validated settings as plain dicts.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar

from pydantic import model_validator

from hyprun.diag.schema import Question, Strict, load

TABLES = Path(__file__).parent / "tables"


class Rule(Strict):
    """What every check has: the question its failure points to, and one text per outcome."""

    question: Question
    """The core question a failure points to."""
    why: dict[str, str]
    """One line per outcome; `{field}` placeholders are filled in by the check."""
    outcomes: ClassVar[tuple[str, ...]] = ("pass",)
    """The outcomes the check can report: each needs its `why` text."""
    flatters_loss: bool = False
    """Its failure makes the measured loss better than the model is (a leak of the targets or
    of the held-out set): a test that makes it pass is its fix even where the loss then reads
    worse (runner/control/verdicts.py, leaks_removed)."""

    @model_validator(mode="after")
    def _every_outcome_explained(self) -> Rule:
        missing = [case for case in self.outcomes if case not in self.why]
        extra = [case for case in self.why if case not in self.outcomes]
        if missing:
            raise ValueError(f"why lacks the outcome(s) {', '.join(missing)}")
        if extra:
            raise ValueError(f"why has unknown outcome(s) {', '.join(extra)}")
        return self


class Band(Strict):
    """A learning-rate band: reference * (reference_width / d_model) ** width_power * band."""

    reference: float
    """The LR that suits a model of `reference_width`."""
    reference_width: int
    """The width (d_model) the reference LR is for."""
    width_power: float
    """How the LR scales with 1/width."""
    band: tuple[float, float]
    """Plausible multiples of the reference, low and high."""
    fail_above: float
    """A multiple of the reference past which the LR is absurd (fail rather than warn)."""


class DecayRange(Strict):
    """A plausible weight-decay range for one optimizer family."""

    min_exclusive: float
    """Decay at or below this is none."""
    max: float
    """Decay above this is too strong."""


class Graded(Rule):
    """A ratio held to a warn and a fail level."""

    warn_above: float
    """Warn when the measured ratio exceeds this."""
    fail_above: float
    """Fail when the measured ratio exceeds this."""


class LrPlausible(Rule):
    outcomes = ("pass", "zero", "absurd", "high", "low", "unknown")
    adam: Band
    """Band for the Adam family."""
    sgd: Band
    """Band for SGD with momentum."""


class Warmup(Rule):
    outcomes = ("pass", "missing", "short", "not_adam", "flat_start")
    min_steps: int
    """A warmup shorter than this many optimizer steps is no warmup."""


class AdamBetas(Rule):
    outcomes = ("pass", "high_beta2", "low_beta2", "invalid", "not_transformer", "not_adam")
    warn_beta2_above: float
    """beta2 above this averages the second moment over too many steps."""
    warn_beta2_below: float
    """beta2 below this averages it over too few: each step divides by its own gradient."""


class SgdMomentum(Rule):
    outcomes = ("pass", "low", "not_sgd")
    warn_below: float
    """A momentum above 0 and below this is neither plain SGD nor heavy-ball."""


class WeightDecay(Rule):
    outcomes = ("pass", "zero", "high", "unknown")
    adam: DecayRange
    """Range for AdamW's decoupled decay."""
    sgd: DecayRange
    """Range for SGD's coupled L2."""


class DecayNormsBiases(Rule):
    outcomes = ("pass", "decayed")


class GradClip(Rule):
    outcomes = ("pass", "disabled", "not_seen")


class Fp16LossScaling(Rule):
    outcomes = ("pass", "dynamic", "unscaled", "static")


class TokensPerStep(Rule):
    outcomes = ("pass", "small", "unknown", "no_budget")
    coefficient: float
    """B_opt = coefficient * C ** exponent (compute-optimal batch in tokens)."""
    exponent: float
    """See `coefficient`."""
    warn_below_fraction: float
    """Warn when tokens per step fall below this fraction of B_opt."""


class OptimizerSteps(Rule):
    outcomes = ("pass", "few")
    min_steps: int
    """Fewer optimizer steps than this make the schedule and the curve meaningless."""


class Memory(Graded):
    outcomes = ("pass", "tight", "over", "no_device", "unknown")


class FusedAttention(Rule):
    outcomes = ("pass", "cpu", "fp32", "head_dim", "custom_model")
    flash_precisions: tuple[str, ...]
    """Precisions the flash kernel takes."""
    max_head_dim: int
    """Largest head dim the flash kernel takes."""
    head_dim_multiple: int
    """The head dim must be a multiple of this."""


class Loader(Rule):
    outcomes = ("pass", "in_process", "pin_memory", "prefetch")
    min_prefetch_factor: int
    """Batches each worker keeps ready."""


class PaddingWaste(Graded):
    outcomes = ("pass", "wasteful")


class Duplicates(Graded):
    outcomes = ("pass", "duplicated")


class NearDuplicates(Graded):
    outcomes = ("pass", "duplicated")
    threshold: float
    """Jaccard similarity of token n-gram sets above which two sequences are near duplicates."""
    ngram: int
    """n of the token n-grams."""
    num_perm: int
    """MinHash permutations."""
    bands: int
    """LSH bands (num_perm / bands rows each)."""


class HeldoutOverlap(Rule):
    outcomes = ("pass", "skip", "leaked")
    fail_above: float
    """Largest tolerated share of held-out sequences found in training."""


class AllreduceTime(Rule):
    outcomes = ("pass", "single", "no_link", "unknown")
    volume_factor: dict[int, float]
    """Traffic relative to a plain all-reduce, by ZeRO stage."""


class OptimizerCoverage(Rule):
    outcomes = ("pass", "missing")


class GradientReach(Rule):
    outcomes = ("pass", "no_grad")


class LiveSetting(Rule):
    """An optimizer or model setting read off the live run, against the range it works in."""

    outcomes = ("pass", "skip", "high")
    warn_above: float
    """The check's value above which the setting is outside that range."""


class CoupledDecay(LiveSetting):
    """Adam's weight decay as an L2 term in the gradient, against the gradient's scale."""

    coupled: tuple[str, ...]
    """Optimizer classes whose weight_decay is added to the gradient before Adam normalises it
    (unless a group sets decoupled_weight_decay)."""


class EvalAtTrain(Rule):
    outcomes = ("pass", "eval_mode")


class TrainAtEval(Rule):
    outcomes = ("pass", "train_mode")


class Invariant(Rule):
    """A run-long invariant of hyprun.diag.invariants: held, not measured, or violated."""

    outcomes = ("pass", "skip", "violated")


class Checks(Strict):
    """One entry per L0 check, in the order `hyprun check` runs them."""

    lr_plausible: LrPlausible
    warmup: Warmup
    adam_betas: AdamBetas
    sgd_momentum: SgdMomentum
    weight_decay: WeightDecay
    decay_norms_biases: DecayNormsBiases
    grad_clip: GradClip
    fp16_loss_scaling: Fp16LossScaling
    tokens_per_step: TokensPerStep
    optimizer_steps: OptimizerSteps
    memory: Memory
    fused_attention: FusedAttention
    loader: Loader
    padding_waste: PaddingWaste
    duplicates: Duplicates
    near_duplicates: NearDuplicates
    heldout_overlap: HeldoutOverlap
    allreduce_time: AllreduceTime
    optimizer_coverage: OptimizerCoverage
    gradient_reach: GradientReach
    grads_not_reset: Invariant
    accumulation_grads_discarded: Invariant
    eval_mode_in_training: EvalAtTrain
    eval_in_train_mode: TrainAtEval
    params_frozen: Invariant
    lr_schedule_collapse: Invariant
    replicas_disagree: Invariant
    unshuffled_data: Invariant
    probabilities_into_cross_entropy: Invariant
    labels_misaligned: Invariant
    accumulation_loss_scale: Invariant
    clip_ineffective: Invariant
    repeated_batch: Invariant
    loss_on_padding: Invariant
    softmax_wrong_dim: Invariant
    label_smoothing_wrong: Invariant
    labels_shuffled_apart: Invariant
    step_forwards: Invariant
    batch_first_mismatch: Invariant
    real_token_masked_as_padding: Invariant
    token_ids_overflow: Invariant
    functional_dropout_in_eval: Invariant
    causal_mask_missing: Invariant
    loss_divided_twice: Invariant
    loss_summed: Invariant
    warmup_never_ends: Invariant
    updates_below_precision: Invariant
    adam_eps_dominates: Invariant
    adam_step_beyond_bound: Invariant
    gradient_along_weights: Invariant
    dropout_rate_changed: Invariant
    ema_update_wrong: Invariant
    ema_updated_per_micro_batch: Invariant
    rows_repeat_within_epoch: Invariant
    symmetric_init: Invariant
    residual_connection_dropped: Invariant
    activation_missing: Invariant
    norm_gains_small: Invariant
    optimizer_state_reset: Invariant
    sublayer_output_discarded: Invariant
    weights_overwritten: Invariant
    optimizer_step_missing: Invariant
    steps_without_backward: Invariant
    padding_idx_on_real_token: Invariant
    layer_weights_shared: Invariant
    freeze_set_on_module: Invariant
    modules_not_registered: Invariant
    tied_head_untied: Invariant
    frozen_weights_decayed: Invariant
    attention_scale_wrong: Invariant
    batch_index_encoded: Invariant
    dropout_on_residual_stream: Invariant
    dropout_not_as_declared: Invariant
    module_called_for_its_twin: Invariant
    loss_reads_scaled_logits: Invariant
    decay_restarts_after_warmup: Invariant
    warmup_starts_at_zero: Invariant
    adam_moments_misweighted: Invariant
    padding_attended: Invariant
    scheduler_outpaces_optimizer: Invariant
    scheduler_stepped_off_period: Invariant
    eval_counts_untrained_targets: Invariant
    run_ended_early: Invariant
    attention_rows_unnormalised: Invariant
    scheduler_stepped_before_optimizer: Invariant
    logits_nonnegative: Invariant
    dropout_scale_wrong: Invariant
    adam_eps: LiveSetting
    adam_coupled_decay: CoupledDecay
    dropout_rate: LiveSetting


class BytesPerParam(Strict):
    params: int
    """Bytes of the weights the device computes with."""
    grads: int
    """Bytes of a gradient."""
    master: int
    """Bytes of an fp32 master copy (mixed precision), else 0."""


class MemoryModel(Strict):
    bytes_per_param: dict[str, BytesPerParam]
    """By precision (fp32, bf16, fp16), before sharding (ZeRO paper, section 3.1)."""
    optimizer_state_bytes: dict[str, int]
    """Bytes of optimizer state per parameter, by optimizer kind."""
    zero_shards: dict[int, list[str]]
    """Which states each ZeRO stage shards over the data-parallel world."""


class Device(Strict):
    match: tuple[str, ...]
    """Substrings that must all occur in the device name (case-insensitive)."""
    memory_gb: float | None
    """Device memory in GB (10**9 bytes), if known."""
    link_gbps: float | None
    """Per-GPU, per-direction bandwidth of the intra-node link, Gbit/s."""


class StaticTable(Strict):
    """`tables/static.yaml`."""

    optimizer_families: dict[str, tuple[str, ...]]
    """Optimizer family by the class name at the end of optim._target_."""
    builtin_models: tuple[str, ...]
    """model._target_ values whose shape the checks can read."""
    checks: Checks
    """Settings and texts of each check."""
    memory: MemoryModel
    """Bytes per parameter and ZeRO sharding."""
    devices: tuple[Device, ...]
    """Known accelerators, first match wins."""
    links: dict[str, float]
    """Inter-node links, Gbit/s per GPU."""


class Peak(Strict):
    match: str
    """Substring of the device name."""
    bf16: float
    """Dense bf16 FLOP/s."""
    fp16: float
    """Dense fp16 FLOP/s."""
    fp32: float
    """Dense fp32 (TF32 where the device has it) FLOP/s."""


class HardwareTable(Strict):
    """`tables/hardware.yaml`: the denominator of MFU."""

    peaks: tuple[Peak, ...]
    """Per device, first match wins."""


@lru_cache(maxsize=8)
def static_table(path: Path = TABLES / "static.yaml") -> dict[str, Any]:
    """The validated L0 settings as plain dicts (what diag/static.py and diag/memory.py read)."""
    return load(StaticTable, path).model_dump()


@lru_cache(maxsize=8)
def peaks(path: Path = TABLES / "hardware.yaml") -> tuple[Peak, ...]:
    """The validated device peaks."""
    return load(HardwareTable, path).peaks
