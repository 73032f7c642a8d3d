"""L0 static checks: what can be judged from the config and a data sample before training.

Each check reads a resolved config (a plain dict), a sample of the data and optionally the
device, and returns a `Check` with the measured value, the threshold it was held to, one line
of why, and the core question a failure points to (Q1 convergence, Q2 data and early
anomalies, Q3 speed). Thresholds and texts live in tables/static.yaml; this module only
measures and compares. A check whose config keys are missing is skipped, not failed, so a
user's own model or data source gets the checks that apply to it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from hyprun.diag.comm import allreduce_estimate
from hyprun.diag.dedup import exact_duplicate_ratio, near_duplicate_ratio, overlap_ratio
from hyprun.diag.efficiency import transformer_flops_per_token
from hyprun.diag.memory import MemoryEstimate, activation_bytes, count_params, estimate_memory
from hyprun.diag.rules import static_table

IGNORE_INDEX = -100
SEVERITY = {"skip": 0, "pass": 1, "warn": 2, "fail": 3}


@dataclass
class Check:
    """One L0 check's outcome."""

    id: str
    """Stable name, e.g. "lr_plausible"."""
    status: str
    """"pass" | "warn" | "fail" | "skip" (not applicable, or the input to judge it is missing)."""
    value: float | str | None
    """The measured quantity."""
    threshold: str
    """What the value was held to, human-readable."""
    why: str
    """One line: why this matters, or what to do."""
    question: str
    """The core question a failure points to: "Q1" | "Q2" | "Q3"."""


@dataclass
class DataSample:
    """A sample of the data the job will see, built by the caller from its data source."""

    train_x: np.ndarray
    """Input tokens [n, T] of training sequences 0..n-1 of the seed's stream."""
    train_y: np.ndarray
    """Targets [n, T]; -100 marks ignored (padding) positions."""
    heldout_x: np.ndarray
    """Input tokens [m, T] of the held-out set."""
    heldout_y: np.ndarray | None = None
    """Held-out targets [m, T], if known: lets padding be ignored when comparing rows."""
    whole_pool: bool = False
    """True when train_x is every row of the training pool (one epoch of a finite pool), so
    duplicate rates are the pool's; False for a sample of the stream, where a copy whose
    source fell outside the sample goes unseen (the rate is then a lower bound)."""

    def __post_init__(self) -> None:
        self.train_x, self.train_y = np.asarray(self.train_x), np.asarray(self.train_y)
        self.heldout_x = np.asarray(self.heldout_x)
        if self.heldout_y is not None:
            self.heldout_y = np.asarray(self.heldout_y)

    @classmethod
    def of(cls, source: Any, n: int = 8192, seed: int = 0, heldout: int = 512) -> DataSample:
        """Sample any data source (the protocol in runner/data): n train rows, m held-out rows."""
        x, y = source.train(0, n, seed)
        hx, hy = source.heldout(heldout)
        return cls(np.asarray(x), np.asarray(y), np.asarray(hx), np.asarray(hy))


@dataclass
class DeviceInfo:
    """The accelerator the job will run on, as far as memory and communication go."""

    name: str
    """e.g. "A100-40GB", "NVIDIA H100 80GB HBM3", "cpu"."""
    memory_gb: float | None
    """Memory per device in GB (10**9 bytes); None if unknown."""
    link_gbps: float | None
    """Bandwidth carrying the gradient all-reduce, Gbit/s per device and direction."""
    world: int
    """Number of data-parallel ranks."""


def device_info(
    name: str, world: int = 1, link_gbps: float | None = None, memory_gb: float | None = None
) -> DeviceInfo:
    """DeviceInfo from the device table (matched by name); `link_gbps` overrides the table's
    bandwidth (e.g. InfiniBand across nodes), `memory_gb` its memory (e.g. as measured)."""
    for row in static_table()["devices"]:
        if all(part.lower() in name.lower() for part in row["match"]):
            link = link_gbps if link_gbps is not None else row["link_gbps"]
            memory = memory_gb if memory_gb is not None else row["memory_gb"]
            return DeviceInfo(name, memory, link, world)
    return DeviceInfo(name, memory_gb, link_gbps, world)


class MissingKey(KeyError):
    """A config key a check needs is absent: the check is skipped."""


_ABSENT = object()


def _get(cfg: dict, path: str, default: Any = _ABSENT) -> Any:
    node: Any = cfg
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            if default is _ABSENT:
                raise MissingKey(path)
            return default
        node = node[part]
    return node


