"""Named, measured scalars that the triage tables compare against thresholds.

Each feature is one number (or a short string) with a human detail that carries the numbers
behind it. A feature whose series was not logged is simply absent, and a rule that needs it does
not fire: a missing probe is no evidence either way.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from hyprun.diag import series as S
from hyprun.diag.evidence import (
    DEVICE_TAG,
    NAN_MODULE_TAG,
    NAN_UPDATES_TAG,
    OUTCOME_TAG,
    Evidence,
    Points,
)
from hyprun.diag.spikes import find_spikes


@dataclass
class Feature:
    """One measured quantity of a run."""

    value: float | str | None
    """The number the rules compare (1/0 for yes/no features, a string for names, None when
    the quantity is known to be absent, e.g. no NaN module)."""
    detail: str
    """One human line with the numbers behind the value."""
    status: str | None = None
    """For `static.<id>` features: the L0 check's pass | warn | fail | skip."""
    threshold: Any = None
    """For `static.<id>` features: the threshold the L0 check compared against."""

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict (None fields left out)."""
        out: dict[str, Any] = {"value": self.value, "detail": self.detail}
        if self.status is not None:
            out["status"] = self.status
        if self.threshold is not None:
            out["threshold"] = self.threshold
        return out


Features = dict[str, Feature]


def _g(x: float | None) -> str:
    """Short number formatting for details."""
    return "n/a" if x is None else f"{x:.3g}"


def _finite(points: Points) -> Points:
    return [(s, v) for s, v in points if math.isfinite(v)]


def _loss(ev: Evidence, out: Features) -> None:
    """Trend, oscillation, relative drop, rebound from its best level and spikes of the train
    loss."""
    pts = ev.points("train/loss")
    if not pts:
        return
    finite = _finite(pts)
    tr = S.trend(finite)
    if tr.kind != "insufficient":
        line = tr.describe("train loss slope over the last 20% of tokens")
        out["loss_trend"] = Feature(tr.kind, line)
        out["loss_plateau"] = Feature(float(tr.kind == "plateau"), line)
        out["loss_descending"] = Feature(float(tr.kind == "descending"), line)
    long = S.trend(finite, tail_frac=0.5)
    if long.kind != "insufficient":
        # An LR schedule that anneals to 0 flattens the last 20% of any healthy run; "decreases
        # then plateaus" is only evidence when the loss is flat over the last half of the run.
        out["loss_plateau_long"] = Feature(
            float(long.kind == "plateau"),
            long.describe("train loss slope over the last 50% of tokens"),
        )
    osc = S.oscillation(finite)
    if osc is not None:
        out["loss_oscillation"] = Feature(
            osc,
            f"train loss local scatter {_g(S.local_noise(finite))} is {osc:.3g} of the curve's "
            f"scale (range or level)",
        )
    start, end = S.first(finite), S.tail_median(finite, 0.1)
    if start and end is not None and len(finite) >= 2:
        out["loss_rel_drop"] = Feature(
            1.0 - end / start,
            f"train loss {start:.4g} at the start -> {end:.4g} at the end "
            f"(dropped {1.0 - end / start:.1%})",
        )
        out["loss_last"] = Feature(end, f"train loss at the end (tail median): {end:.4g}")
    rise = _early_rise(finite)
    if rise is not None:
        out["loss_early_rise"] = Feature(
            rise,
            f"train loss peaked {rise:+.1%} from its first value {start:.4g} within the first "
            f"{EARLY_SHARE:.0%} of tokens",
        )
    best = _best_level(finite)
    if best is not None and end is not None and best > 0:
        out["loss_rebound"] = Feature(
            end / best - 1.0,
            f"train loss ended at {end:.4g}, {end / best - 1.0:+.1%} from its best level "
            f"{best:.4g} (lowest {REBOUND_WINDOW}-point rolling median)",
        )
    if len(finite) >= 2:
        idx = find_spikes([v for _, v in finite])
        where = ", ".join(f"{finite[i][0]}" for i in idx[:5]) + (" ..." if len(idx) > 5 else "")
        out["loss_spikes"] = Feature(
            float(len(idx)),
            f"{len(idx)} train loss spikes (> 6σ or > 10x the moving average of the last 128)"
            + (f" at tokens {where}" if idx else ""),
        )


EARLY_SHARE = 0.2
"""The start of a run, as a share of its token span, read for an early surge of the loss: a
fresh model's loss only falls from its first value, so a loss that climbs above it there took
steps larger than the surface allowed before any schedule had settled (no warmup, an LR too
high)."""


def _early_rise(points: Points) -> float | None:
    """The highest train loss after the first point within the first EARLY_SHARE of the tokens,
    over the first loss, minus 1; None with fewer than 3 points there or a first loss <= 0."""
    if len(points) < 2 or points[0][1] <= 0:
        return None
    end = points[0][0] + EARLY_SHARE * (points[-1][0] - points[0][0])
    early = [v for s, v in points[1:] if s <= end]
    if len(early) < 2:
        return None
    return max(early) / points[0][1] - 1.0


REBOUND_WINDOW = 5
"""Points in the rolling median whose lowest value is a curve's best level: one lucky batch is
not a level the run reached."""


def _best_level(points: Points) -> float | None:
    """Lowest rolling median of `REBOUND_WINDOW` consecutive values; None with fewer than
    S.MIN_POINTS points."""
    vals = [v for _, v in points]
    if len(vals) < max(S.MIN_POINTS, REBOUND_WINDOW):
        return None
    return float(
        min(np.median(vals[i : i + REBOUND_WINDOW]) for i in range(len(vals) - REBOUND_WINDOW + 1))
    )


def _divergence(ev: Evidence, out: Features) -> None:
    """Divergence from the outcome tag or a non-finite loss, and where NaN first appeared."""
    counts = {
        key: S.count_nonfinite(ev.points(key)) for key in ("train/loss", "eval/loss", "grad/norm")
    }
    flagged = sum(1 for _, v in ev.points("grad/nonfinite") if v > 0)
    if flagged:
        counts["grad/nonfinite"] = flagged
    total = sum(counts.values())
    outcome = ev.tags.get(OUTCOME_TAG)
    if ev.points("train/loss") or outcome:
        out["nonfinite_count"] = Feature(
            float(total),
            "non-finite values: "
            + ", ".join(f"{k} {n}" for k, n in counts.items() if n or k == "train/loss"),
        )
        loss_bad = counts["train/loss"] + counts["eval/loss"]
        diverged = outcome == "diverged" or loss_bad > 0
        out["diverged"] = Feature(
            float(diverged),
            f"outcome tag {outcome or 'absent'}, {loss_bad} non-finite loss values",
        )
    # Absent (a run that stayed finite, or one recorded before the tag): not known to be the
    # first step, so the explosion rows keep reading it as before.
    updates = ev.tags.get(NAN_UPDATES_TAG)
    out["nan_at_first_step"] = Feature(
        float(updates == "0"),
        f"optimizer updates before the first non-finite loss: {updates or 'not recorded'}",
    )
    module = ev.tags.get(NAN_MODULE_TAG) or None
    out["nan_module"] = Feature(
        module,
        f"first non-finite module output: {module}" if module else "no non-finite module recorded",
    )


def _gradients(ev: Evidence, out: Features) -> None:
    """Global gradient norm level, its worst excursion, its level at the first probe, spikes, and
    the spread across depth."""
    pts = _finite(ev.points("grad/norm"))
    if pts:
        med = S.median(pts)
        out["grad_norm_median"] = Feature(
            med, f"global grad norm (before clipping) median {_g(med)} over {len(pts)} probes"
        )
        top = S.max_after(pts, 0.1)
        if len(pts) >= 4 and med and top is not None:
            out["grad_norm_max_over_median"] = Feature(
                top / med,
                f"grad norm max {_g(top)} (after the first 10% of tokens) is {top / med:.3g}x "
                f"its median {_g(med)}",
            )
        step0, first = pts[0]
        if len(pts) >= 4 and first and top is not None:
            out["grad_norm_max_over_first"] = Feature(
                top / first,
                f"grad norm max {_g(top)} (after the first 10% of tokens) is {top / first:.3g}x "
                f"its level at the first probe {_g(first)}",
            )
        if len(pts) >= 4 and med:
            out["grad_norm_first_over_median"] = Feature(
                first / med,
                f"grad norm at the first probe (token {step0}) {_g(first)} is {first / med:.3g}x "
                f"its median {_g(med)}",
            )
        idx = find_spikes([v for _, v in pts])
        out["grad_spikes"] = Feature(
            float(len(idx)),
            f"{len(idx)} grad norm spikes (> 6σ or > 10x the moving average)"
            + (f" at tokens {', '.join(str(pts[i][0]) for i in idx[:5])}" if idx else ""),
        )
    blocks = ev.per_block("grad/norm")
    if len(blocks) >= 2:
        by_step: dict[int, dict[str, float]] = {}
        for module, bpts in blocks.items():
            for step, v in _finite(bpts):
                by_step.setdefault(step, {})[module] = v
        ratios = [
            min(vals.values()) / max(vals.values())
            for vals in by_step.values()
            if len(vals) == len(blocks) and max(vals.values()) > 0
        ]
        if ratios:
            meds = {m: S.median(p) or 0.0 for m, p in blocks.items()}
            weak = min(meds, key=lambda m: meds[m])
            strong = max(meds, key=lambda m: meds[m])
            ratio = float(np.median(ratios))
            out["grad_layer_ratio"] = Feature(
                ratio,
                f"weakest/strongest block grad norm, median over {len(ratios)} probes: "
                f"{ratio:.3g} (weakest {weak} median {_g(meds[weak])}, strongest {strong} "
                f"median {_g(meds[strong])})",
            )


def _parameters(ev: Evidence, out: Features) -> None:
    """Step size, the weights' norm across the run, drift from init, embedding growth."""
    upd = _finite(ev.points("param/update_ratio"))
    if upd:
        med = S.median(upd)
        out["update_ratio_median"] = Feature(
            med, f"per-step update ratio ‖Δθ‖/‖θ‖ median {_g(med)} over {len(upd)} probes"
        )
    norm = _finite(ev.points("param/norm"))
    shrink = S.last_over_first(norm)
    if shrink is not None:
        # Gradient steps leave the weights' norm where it started or above; a pull towards 0
        # (weight decay) takes it below.
        out["param_norm_growth"] = Feature(
            shrink,
            f"parameter norm {_g(S.first(norm))} at the first probe -> "
            f"{_g(S.tail_median(norm, 0.1))} at the end ({shrink:.3g}x)",
        )
    dist = _finite(ev.points("param/dist_from_init"))
    if dist:
        end = S.last(dist)
        out["dist_from_init_last"] = Feature(
            end, f"parameters moved ‖θ−θ0‖/‖θ0‖ = {_g(end)} from init by the end"
        )
    emb = _finite(ev.points("param/embedding_rms"))
    if emb:
        end = S.tail_median(emb, 0.1)
        out["embedding_rms_last"] = Feature(end, f"embedding RMS at the end {_g(end)}")
    growth = S.last_over_first(emb)
    if growth is not None:
        out["embedding_rms_growth"] = Feature(
            growth,
            f"embedding RMS {_g(S.first(emb))} -> {_g(S.tail_median(emb, 0.1))} ({growth:.3g}x)",
        )


