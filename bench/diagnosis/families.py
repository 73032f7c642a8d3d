"""Fault families: each planted fault is a generator of config overrides from a magnitude, on a
model shape and an optimizer, so a diagnosis can be scored on instances it was not tuned on.

    family(magnitude, shape, optimizer, context) -> Plant(overrides, cause, fix)

A shape is a set of model overrides (2-layer tiny GPT, 6 layers, 4-layer post-norm with warmup,
MoE, gpt_small); an optimizer is AdamW or SGD at its healthy LR for this model. Some families
fix part of that themselves (post-norm depth is post-norm, MoE collapse is MoE, clipping off is
SGD, whose unclipped steps are the ones that blow up). `context` carries what a family needs
from the healthy reference run of the same shape: the loader-delay family sizes its sleep as a
share of that run's compute seconds per step.

The split of instances into tuning and held-out lives in split.yaml; this file only says what
each family plants and which findings name it (`cause`) and which cards remove it (`fix`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

SHAPES: dict[str, list[str]] = {
    "tiny2": [],  # gpt_tiny: 2 layers, d_model 64, pre-norm LayerNorm
    "deep6": ["model.n_layer=6"],
    "post4": ["model.n_layer=4", "model.placement=post"],  # healthy with the default warmup
    "moe": ["model.n_experts=4", "model.top_k=1"],
    "small": ["model=gpt_small"],  # 3M parameters: 4 layers, d_model 128
}
OPTIMIZERS: dict[str, list[str]] = {
    "adamw": [],  # warmup_cosine
    "sgd": ["optim=sgd"],  # nesterov momentum 0.9, clipped at 1.0
}
HEALTHY_LR: dict[str, dict[str, float]] = {
    "tiny2": {"adamw": 1e-2, "sgd": 0.3},
    "deep6": {"adamw": 6e-3, "sgd": 0.3},
    "post4": {"adamw": 2e-2, "sgd": 3.0},
    "moe": {"adamw": 1e-2, "sgd": 0.3},
    "small": {"adamw": 2e-3, "sgd": 0.1},
}
"""The LR each shape trains best at with each optimizer within the benchmark's 32 steps, as
measured (python -m bench.diagnosis.healthy_lr; results/healthy_lr.md): every entry runs at it
unless it sets its own, and the LR families scale from it."""

LR_HIGH = ["lr_too_high_config", "lr_too_high_diverged", "lr_too_high_oscillation"]
LR_HIGH += ["lr_high_with_drift", "lr_too_high_surges"]
LR_HIGH += ["lr_high_with_flat_loss"]
SPIKES = ["exploded_then_nan", "exploding_gradients", "grad_spikes", "loss_spikes"]
SPIKES += ["unclipped_spikes", "diverged_unclipped"]


@dataclass(frozen=True)
class Plant:
    """What one instance of a family plants, and the truth about it."""

    overrides: list[str]
    """Overrides after the shape's and the optimizer's (later ones win)."""
    cause: list[str]
    """Finding ids that name this fault (any one counts as the true cause)."""
    fix: list[str]
    """Card ids that remove it, as measured on truth seeds (python -m bench.diagnosis.truth
    --families; results/truth_families.md); empty when no card measurably does."""


def _lr(shape: str, optimizer: str) -> float:
    return HEALTHY_LR[shape][optimizer]


def lr_high(m: float, shape: str, optimizer: str, context: dict) -> Plant:
    return Plant([f"optim.lr={_lr(shape, optimizer) * m:.4g}"], LR_HIGH, ["lr_down_10x"])


def lr_low(m: float, shape: str, optimizer: str, context: dict) -> Plant:
    return Plant(
        [f"optim.lr={_lr(shape, optimizer) / m:.4g}"],
        ["lr_too_low", "loss_flat", "steps_too_short"],
        ["lr_up_10x"],
    )


def label_noise(m: float, shape: str, optimizer: str, context: dict) -> Plant:
    cause = ["noisy_labels", "noisy_labels_flat", "underfitting"]
    return Plant([f"data.source.label_noise={m}"], cause, [])


def duplicates(m: float, shape: str, optimizer: str, context: dict) -> Plant:
    """m of the pool exact copies of a few rows, plus a quarter of that as near copies."""
    return Plant(
        [f"data.source.duplicate_frac={m}", f"data.source.near_duplicate_frac={m / 4:.4g}"],
        ["duplicates", "near_duplicates"],
        [],  # dedup measured -8.2% (p = 0.97): copies cost no loss at this budget
    )


def near_duplicates(m: float, shape: str, optimizer: str, context: dict) -> Plant:
    """m of the pool copies of other rows with one token changed (no exact copies)."""
    # dedup measured +2.8% (p = 0.09): near copies cost no measurable loss at this budget
    return Plant([f"data.source.near_duplicate_frac={m}"], ["near_duplicates"], [])


def loader_delay(m: float, shape: str, optimizer: str, context: dict) -> Plant:
    """The loader sleeps so that it is m of each step at the healthy run's compute speed."""
    compute_ms = 1000.0 * context["compute_s"]
    delay = compute_ms * m / (1.0 - m)
    return Plant([f"data.source.loader_delay_ms={delay:.1f}"], ["input_bound"], ["loader_workers"])