def _family(cfg: dict) -> str | None:
    """Optimizer family ("adam", "sgd") from the class name in optim._target_."""
    name = str(_get(cfg, "optim._target_")).rsplit(".", 1)[-1]
    for family, names in static_table()["optimizer_families"].items():
        if name in names:
            return family
    return None


def _builtin(cfg: dict) -> bool:
    return _get(cfg, "model._target_", None) in static_table()["builtin_models"]


def _is_gpu(device: DeviceInfo | None) -> bool:
    return device is not None and not device.name.lower().startswith("cpu")


def _world(device: DeviceInfo | None) -> int:
    return device.world if device is not None else 1


def _seq_len(cfg: dict) -> int:
    """Tokens in a trained sequence: the data's sequence length, which may be shorter than the
    model's context (counting the context put every token count 8x off at seq_len 8 of 64)."""
    return int(_get(cfg, "data.source.seq_len", None) or _get(cfg, "model.seq_len"))


def _tokens_per_step(cfg: dict, device: DeviceInfo | None) -> int:
    ds = _get(cfg, "ds")
    return int(ds["micro_batch"] * ds["grad_accum"] * _world(device) * _seq_len(cfg))


def _result(
    rule: dict, status: str, case: str, value: float | str | None, threshold: str, **fields: Any
) -> Check:
    why = rule["why"][case].format(**fields)
    return Check(rule["id"], status, value, threshold, why, rule["question"])


Rule = dict[str, Any]
CheckFn = Callable[[dict, DataSample, "DeviceInfo | None", Rule], Check]


def check_lr(cfg: dict, sample: DataSample, device: DeviceInfo | None, rule: Rule) -> Check:
    """LR not 0 and not absurd, and within a width-scaled band for the optimizer family."""
    lr, family = float(_get(cfg, "optim.lr")), _family(cfg)
    if family is None:
        return _result(rule, "skip", "unknown", lr, "no band")
    band = rule[family]
    width = int(_get(cfg, "model.d_model", band["reference_width"]))
    center = band["reference"] * (band["reference_width"] / width) ** band["width_power"]
    low, high = center * band["band"][0], center * band["band"][1]
    threshold = (
        f"0 < lr <= {band['fail_above']:g}; usual {low:.1e} <= lr <= {high:.1e} "
        f"for {family} at d_model {width}"
    )
    if lr <= 0:
        return _result(rule, "fail", "zero", lr, threshold)
    if lr > band["fail_above"]:
        return _result(rule, "fail", "absurd", lr, threshold)
    if lr > high:
        return _result(rule, "warn", "high", lr, threshold)
    if lr < low:
        return _result(rule, "warn", "low", lr, threshold)
    return _result(rule, "pass", "pass", lr, threshold)


def check_warmup(cfg: dict, sample: DataSample, device: DeviceInfo | None, rule: Rule) -> Check:
    """Adam-family optimizers need a warmup of at least one optimizer step."""
    frac = float(_get(cfg, "sched.warmup_frac", 0.0) or 0.0)
    threshold = f"warmup_frac > 0 and >= {rule['min_steps']} optimizer step(s) for Adam"
    if _family(cfg) != "adam":
        return _result(rule, "skip", "not_adam", frac, threshold)
    if frac <= 0:
        return _result(rule, "warn", "missing", frac, threshold)
    tokens = _get(cfg, "budget.tokens", None)
    if tokens is not None:
        steps = math.ceil(tokens / _tokens_per_step(cfg, device))
        if frac * steps < rule["min_steps"]:
            return _result(rule, "warn", "short", frac, threshold)
    return _result(rule, "pass", "pass", frac, threshold)


def check_betas(cfg: dict, sample: DataSample, device: DeviceInfo | None, rule: Rule) -> Check:
    """beta2 above 0.99 makes Adam's v too slow to follow a transformer's gradient changes;
    below 0.9 it is hardly an average at all."""
    limit = rule["warn_beta2_above"]
    low = rule["warn_beta2_below"]
    threshold = f"0 <= beta1 < 1, {low:g} <= beta2 < 1; beta2 <= {limit} on a transformer"
    if _family(cfg) != "adam":
        return _result(rule, "skip", "not_adam", None, threshold)
    beta1, beta2 = (float(b) for b in _get(cfg, "optim.betas", (0.9, 0.999)))
    if not (0 <= beta1 < 1 and 0 <= beta2 < 1):
        return _result(rule, "fail", "invalid", beta2, threshold)
    if beta2 < low:  # any model: it is Adam's own averaging that is gone
        steps = 1 / (1 - beta2)
        return _result(rule, "warn", "low_beta2", beta2, threshold, beta2=beta2, steps=steps)
    if _get(cfg, "model.n_head", None) is None:
        return _result(rule, "skip", "not_transformer", beta2, threshold)
    if beta2 > limit:
        return _result(rule, "warn", "high_beta2", beta2, threshold)
    return _result(rule, "pass", "pass", beta2, threshold)