STEP_SCAN_PEAK_SHARE = 0.5
"""The step scan is read on probes whose LR is at least this share of the run's peak: a decayed
or warming-up LR is short of the surface by design."""
STEP_SCAN_MIN_PROBES = 3
"""Fewer near-peak probes than this are one or two reads, not a level: no feature. gpt_small's
16 split steps, probed every 4, leave one, and SGD at its best LR read 8x there (small_sgd, a
held-out healthy run of the seventh draw's check)."""


def _step_scan(ev: Evidence, out: Features) -> None:
    """At which multiple of the step taken the held-out loss fell furthest, median over the
    probes after the first (Adam's first step is sign-like) at a near-peak LR."""
    prefix = "step/loss_x"  # one series per multiple scanned (hyprun.diag.probes.STEP_MULTIPLES)
    scans = {
        float(key[len(prefix) :]): dict(_finite(points))
        for key, points in ev.series.items()
        if key.startswith(prefix)
    }
    lrs = _finite(ev.points("train/lr"))
    steps = sorted(scans.get(1.0, {}))[1:]
    if not steps or not lrs:
        return
    peak = max(v for _, v in lrs)
    lr_at = {s: S.nearest(lrs, s)[0][1] for s in steps}
    near_peak = [s for s in steps if lr_at[s] >= STEP_SCAN_PEAK_SHARE * peak]
    best = [min(scans, key=lambda m: scans[m].get(s, math.inf)) for s in near_peak]
    if len(best) < STEP_SCAN_MIN_PROBES:
        return
    value = float(np.median(best))
    out["step_best_multiple"] = Feature(
        value,
        f"held-out loss lowest at {value:g}x the step taken (median over {len(best)} probes at "
        f">= {STEP_SCAN_PEAK_SHARE:g} of the peak LR; scanned "
        f"{'/'.join(f'{m:g}' for m in sorted(scans))}x)",
    )