def init_scale(m: float, shape: str, optimizer: str, context: dict) -> Plant:
    """init std m times GPT-2's 0.02 (m < 1: too small)."""
    cause = ["init_too_small", "init_too_small_post_norm", "vanishing_gradients"]
    cause += ["vanishing_early_layers"]
    return Plant([f"model.init_std={0.02 * m:.3g}"], cause, ["init_std_gpt2"])


def no_clip(m: float, shape: str, optimizer: str, context: dict) -> Plant:
    """Clipping off under SGD at m times its healthy LR: the unclipped steps blow up."""
    lr = _lr(shape, "sgd") * m
    return Plant(["optim=sgd", f"optim.lr={lr:.4g}", "ds.grad_clip=0"], SPIKES, ["grad_clip"])


def post_norm_depth(m: float, shape: str, optimizer: str, context: dict) -> Plant:
    """m post-norm layers, no warmup, at an LR where post-norm's instability shows."""
    cause = ["post_norm_unstable", "vanishing_early_layers", "residual_write_overwhelms"]
    cause += ["spikes_without_warmup"]
    lr = "optim.lr=2e-2" if optimizer == "adamw" else "optim.lr=1.0"
    plant = [f"model.n_layer={int(m)}", "model.placement=post", "sched=constant", lr]
    # Measured (median, Mann-Whitney p): rope +43.3% (p = 0.001; measured after it removed the
    # post-norm scenario's fault), lr_down_10x +11.1% (p = 0.03; Welch's t read 0.12 on the
    # same runs), pre_norm -14.5%, warmup -0.0%.
    return Plant(plant, cause, ["rope", "lr_down_10x"])


def moe_collapse(m: float, shape: str, optimizer: str, context: dict) -> Plant:
    """MoE routers biased by m towards expert 0, balancing loss off."""
    plant = ["model.n_experts=4", "model.top_k=1", "model.moe_aux_weight=0"]
    plant += ["model._target_=bench.diagnosis.faults.GPTWithBiasedRouter"]
    plant += [f"+model.router_bias={m}"]
    # moe_aux_loss measured -0.1% (p = 0.76): idle experts cost no loss at this budget.
    return Plant(plant, ["moe_expert_collapse"], [])


def bf16_cancellation(m: float, shape: str, optimizer: str, context: dict) -> Plant:
    """A one-pass LayerNorm on inputs shifted by m: NaN in bf16, fine in fp32."""
    plant = ["ds.precision=bf16", "model._target_=bench.diagnosis.faults.GPTWithOnePassNorm"]
    plant += [f"+model.norm_offset={m}"]
    cause = ["nan_before_first_update", "nan_in_module", "numerical_instability"]
    return Plant(plant, cause, ["fp32"])  # NaN at step 1: before the first update


def attention_temperature(m: float, shape: str, optimizer: str, context: dict) -> Plant:
    """Query weights m times too large: attention logits so sharp each query sees one key."""
    plant = ["model._target_=bench.diagnosis.faults.GPTWithSharpAttention", f"+model.q_scale={m}"]
    return Plant(plant, ["attention_collapse"], ["attn_temperature"])