def check_momentum(cfg: dict, sample: DataSample, device: DeviceInfo | None, rule: Rule) -> Check:
    """SGD's momentum is 0 (plain) or heavy-ball; a value between is a misplaced argument."""
    threshold = f"momentum == 0 or momentum >= {rule['warn_below']:g}"
    if _family(cfg) != "sgd":
        return _result(rule, "skip", "not_sgd", None, threshold)
    momentum = float(_get(cfg, "optim.momentum", 0.0) or 0.0)
    if 0 < momentum < rule["warn_below"]:
        return _result(rule, "warn", "low", momentum, threshold, momentum=momentum)
    return _result(rule, "pass", "pass", momentum, threshold)


def check_weight_decay(
    cfg: dict, sample: DataSample, device: DeviceInfo | None, rule: Rule
) -> Check:
    """Weight decay in the family's usual range: neither off nor overpowering the gradient."""
    wd, family = float(_get(cfg, "optim.weight_decay")), _family(cfg)
    if family is None:
        return _result(rule, "skip", "unknown", wd, "no range")
    band = rule[family]
    threshold = f"{band['min_exclusive']:g} < weight_decay <= {band['max']:g} for {family}"
    if wd <= band["min_exclusive"]:
        return _result(rule, "warn", "zero", wd, threshold)
    if wd > band["max"]:
        return _result(rule, "warn", "high", wd, threshold)
    return _result(rule, "pass", "pass", wd, threshold)


def check_decay_norms(
    cfg: dict, sample: DataSample, device: DeviceInfo | None, rule: Rule
) -> Check:
    """Decay belongs on weight matrices; norm gains and biases are not what overfits."""
    decayed = bool(_get(cfg, "optim.decay_norms_and_biases", False))
    threshold = "decay_norms_and_biases is false"
    if decayed and float(_get(cfg, "optim.weight_decay", 0.0)) > 0:
        return _result(rule, "warn", "decayed", "true", threshold)
    return _result(rule, "pass", "pass", str(decayed).lower(), threshold)


def check_grad_clip(cfg: dict, sample: DataSample, device: DeviceInfo | None, rule: Rule) -> Check:
    """Clipping on, so one bad batch cannot wreck the weights."""
    clip = float(_get(cfg, "ds.grad_clip") or 0.0)
    if clip <= 0:
        return _result(rule, "warn", "disabled", clip, "grad_clip > 0")
    return _result(rule, "pass", "pass", clip, "grad_clip > 0")


def check_loss_scaling(
    cfg: dict, sample: DataSample, device: DeviceInfo | None, rule: Rule
) -> Check:
    """fp16 needs (dynamic) loss scaling; bf16 and fp32 have the exponent range to do without."""
    precision = str(_get(cfg, "ds.precision"))
    threshold = "fp16: loss_scale 0 (dynamic); bf16/fp32: none needed"
    if precision != "fp16":
        return _result(rule, "pass", "pass", precision, threshold, precision=precision)
    scale = float(_get(cfg, "ds.loss_scale", 0) or 0)
    if scale == 0:
        return _result(rule, "pass", "dynamic", scale, threshold)
    if scale == 1:
        return _result(rule, "fail", "unscaled", scale, threshold)
    return _result(rule, "warn", "static", scale, threshold)


def _flops_per_token(model: dict, seq_len: int) -> float:
    """Training FLOPs per token, the attention term at the `seq_len` trained."""
    head_dim = int(model["d_model"]) // int(model["n_head"])
    n_active = count_params(model, non_embedding=True, active=True)
    return transformer_flops_per_token(
        n_active, int(model["n_layer"]), int(model["n_head"]), head_dim, seq_len
    )