SCAN_BATCH_LOSS = "step/loss_x0"
"""The step scan's read at 0x the step: the loss on one fixed held-out micro-batch at the
weights each probe found, before its step."""


def _heldout_oscillation(ev: Evidence, out: Features) -> None:
    """Probe-to-probe scatter of the loss on the fixed held-out batch, as a share of its scale.
    The train loss scatters from step to step for two reasons: every step draws a different
    batch (that noise grows as the batch shrinks), and the weights themselves bounce (an LR too
    high). The same batch read at every probe carries only the second."""
    fixed = _finite(ev.points(SCAN_BATCH_LOSS))
    swing = S.oscillation(fixed)
    if swing is None:
        return
    out["heldout_loss_oscillation"] = Feature(
        swing,
        f"loss on the fixed held-out batch ({SCAN_BATCH_LOSS}, {len(fixed)} probes): local "
        f"scatter {_g(S.local_noise(fixed))} is {swing:.3g} of the curve's scale (range or level)",
    )


def _per_layer(
    ev: Evidence,
    out: Features,
    prefix: str,
    name: str,
    pick: Callable[[dict[str, float]], str],
    what: str,
    extra: str = "",
) -> None:
    """One feature from the tail medians of a per-block metric: the layer `pick` chooses."""
    levels = {m: S.tail_median(p) for m, p in ev.per_block(prefix).items()}
    levels = {m: v for m, v in levels.items() if v is not None}
    if not levels:
        return
    layer = pick(levels)
    others = ", ".join(f"{m} {v:.3g}" for m, v in levels.items())
    out[name] = Feature(
        levels[layer], f"{what}: {levels[layer]:.3g} at {layer}{extra} (tail medians: {others})"
    )