FAMILIES: dict[str, Callable[[float, str, str, dict], Plant]] = {
    "lr_high": lr_high,
    "lr_low": lr_low,
    "label_noise": label_noise,
    "duplicates": duplicates,
    "near_duplicates": near_duplicates,
    "loader_delay": loader_delay,
    "init_scale": init_scale,
    "no_clip": no_clip,
    "post_norm_depth": post_norm_depth,
    "moe_collapse": moe_collapse,
    "bf16_cancellation": bf16_cancellation,
    "attention_temperature": attention_temperature,
}
MAGNITUDES: dict[str, tuple[float, float, str]] = {
    "lr_high": (3, 1000, "log"),
    "lr_low": (3, 1000, "log"),
    "label_noise": (0.2, 0.8, "linear"),
    "duplicates": (0.1, 0.6, "linear"),
    "near_duplicates": (0.1, 0.4, "linear"),
    "loader_delay": (0.2, 0.8, "linear"),
    "init_scale": (1e-5, 1e-2, "log"),
    "no_clip": (2, 6, "linear"),
    "post_norm_depth": (4, 10, "integer"),
    "moe_collapse": (2, 20, "log"),
    "bf16_cancellation": (2, 8, "linear"),
    "attention_temperature": (30, 1000, "log"),
}
"""Each family's magnitude range (low, high, how to draw in it), from which held-out sets are
drawn (python -m bench.diagnosis.split --draw SEED)."""
FIXED_SHAPE = {"moe_collapse": "moe", "post_norm_depth": "tiny2"}
"""Families that plant their own shape (post-norm depth sets its own layer count on tiny2)."""
FIXED_OPTIMIZER = {"no_clip": "sgd"}
SGD_SHAPES = ("tiny2", "deep6")
"""Shapes with a healthy SGD reference in the split (the harm check needs one)."""
DEPTH_FAMILIES = {"post_norm_depth"}
"""Families that set their own layer count. Their harm is judged against the healthy pre-norm
run of the same depth (the 6-layer shape, at its LR, with that many layers), not the 2-layer
shape they are planted on: a deeper model learns slower within the budget whatever its norm
placement (6 layers under SGD end 4.9% above 2 layers), and that is not the fault."""
THROUGHPUT = {"loader_delay"}
"""Families whose harm is time, not loss: judged without the eval-loss harm check."""
STATIC = {"duplicates", "near_duplicates"}
"""Families an L0 check sees in the data itself, whatever the loss does at this budget."""
STRUCTURAL = {"moe_collapse"}
"""Families whose harm is capacity left idle (3 of 4 experts get no tokens), which a 32-step
run's loss does not show yet."""


def reference_key(item: dict[str, Any]) -> tuple[str, str, list[str]]:
    """(shape, optimizer, overrides) of the healthy run an entry's harm is judged against."""
    optimizer = item.get("optim", "adamw")
    if item.get("family") in DEPTH_FAMILIES:
        layers = int(item["m"])
        return "deep6", optimizer, [] if layers == 6 else [f"model.n_layer={layers}"]
    return item.get("shape", "tiny2"), optimizer, []


def instance_overrides(item: dict[str, Any], context: dict) -> tuple[list[str], Plant | None]:
    """(every override of one split entry, its plant or None for a healthy entry)."""
    shape, optimizer = item.get("shape", "tiny2"), item.get("optim", "adamw")
    base = [*SHAPES[shape], *OPTIMIZERS[optimizer], f"optim.lr={_lr(shape, optimizer):g}"]
    base += list(item.get("overrides", []))
    base += [f"budget.seed={int(item.get('seed', 0))}"]
    if "family" not in item:
        return base, None
    plant = FAMILIES[item["family"]](
        float(item["m"]), item.get("shape", "tiny2"), item.get("optim", "adamw"), context
    )
    return [*base, *plant.overrides], plant


def name_of(item: dict[str, Any]) -> str:
    """A readable id: family@magnitude/shape/optimizer/seed, or the healthy entry's name."""
    if "family" not in item:
        return str(item["name"])
    shape, optim, seed = item.get("shape", "tiny2"), item.get("optim", "adamw"), item.get("seed", 0)
    return f"{item['family']}@{item['m']:g}/{shape}/{optim}/s{seed}"