def check_tokens_per_step(
    cfg: dict, sample: DataSample, device: DeviceInfo | None, rule: Rule
) -> Check:
    """Global batch in tokens against the compute-optimal batch for this model and budget."""
    tokens_per_step = _tokens_per_step(cfg, device)
    if not _builtin(cfg):
        return _result(rule, "skip", "unknown", tokens_per_step, "needs the model's FLOPs")
    compute = _flops_per_token(_get(cfg, "model"), _seq_len(cfg)) * float(
        _get(cfg, "budget.tokens")
    )
    optimal = rule["coefficient"] * compute ** rule["exponent"]
    floor = rule["warn_below_fraction"] * optimal
    threshold = (
        f"tokens/step >= {floor:,.0f} ({rule['warn_below_fraction']:g} x B_opt {optimal:,.0f} "
        f"= {rule['coefficient']} * C^{rule['exponent']}, C = {compute:.2g} FLOPs)"
    )
    status, case = ("warn", "small") if tokens_per_step < floor else ("pass", "pass")
    return _result(rule, status, case, tokens_per_step, threshold)


def check_steps(cfg: dict, sample: DataSample, device: DeviceInfo | None, rule: Rule) -> Check:
    """Enough optimizer steps in the budget for a schedule and a curve to mean something."""
    steps = float(_get(cfg, "budget.tokens")) / _tokens_per_step(cfg, device)
    threshold = f"budget.tokens / tokens_per_step >= {rule['min_steps']}"
    status, case = ("warn", "few") if steps < rule["min_steps"] else ("pass", "pass")
    return _result(rule, status, case, round(steps, 2), threshold, min_steps=rule["min_steps"])


def _optimizer_states(cfg: dict) -> str:
    """Key of memory.optimizer_state_bytes for this optimizer."""
    if _family(cfg) == "sgd":
        return "sgd_momentum" if float(_get(cfg, "optim.momentum", 0) or 0) > 0 else "sgd"
    return "adam"


def memory_estimate(cfg: dict, world: int) -> MemoryEstimate:
    """Per-device memory of a composed config of the built-in GPT (diag/memory.py's accounting:
    ZeRO-sharded model states plus one micro-batch's activations)."""
    model, ds = _get(cfg, "model"), _get(cfg, "ds")
    precision = str(ds["precision"])
    return estimate_memory(
        count_params(model),
        int(ds.get("zero_stage", 0)),
        world,
        precision,
        # Activations of the sequences trained, which may be shorter than the context.
        activation_bytes({**model, "seq_len": _seq_len(cfg)}, int(ds["micro_batch"]), precision),
        _optimizer_states(cfg),
    )


def check_memory(cfg: dict, sample: DataSample, device: DeviceInfo | None, rule: Rule) -> Check:
    """Model states (ZeRO accounting) plus activations must fit in one device's memory."""
    if not _builtin(cfg):
        return _result(rule, "skip", "unknown", None, "needs the parameter count")
    ds, world = _get(cfg, "ds"), _world(device)
    precision = str(ds["precision"])
    estimate = memory_estimate(cfg, world)
    detail = (
        f"params {estimate.params_gb:.2f} + grads {estimate.grads_gb:.2f} + optimizer "
        f"{estimate.optimizer_gb:.2f} + activations {estimate.activations_gb:.2f} GB "
        f"(ZeRO-{ds.get('zero_stage', 0)}, {precision}, world {world}, "
        f"micro_batch {ds['micro_batch']})"
    )
    total = round(estimate.total_gb, 3)
    capacity = device.memory_gb if device is not None else None
    if not capacity:
        return _result(rule, "skip", "no_device", total, detail)
    threshold = f"<= {rule['warn_above']:.0%} of {capacity:g} GB ({device.name}); {detail}"
    ratio = estimate.total_gb / capacity
    if ratio > rule["fail_above"]:
        return _result(rule, "fail", "over", total, threshold)
    if ratio > rule["warn_above"]:
        return _result(rule, "warn", "tight", total, threshold)
    return _result(rule, "pass", "pass", total, threshold)


def check_fused_attention(
    cfg: dict, sample: DataSample, device: DeviceInfo | None, rule: Rule
) -> Check:
    """The built-in GPT calls SDPA; on a GPU, flash needs 16-bit and a fitting head dim."""
    threshold = (
        f"on GPU: precision in {rule['flash_precisions']}, head_dim <= {rule['max_head_dim']} "
        f"and a multiple of {rule['head_dim_multiple']}"
    )
    if not _builtin(cfg):
        return _result(rule, "skip", "custom_model", None, threshold)
    head_dim = int(_get(cfg, "model.d_model")) // int(_get(cfg, "model.n_head"))
    if not _is_gpu(device):
        return _result(rule, "pass", "cpu", "cpu", threshold)
    if str(_get(cfg, "ds.precision")) not in rule["flash_precisions"]:
        return _result(rule, "warn", "fp32", "fallback", threshold)
    if head_dim > rule["max_head_dim"] or head_dim % rule["head_dim_multiple"]:
        return _result(rule, "warn", "head_dim", "fallback", threshold, head_dim=head_dim)
    return _result(rule, "pass", "pass", "flash", threshold, head_dim=head_dim)