def _architecture(ev: Evidence, out: Features) -> None:
    """Attention entropy, MoE load, residual write ratio (settled, and at the first probe)."""
    _per_layer(
        ev,
        out,
        "attn/entropy",
        "attn_entropy_min",
        lambda d: min(d, key=lambda m: d[m]),
        "lowest normalised attention entropy (1 uniform, 0 collapsed)",
    )
    levels = {m: S.tail_median(p) for m, p in ev.per_block("moe/imbalance").items()}
    levels = {m: v for m, v in levels.items() if v}
    if levels:
        worst = max(levels, key=lambda m: levels[m])
        experts = ev.cfg("model.n_experts")
        out["moe_imbalance_max"] = Feature(
            levels[worst],
            f"MoE load max/mean {levels[worst]:.3g} at {worst}: balance (mean/max) "
            f"{1.0 / levels[worst]:.2f}"
            + (f", {experts} experts (all on one = {experts})" if experts else ""),
        )
    aux = _finite(ev.points("moe/aux_loss"))
    if aux:
        out["moe_aux_loss"] = Feature(
            S.tail_median(aux), f"MoE aux loss at the end {_g(S.tail_median(aux))}"
        )
    _per_layer(
        ev,
        out,
        "act/write_ratio",
        "write_ratio_max",
        lambda d: max(d, key=lambda m: d[m]),
        "largest residual write ratio RMS(out−in)/RMS(in)",
    )
    firsts = {m: (p[0][0], p[0][1]) for m, p in ev.per_block("act/write_ratio").items()}
    firsts = {m: sv for m, sv in firsts.items() if math.isfinite(sv[1])}
    if firsts:
        top = max(firsts, key=lambda m: firsts[m][1])
        out["write_ratio_first_max"] = Feature(
            firsts[top][1],
            f"largest residual write ratio at the first probe (token {firsts[top][0]}): "
            f"{firsts[top][1]:.3g} at {top} (a block that writes ~0 adds nothing yet)",
        )


MATCHED_EVALS = 4
"""Evaluations (the last ones) over which the token-matched held-out/train gap is taken."""
MATCHED_TRAIN_POINTS = 5
"""Train loss points nearest an evaluation whose median is the train level at its tokens."""


def _eval(ev: Evidence, out: Features) -> None:
    """Held-out vs train loss at the end (the train tail median lags a falling curve), and the
    same gap matched in tokens: the train level at each of the last evaluations' tokens."""
    train = _finite(ev.points("train/loss"))
    evals = _finite(ev.points("eval/loss"))
    if not train or not evals:
        return
    t_end = S.tail_median(train, 0.1)
    e_end = evals[-1][1]
    if t_end:
        gap = (e_end - t_end) / abs(t_end)
        out["train_eval_gap"] = Feature(
            gap, f"eval loss {e_end:.4g} vs train loss {t_end:.4g} at the end ({gap:+.1%})"
        )
    gaps, nats = [], []
    for step, e in evals[-MATCHED_EVALS:]:
        near = S.nearest(train, step, MATCHED_TRAIN_POINTS)
        level = float(np.median([v for _, v in near]))
        nats.append(e - level)
        if level:
            gaps.append((e - level) / abs(level))
    if nats:
        # In nats, not as a share of the loss: label noise adds a roughly fixed number of nats
        # to the train loss, while a relative gap grows as a healthy run's loss falls.
        gap_nats = float(np.median(nats))
        out["eval_gap_matched_nats"] = Feature(
            gap_nats,
            f"held-out minus train loss at the same tokens: {gap_nats:+.3f} nats (median over "
            f"the last {len(nats)} evaluations)",
        )
    if gaps:
        gap = float(np.median(gaps))
        out["eval_gap_matched"] = Feature(
            gap,
            f"held-out loss vs the train loss at the same tokens (median of the "
            f"{MATCHED_TRAIN_POINTS} nearest train points), median over the last {len(gaps)} "
            f"evaluations: {gap:+.1%} (negative: the held-out targets are easier to predict "
            f"than the training targets)",
        )


def _eval_against_heldout(ev: Evidence, out: Features) -> None:
    """The run's own held-out loss at its end over what the trained weights read: the probe's
    held-out batch (step/loss_x0) at the last probe, or the training loss at the end where that
    is higher. Both are losses of one model, so they agree up to the samples' error, the
    weights' progress after the last probe (which only lowers the metric) and the train-held-out
    gap; a run that got worse after its last probe shows it in its training loss too. An
    evaluation that reads other weights (an EMA run away, a stale copy) does not. Judged where
    the metric is a loss to minimise."""
    declared = json.loads(ev.tags.get(METRIC_TAG, '{"name": "eval/loss", "direction": "min"}'))
    if "loss" not in declared["name"] or declared["direction"] != "min":
        return
    evals, reads = _finite(ev.points(declared["name"])), _finite(ev.points(SCAN_BATCH_LOSS))
    train = S.tail_median(_finite(ev.points("train/loss")), 0.1) or 0.0
    if not evals or not reads:
        return
    trained = max(reads[-1][1], train)
    if trained <= 0:
        return
    ratio = evals[-1][1] / trained
    out["eval_over_heldout"] = Feature(
        ratio,
        f"the run's {declared['name']} at its end {evals[-1][1]:.4g} is {ratio:.3g}x what the "
        f"trained weights read (held-out batch at the last probe {reads[-1][1]:.4g}, training "
        f"loss at the end {train:.4g})",
    )


def declared(ev: Evidence, name: str) -> Any:
    """A config value by the cards' vocabulary (`optim.lr`): the app's key for it where the run
    is an app's (its knobs tag), else our job's own key."""
    knob = json.loads(ev.tags.get(KNOBS_TAG, "{}")).get(name)
    if knob is None:
        return None if KNOBS_TAG in ev.tags else ev.cfg(name)
    return ev.cfg(knob["key"], knob.get("default"))


def _lr_as_declared(ev: Evidence, out: Features) -> None:
    """The peak LR the optimizer applied (its highest group's, where the groups differ) over the
    LR the config declares, and whether the LR ever rose above its first reading (a warmup):
    the config's LR is the one that trains."""
    lrs = _finite(ev.points(LR_MAX)) or _finite(ev.points("train/lr"))
    value = _num(declared(ev, "optim.lr"))
    if not value or value <= 0 or len(lrs) < 2:
        return
    peak = max(v for _, v in lrs)
    ratio = peak / value
    out["lr_over_declared"] = Feature(
        ratio, f"the peak applied LR {peak:.3g} is {ratio:.3g}x the declared {value:.3g}"
    )
    rose = peak > lrs[0][1] * (1 + 1e-6)
    out["lr_rose"] = Feature(float(rose), "the LR rose after its first reading (a warmup)")


def _settings_as_declared(ev: Evidence, out: Features) -> None:
    """The weight decay, warmup and dropout the config declares (in the app's key, through its
    knobs), beside what the optimizer and model applied as the L0 checks read them live: a
    declared setting that never reached the optimizer or the layers is a card that cannot act.
    Only where the probe read the run (`hyprun.source` probe): our job's L0 checks read its
    config, the very values declared (its warmup check warns of a warmup too short for one
    step, not of one missing)."""
    if ev.tags.get("hyprun.source") != "probe":
        return
    checks = {check.get("id"): check for check in ev.static}
    applied_over = {  # feature: (the knob, the L0 check that read what was applied, in words)
        "wd_applied_over_declared": (
            "optim.weight_decay",
            "weight_decay",
            "the optimizer applies weight decay {applied:.3g} (its highest group's)",
        ),
        "dropout_over_declared": (
            "model.dropout",
            "dropout_rate",
            "the model's dropout modules drop up to {applied:.3g}",
        ),
    }
    for feature, (knob, check, text) in applied_over.items():
        wanted = _num(declared(ev, knob))
        applied = _num(checks.get(check, {}).get("value"))
        if wanted and wanted > 0 and applied is not None:
            ratio = applied / wanted
            shown = f"{text.format(applied=applied)}, {ratio:.3g}x the declared {wanted:.3g}"
            out[feature] = Feature(ratio, shown)
    warmup = _num(declared(ev, "sched.warmup_frac"))
    if warmup is not None:
        out["warmup_declared"] = Feature(warmup, f"the config declares a warmup of {warmup:g}")


def _lr_sign(ev: Evidence, out: Features) -> None:
    """The lowest LR the optimizer applied (param group 0): below zero, each step climbs the
    loss; no schedule that trains goes there."""
    lrs = _finite(ev.points("train/lr"))
    if not lrs:
        return
    at, lowest = min(lrs, key=lambda point: point[1])
    out["lr_min"] = Feature(lowest, f"the lowest applied LR {lowest:.3g} (at step {at})")


def _step_cadence(ev: Evidence, out: Features) -> None:
    """The most training forwards one of the first optimizer steps took, over the micro-batches
    per step the run declares: 1 when the optimizer steps as the config says."""
    read = next((c for c in ev.static if c.get("id") == "step_forwards"), {}).get("value")
    declared = _num(ev.tags.get(ACCUMULATION_TAG, ev.cfg("ds.grad_accum")))
    if not isinstance(read, int | float) or not declared or declared < 1:
        return
    ratio = read / declared
    out["forwards_per_declared_step"] = Feature(
        ratio,
        f"{read:g} training forwards took one optimizer step where the run declares {declared:g} "
        f"micro-batch(es) per step ({ratio:.3g}x)",
    )