def check_loader(cfg: dict, sample: DataSample, device: DeviceInfo | None, rule: Rule) -> Check:
    """Batches should be produced ahead of the loop, in workers, into pinned memory on a GPU."""
    loader = _get(cfg, "data.loader")
    workers = int(loader.get("num_workers") or 0)
    delay = float(_get(cfg, "data.source.loader_delay_ms", 0.0) or 0.0)
    gpu = _is_gpu(device)
    prefetch = loader.get("prefetch_factor")
    issues = []
    if workers == 0 and (delay > 0 or gpu):
        issues.append("in_process")
    if gpu and not loader.get("pin_memory", False):
        issues.append("pin_memory")
    if workers > 0 and prefetch is not None and prefetch < rule["min_prefetch_factor"]:
        issues.append("prefetch")
    threshold = (
        f"num_workers >= 1 if the source is slow or on GPU (loader delay {delay:g} ms); "
        f"pin_memory on GPU; prefetch_factor >= {rule['min_prefetch_factor']}"
    )
    if not issues:
        return _result(rule, "pass", "pass", workers, threshold)
    check = _result(rule, "warn", issues[0], workers, threshold)
    check.why = "; ".join(rule["why"][issue] for issue in issues)
    return check


def _trimmed_padding(y: np.ndarray, micro_batch: int) -> float:
    """Padding left after the loader cuts each micro-batch after its last real column."""
    real = y != IGNORE_INDEX
    kept = padded = 0
    for start in range(0, len(y), micro_batch):
        columns = np.flatnonzero(real[start : start + micro_batch].any(axis=0))
        width = int(columns[-1]) + 1 if len(columns) else 1
        block = real[start : start + micro_batch, :width]
        kept, padded = kept + block.size, padded + int((~block).sum())
    return padded / max(kept, 1)


def check_padding(cfg: dict, sample: DataSample, device: DeviceInfo | None, rule: Rule) -> Check:
    """Share of target positions that are padding: compute spent on nothing."""
    y = sample.train_y
    trim = bool(_get(cfg, "data.loader.trim_padding", False))
    waste = (
        _trimmed_padding(y, int(_get(cfg, "ds.micro_batch")))
        if trim
        else float((y == IGNORE_INDEX).mean())
    )
    threshold = (
        f"padding <= {rule['warn_above']:.0%} (fail > {rule['fail_above']:.0%}) of targets "
        f"in {len(y)} sampled rows{', after trim_padding' if trim else ''}"
    )
    status = _grade(waste, rule)
    case = "pass" if status == "pass" else "wasteful"
    return _result(rule, status, case, round(waste, 4), threshold, waste=waste)


def _grade(value: float, rule: Rule) -> str:
    if value > rule["fail_above"]:
        return "fail"
    return "warn" if value > rule["warn_above"] else "pass"


def _measured_over(sample: DataSample) -> str:
    """What a duplicate rate was measured over, for its message: the denominator."""
    if sample.whole_pool:
        return f"of all {len(sample.train_x)} rows of the training pool"
    return (
        f"of {len(sample.train_x)} sampled rows (copies within the sample only: a lower bound "
        "on the whole data's rate)"
    )


def check_duplicates(cfg: dict, sample: DataSample, device: DeviceInfo | None, rule: Rule) -> Check:
    """Rows of the training pool (or sample) whose real tokens repeat an earlier row exactly,
    found by hashing every row."""
    ratio = exact_duplicate_ratio(sample.train_x, mask=sample.train_y != IGNORE_INDEX)
    threshold = (
        f"exact duplicates <= {rule['warn_above']:.0%} (fail > {rule['fail_above']:.0%}) "
        f"{_measured_over(sample)}"
    )
    status = _grade(ratio, rule)
    return _result(rule, status, "pass" if status == "pass" else "duplicated", ratio, threshold)