def _efficiency(ev: Evidence, out: Features) -> None:
    """Medians of the throughput metrics (the first window includes start-up, the median
    ignores it)."""
    table = [
        ("data_wait_frac", "perf/data_wait_frac", "fraction of step time waiting for data"),
        ("mfu", "perf/mfu", "model FLOPs utilisation"),
        ("comm_frac", "perf/comm_frac", "fraction of step time in communication"),
        ("tokens_per_s", "perf/tokens_per_s", "tokens per second"),
        ("step_time_s", "perf/step_time_s", "seconds per step"),
    ]
    for name, key, what in table:
        pts = _finite(ev.points(key))
        if pts:
            med = S.median(pts)
            out[name] = Feature(med, f"{what}: median {_g(med)} over {len(pts)} windows")
    _data_wait_at_best_speed(ev, out)
    device = ev.tags.get(DEVICE_TAG)
    out["on_cpu"] = Feature(
        float(device == "cpu"),
        f"device tag {device or 'absent'}"
        + (": MFU bands are accelerator numbers, not judged on a CPU" if device == "cpu" else ""),
    )
    mem = _finite(ev.points("perf/peak_mem_gb"))
    if mem:
        top = max(v for _, v in mem)
        out["peak_mem_gb"] = Feature(top, f"peak memory {top:.3g} GB")


FASTEST_WINDOWS = 0.1
"""Quantile of the per-window compute seconds taken as the machine's unloaded speed: on a
shared machine the load comes and goes, and the fastest tenth of the windows ran nearest to
what the job's compute costs alone."""


def _data_wait_at_best_speed(ev: Evidence, out: Features) -> None:
    """The data-wait share judged from seconds: the median wait per step against the compute
    seconds per step of the fastest windows. A busy machine stretches the compute and shrinks
    the measured share of the same wait (4% busy, 64% idle for one loader delay); this share
    does not move with load, and `input_bound` reads the larger of the two."""
    wait = _finite(ev.points("perf/data_wait_s"))
    compute = _finite(ev.points("perf/compute_s"))
    if not wait or not compute:  # a run logged before the seconds were: the share alone
        if "data_wait_frac" in out:
            measured = out["data_wait_frac"]
            out["data_wait_share"] = Feature(measured.value, measured.detail)
        return
    wait_s = S.median(wait)
    best = float(np.quantile([v for _, v in compute], FASTEST_WINDOWS))
    out["data_wait_s"] = Feature(wait_s, f"data wait per step: median {_g(wait_s)} s")
    out["compute_s_best"] = Feature(
        best, f"compute per step in the fastest {FASTEST_WINDOWS:.0%} of windows: {_g(best)} s"
    )
    share = wait_s / (wait_s + best) if wait_s + best > 0 else 0.0
    measured = out["data_wait_frac"].value if "data_wait_frac" in out else 0.0
    out["data_wait_share"] = Feature(
        max(share, measured),
        f"data wait {_g(wait_s)} s per step against {_g(best)} s of compute at the job's best "
        f"speed: {share:.0%} of a step (measured share {measured:.0%}; the larger is judged)",
    )


def _obvious(ev: Evidence, out: Features) -> None:
    """Inputs to the "check the obvious first" list: peak LR, initial loss vs uniform guess."""
    lr_cfg = ev.cfg("optim.lr")
    lr_pts = _finite(ev.points("train/lr"))
    if lr_pts:
        peak = max(v for _, v in lr_pts)
        out["lr"] = Feature(peak, f"peak logged LR {peak:.3g} (config optim.lr {_g(_num(lr_cfg))})")
    elif _num(lr_cfg) is not None:
        out["lr"] = Feature(_num(lr_cfg), f"config optim.lr {_g(_num(lr_cfg))}")
    vocab = (
        _num(ev.cfg("model.vocab_size"))
        or _num(ev.cfg("data.vocab_size"))
        or _num(ev.tags.get(VOCAB_TAG))
    )
    start = S.first(_finite(ev.points("train/loss")))
    if vocab and vocab > 1 and start is not None:
        uniform = math.log(vocab)
        out["initial_loss_ratio"] = Feature(
            start / uniform,
            f"first train loss {start:.4g} vs ln(vocab {int(vocab)}) = {uniform:.4g} "
            f"(ratio {start / uniform:.3g}; ≈1 for a fresh model)",
        )


def _config(ev: Evidence, out: Features) -> None:
    """Architecture choices read from the run's logged config (absent when it does not say)."""
    placement = ev.cfg("model.placement")
    if isinstance(placement, str) and placement:
        out["post_norm"] = Feature(
            float(placement == "post"),
            f"config model.placement {placement} (post: the norm follows the residual add, so "
            f"the stream has no identity path through the blocks)",
        )