def check_near_duplicates(
    cfg: dict, sample: DataSample, device: DeviceInfo | None, rule: Rule
) -> Check:
    """Rows that are not exact copies but share most of their n-grams with an earlier row."""
    ratio = near_duplicate_ratio(
        sample.train_x,
        threshold=rule["threshold"],
        ngram=rule["ngram"],
        num_perm=rule["num_perm"],
        bands=rule["bands"],
        mask=sample.train_y != IGNORE_INDEX,
    )
    threshold = (
        f"near duplicates (Jaccard of {rule['ngram']}-gram sets >= {rule['threshold']}, "
        f"exact copies excluded) <= {rule['warn_above']:.0%} (fail > {rule['fail_above']:.0%}) "
        f"{_measured_over(sample)}"
    )
    status = _grade(ratio, rule)
    return _result(rule, status, "pass" if status == "pass" else "duplicated", ratio, threshold)


def check_heldout_overlap(
    cfg: dict, sample: DataSample, device: DeviceInfo | None, rule: Rule
) -> Check:
    """Held-out rows equal to a training row make eval loss measure memory, not generalisation."""
    train_mask = held_mask = None
    if sample.heldout_y is not None:  # compare real tokens on both sides; else whole rows
        train_mask = sample.train_y != IGNORE_INDEX
        held_mask = sample.heldout_y != IGNORE_INDEX
    ratio = overlap_ratio(sample.heldout_x, sample.train_x, held_mask, train_mask)
    threshold = (
        f"held-out rows equal to one of {len(sample.train_x)} sampled train rows "
        f"<= {rule['fail_above']:g}"
    )
    status, case = ("fail", "leaked") if ratio > rule["fail_above"] else ("pass", "pass")
    return _result(rule, status, case, ratio, threshold)


def check_allreduce(cfg: dict, sample: DataSample, device: DeviceInfo | None, rule: Rule) -> Check:
    """Seconds per step the gradient all-reduce needs at least, for the caller to set against
    the measured step time."""
    world = _world(device)
    if world <= 1:
        return _result(rule, "skip", "single", 0.0, "world > 1")
    if device is None or not device.link_gbps:
        return _result(rule, "skip", "no_link", None, "link bandwidth known")
    if not _builtin(cfg):
        return _result(rule, "skip", "unknown", None, "needs the parameter count")
    precision, stage = str(_get(cfg, "ds.precision")), int(_get(cfg, "ds.zero_stage", 0))
    grad_bytes = static_table()["memory"]["bytes_per_param"][precision]["grads"]
    estimate = allreduce_estimate(
        count_params(_get(cfg, "model")) * grad_bytes,
        world,
        device.link_gbps,
        rule["volume_factor"][stage],
    )
    threshold = (
        f"ring: 2*(w-1)/w x {estimate.grad_bytes / 1e9:.2f} GB grads = "
        f"{estimate.bytes_on_wire / 1e9:.2f} GB per rank at {device.link_gbps:g} Gbit/s "
        f"(world {world}, ZeRO-{stage})"
    )
    return _result(rule, "pass", "pass", estimate.seconds, threshold)


CHECKS: dict[str, CheckFn] = {
    "lr_plausible": check_lr,
    "warmup": check_warmup,
    "adam_betas": check_betas,
    "sgd_momentum": check_momentum,
    "weight_decay": check_weight_decay,
    "decay_norms_biases": check_decay_norms,
    "grad_clip": check_grad_clip,
    "fp16_loss_scaling": check_loss_scaling,
    "tokens_per_step": check_tokens_per_step,
    "optimizer_steps": check_steps,
    "memory": check_memory,
    "fused_attention": check_fused_attention,
    "loader": check_loader,
    "padding_waste": check_padding,
    "duplicates": check_duplicates,
    "near_duplicates": check_near_duplicates,
    "heldout_overlap": check_heldout_overlap,
    "allreduce_time": check_allreduce,
}


def run_checks(config: dict, sample: DataSample, device: DeviceInfo | None = None) -> list[Check]:
    """All L0 checks, in a fixed order; a check missing a config key it needs is skipped."""
    table = static_table()["checks"]
    results = []
    for check_id, fn in CHECKS.items():
        rule = {**table[check_id], "id": check_id}
        try:
            results.append(fn(config, sample, device, rule))
        except MissingKey as missing:
            results.append(
                Check(
                    check_id,
                    "skip",
                    None,
                    f"needs {missing.args[0]}",
                    f"config has no {missing.args[0]}",
                    rule["question"],
                )
            )
    return results


def worst(checks: list[Check]) -> str:
    """The most severe status among `checks` (fail > warn > pass > skip)."""
    return max((c.status for c in checks), key=SEVERITY.__getitem__, default="skip")