def _num(x: Any) -> float | None:
    """A config value as a float, None when it is not a number."""
    if isinstance(x, bool):
        return None
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def _static(ev: Evidence, out: Features) -> None:
    """One feature per L0 static check, plus how many failed."""
    failed = []
    for check in ev.static:
        cid = check.get("id")
        if not cid:
            continue
        status = check.get("status")
        if status == "fail":
            failed.append(str(cid))
        out[f"static.{cid}"] = Feature(
            check.get("value"),
            f"L0 {cid}: {status}, value {check.get('value')} vs threshold "
            f"{check.get('threshold')}" + (f": {check['why']}" if check.get("why") else ""),
            status=status,
            threshold=check.get("threshold"),
        )
    if ev.static:
        out["static_fail_count"] = Feature(
            float(len(failed)),
            f"{len(failed)} of {len(ev.static)} L0 static checks failed"
            + (f": {', '.join(failed)}" if failed else ""),
        )


def _decay_pull(ev: Evidence, out: Features) -> None:
    """Weight decay's pull against the whole step: decoupled decay removes lr * wd of every
    decayed weight each step (coupled L2 under momentum removes more), while the measured step
    moves the weights by update_ratio of their norm. At 1 or more the decay alone is as large as
    the net step, so the weights sit where the decay holds them, not where the loss wants them:
    the underfitting a too-strong decay predicts, seen even while the norm still grows from a
    small init."""
    lr, decay, step = out.get("lr"), out.get("static.weight_decay"), out.get("update_ratio_median")
    values = [_num(f.value) if f is not None else None for f in (lr, decay, step)]
    if any(v is None or v <= 0 for v in values):
        return
    peak_lr, weight_decay, update_ratio = values
    pull = peak_lr * weight_decay / update_ratio
    out["decay_pull_over_update"] = Feature(
        pull,
        f"weight decay pulls lr*wd = {_g(peak_lr * weight_decay)} of the weights per step, "
        f"{pull:.3g}x the measured step ‖Δθ‖/‖θ‖ {_g(update_ratio)}",
    )


NEEDS = {
    "train/loss": (
        "loss_trend loss_plateau loss_descending loss_plateau_long loss_oscillation "
        "loss_rel_drop loss_last loss_rebound loss_spikes loss_early_rise"
    ),
    "train/loss or the hyprun.outcome tag": "nonfinite_count diverged",
    "grad/norm": (
        "grad_norm_median grad_norm_max_over_median grad_norm_max_over_first "
        "grad_norm_first_over_median grad_spikes"
    ),
    "grad/norm/blocks.<i> (two or more blocks)": "grad_layer_ratio",
    "param/update_ratio": "update_ratio_median",
    "param/norm": "param_norm_growth",
    "param/dist_from_init": "dist_from_init_last",
    "param/embedding_rms": "embedding_rms_last embedding_rms_growth",
    "step/loss_x<multiple> (probes.step_scan, 3+ probes at half the peak LR) and train/lr": (
        "step_best_multiple"
    ),
    "step/loss_x0 (probes.step_scan, 8+ probes)": "heldout_loss_oscillation",
    "L0 step_forwards and the declared accumulation (ds.grad_accum or the app's knob)": (
        "forwards_per_declared_step"
    ),
    "the run's held-out loss (eval/loss or the app's metric) and step/loss_x0": (
        "eval_over_heldout"
    ),
    "attn/entropy/blocks.<i> (the built-in GPT's attention capture)": "attn_entropy_min",
    "moe/imbalance/blocks.<i> (an MoE model)": "moe_imbalance_max",
    "moe/aux_loss (an MoE model)": "moe_aux_loss",
    "act/write_ratio/blocks.<i> (residual blocks found in the model)": (
        "write_ratio_max write_ratio_first_max"
    ),
    "eval/loss and train/loss": "train_eval_gap eval_gap_matched eval_gap_matched_nats",
    "perf/data_wait_frac": "data_wait_frac",
    "perf/data_wait_frac and perf/step_time_s": "data_wait_s data_wait_share compute_s_best",
    "perf/mfu (FLOPs per token and a device peak)": "mfu",
    "perf/comm_frac (ds.wall_clock_breakdown)": "comm_frac",
    "perf/tokens_per_s": "tokens_per_s",
    "perf/step_time_s": "step_time_s",
    "perf/peak_mem_gb": "peak_mem_gb",
    "train/lr or config optim.lr": "lr",
    "train/lr": "lr_min",
    "the L0 weight_decay check and the declared one (optim.weight_decay or the app's knob)": (
        "wd_applied_over_declared"
    ),
    "the declared warmup (sched.warmup_frac or the app's knob)": "warmup_declared",
    "the L0 dropout_rate check and the declared rate (the app's model.dropout knob)": (
        "dropout_over_declared"
    ),
    "train/lr (or train/lr_max) and the declared LR (config optim.lr or the app's knob for it)": (
        "lr_over_declared lr_rose"
    ),
    "train/loss and config model.vocab_size (or data.vocab_size, or a language model's head)": (
        "initial_loss_ratio"
    ),
    "config model.placement": "post_norm",
    "train/lr, the weight decay (L0) and param/update_ratio": "decay_pull_over_update",
}
"""The evidence each feature is measured from, in words: what a run lacks when a table row
that reads the feature could not be judged."""
_NEEDED_BY = {feature: evidence for evidence, names in NEEDS.items() for feature in names.split()}


VOCAB_TAG = "hyprun.vocab_size"
"""Tag of a probe-recorded run: the vocabulary its language model predicts over (read off the
model's embedding and head), for the initial loss against ln(vocab) when the config names none."""
METRIC_TAG = "hyprun.metric"
"""Tag of an app's seed run: its declared metric as JSON ({"name", "direction"}); a run without
it is our job's, whose held-out metric is eval/loss."""
ACCUMULATION_TAG = "hyprun.accumulation"
"""Tag of an app's seed run: the micro-batches per optimizer step its config declares (its
ds.grad_accum knob), or "unknown"; a run without it is our job's (config ds.grad_accum)."""
LR_MAX = "train/lr_max"
"""The highest LR over the optimizer's groups, logged where the groups' LRs differ (a layer-wise
decay gives each group a share of the declared LR; the top group trains at it)."""
KNOBS_TAG = "hyprun.knobs"
"""Tag of an app's seed run: its knobs as JSON ({card vocabulary name: {"key", "default", ...}}):
which of the app's keys holds, e.g., the LR the cards call optim.lr."""
LR_TOLERANCE = 2.0
"""Factor by which the peak LR the optimizer applied may differ from the declared one before it
counts as another LR. A schedule multiplies the declared LR by a factor of at most 1 (its
peak), and a run whose LR never rose starts at that peak (a decay logged after its first step
reads 1 - 1/steps of it), so a healthy run reads 1; a factor of 2 either way is no rounding,
logging or schedule shape (a warmup that has not ended is warmup_never_ends's)."""
SCAN_TAG = "hyprun.step_scan"
"""Tag of a probe-recorded run: whether the step scan ran ("on", or "off: <why>")."""
BLOCKS_TAG = "hyprun.blocks"
"""Tag of a probe-recorded run: where its residual blocks were found ("none found")."""
APP_CANNOT = {
    "attn/entropy/blocks.<i> (the built-in GPT's attention capture)": (
        "the model exposes no attention probabilities to hooks (fused attention returns none; "
        "only the built-in GPT recomputes them for a few heads)"
    ),
    "moe/imbalance/blocks.<i> (an MoE model)": (
        "no MoE layer that keeps its routing (the built-in GPT's mlp.last_load); a dense model "
        "has none to judge"
    ),
    "moe/aux_loss (an MoE model)": "no MoE layer that keeps its auxiliary loss",
    "perf/comm_frac (ds.wall_clock_breakdown)": (
        "the all-reduce share is read from the built-in job's DeepSpeed timers"
    ),
    "config model.placement": "not the built-in GPT: no model.placement knob to read",
    "train/loss and config model.vocab_size (or data.vocab_size, or a language model's head)": (
        "the app's config names no model.vocab_size or data.vocab_size, and the model has no "
        "head onto its token embedding's vocabulary"
    ),
}
"""Why a run recorded by the probe in someone else's loop lacks evidence the job records."""


def why_unmeasured(tags: dict[str, str], needs: list[str]) -> dict[str, str]:
    """{evidence: why this run lacks it} for a run the probe recorded (`hyprun.source` probe);
    {} for the job's runs, whose gaps are settings (probes off), not limits."""
    if tags.get("hyprun.source") != "probe":
        return {}
    scan = tags.get(SCAN_TAG, "on")
    scan_why = (
        f"step scan {scan}"
        if scan.startswith("off")
        else "too few probes near the peak LR for a level: probe more often (every_steps) "
        "or train longer"
    )
    out = {}
    for need in needs:
        if need.startswith("step/loss_x"):
            out[need] = scan_why
        elif need.startswith("act/") and tags.get(BLOCKS_TAG) == "none found":
            out[need] = "no residual blocks found in the model (Probe(..., blocks=))"
        elif need.startswith("L0 check"):
            out[need] = "needs the job's config and data; the optimizer's were read live"
        elif need in APP_CANNOT:
            out[need] = APP_CANNOT[need]
    return out


def evidence_for(feature: str) -> str:
    """What a run must record for `feature` to be measured."""
    if feature.startswith("static."):
        return f"L0 check {feature[7:]} (the job's config and a data sample)"
    if feature == "static_fail_count":
        return "L0 checks (the job's config and a data sample)"
    return _NEEDED_BY.get(feature, f"feature {feature}")


def features(evidence: Evidence) -> Features:
    """Every feature the evidence supports, by name."""
    out: Features = {}
    for part in (
        _loss,
        _divergence,
        _gradients,
        _parameters,
        _step_scan,
        _heldout_oscillation,
        _architecture,
        _eval,
        _eval_against_heldout,
        _step_cadence,
        _efficiency,
        _obvious,
        _lr_as_declared,
        _lr_sign,
        _settings_as_declared,
        _config,
        _static,
        _decay_pull,
    ):
        part(evidence, out)
    return out
