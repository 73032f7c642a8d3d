"""The invariants' false alarms on healthy runs and what they see on the corpus's faults (python -m
bench.corpus.invariant_rates): diag/invariants.py through the probe's hooks
(runner/job/invariant_hooks.py, via bench/corpus/watch.py, every step read; the checks that need
the probe's step scan, PROBE_CHECKS, from the probe's own L0 record) on the corpus app,
every distinct clean twin on seeds 0 and 1, and the Hugging Face Trainer app of
tests/apps/hf_gpt2 (the healthy populations), and every row's fault on seed 0. Writes
results/invariants.json and .md.

Read with care: the invariants were written knowing the whole corpus (both halves), so what
they see on its faults is in-sample; the false-alarm rate on the clean twins is the figure
that sets nothing.
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path

import torch

from bench.corpus.apps.loop.train import fit
from bench.corpus.compose import app_config
from bench.corpus.schema import load_corpus
from bench.corpus.watch import InvariantWatch
from hyprun.diag.live_checks import read_l0_tags

RESULTS = Path(__file__).with_name("results")
SEEDS = (0, 1)
PROBE_CHECKS = (
    "unshuffled_data",
    "probabilities_into_cross_entropy",
    "labels_misaligned",
    "accumulation_loss_scale",
    "clip_ineffective",
    "repeated_batch",
    "loss_on_padding",
    "softmax_wrong_dim",
    "functional_dropout_in_eval",
    "causal_mask_missing",
    "loss_divided_twice",
    "accumulation_grads_discarded",
    "adam_eps",
    "dropout_rate",
    "warmup_never_ends",
    "updates_below_precision",
    "symmetric_init",
    "adam_coupled_decay",
    "residual_connection_dropped",
    "activation_missing",
    "norm_gains_small",
    "optimizer_state_reset",
    "sublayer_output_discarded",
    "weights_overwritten",
    "optimizer_step_missing",
    "steps_without_backward",
    "padding_idx_on_real_token",
    "layer_weights_shared",
    "freeze_set_on_module",
    "modules_not_registered",
    "tied_head_untied",
    "scheduler_stepped_before_optimizer",
    "scheduler_outpaces_optimizer",
    "scheduler_stepped_off_period",
    "eval_counts_untrained_targets",
    "run_ended_early",
    "adam_eps_dominates",
    "adam_step_beyond_bound",
    "gradient_along_weights",
    "dropout_rate_changed",
    "ema_update_wrong",
    "ema_updated_per_micro_batch",
    "rows_repeat_within_epoch",
    "frozen_weights_decayed",
    "batch_index_encoded",
    "dropout_on_residual_stream",
    "dropout_not_as_declared",
    "module_called_for_its_twin",
    "loss_reads_scaled_logits",
    "decay_restarts_after_warmup",
    "warmup_starts_at_zero",
    "adam_moments_misweighted",
    "padding_attended",
    "attention_scale_wrong",
    "attention_rows_unnormalised",
    "logits_nonnegative",
    "loss_summed",
    "dropout_scale_wrong",
    "heldout_overlap",
    "label_smoothing_wrong",
    "labels_shuffled_apart",
    "batch_first_mismatch",
    "token_ids_overflow",
    "real_token_masked_as_padding",
)
"""Checks read from the probe's L0 record (they need its step scan, its loss reads or the live
optimizer and model); a fail or a warning on a healthy run is a false alarm."""
STREAM_GAPS: dict[str, float] = {}
"""By run: the fair-stream check's mean first-epoch gap (its healthy reference)."""
MEASURED = (
    "updates_below_precision",
    "adam_eps_dominates",
    "adam_step_beyond_bound",
    "gradient_along_weights",
    "rows_repeat_within_epoch",
    "loss_reads_scaled_logits",
)
"""Probe checks that judge one measured number against a cut: their healthy values show the
margin (a share left unchanged, a share under eps, the largest step over Adam's bound, a median
cosine, a distinct share, the loss's factor on the logits)."""
VALUES: dict[str, dict[str, float]] = {}
"""By run: each MEASURED check's value where it was judged."""
STATUSES: dict[str, dict[str, str]] = {}
"""By run: each PROBE_CHECKS status (a check skipped on a run is not judged there)."""


class Recorder:
    """An in-memory tracker for the probe (no MLflow): the tags it set."""

    run_id = "in-memory"

    def __init__(self):
        self.tags: dict[str, str] = {}

    def set_tags(self, tags: dict) -> None:
        self.tags.update(tags)

    def log_metrics(self, metrics: dict, step: int) -> None:
        pass

    def finish(self, status) -> None:
        pass


def probe_fired(recorder: Recorder, name: str) -> dict[str, list[str]]:
    """PROBE_CHECKS the probe failed, by id; the stream gap kept in STREAM_GAPS[name]."""
    checks = {c["id"]: c for c in read_l0_tags(recorder.tags)}
    gap = checks.get("unshuffled_data", {}).get("value")
    if isinstance(gap, int | float) and math.isfinite(gap):
        STREAM_GAPS[name] = gap
    values = {k: checks.get(k, {}).get("value") for k in MEASURED}
    VALUES[name] = {k: v for k, v in values.items() if isinstance(v, int | float)}
    STATUSES[name] = {k: checks.get(k, {}).get("status", "absent") for k in PROBE_CHECKS}
    failed = [k for k in PROBE_CHECKS if STATUSES[name][k] in ("fail", "warn")]
    return {k: [checks[k]["why"]] for k in failed}


def fired(overrides: list[str], seed: int) -> dict[str, list[str]]:
    """The invariants a run of the loop app breaks: {invariant: [where, ...]}."""
    cfg = app_config("loop", [*overrides, f"seed={seed}"])
    watches: list[InvariantWatch] = []
    recorder = Recorder()

    def attach(model, optimizer) -> None:
        watches.append(InvariantWatch(model, optimizer))

    fit(cfg, probe=True, attach=attach, tracker=recorder)
    found = watches[0].violations(cfg.train.steps)
    out = {name: [v.where for v in found[name]] for name in found if found[name]}
    return out | probe_fired(recorder, f"loop {' '.join(overrides) or 'default'} seed={seed}")


LOOP_CONFIGS = (
    ["train.ema=0.99"],
    ["train.ema=0.999", "train.accum=4", "train.batch=4"],
    ["sched.name=plateau"],
)
"""Healthy shapes of the loop app no corpus twin has: an EMA of the weights kept beside
training (the EMA checks' healthy population), alone and under 4-step accumulation; and
ReduceLROnPlateau stepped at each evaluation (a scheduler stepped every few optimizer steps:
the default's per-epoch StepLR steps once in the run, too few for its period to be read)."""

HF_CONFIGS = (
    [],
    ["training.lr_scheduler_type=linear", "+training.gradient_accumulation_steps=2"],
)
"""The Hugging Face Trainer app of tests/apps/hf_gpt2 (a foreign healthy population): as it
ships, and with a decaying schedule under gradient accumulation."""


def fired_hf(overrides: list[str], seed: int) -> dict[str, list[str]]:
    """The invariants a run of tests/apps/hf_gpt2 breaks, the watch attached by a callback."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf
    from transformers import (
        GPT2Config,
        GPT2LMHeadModel,
        Trainer,
        TrainerCallback,
        TrainingArguments,
        set_seed,
    )

    from hyprun.runner.job.callbacks import HyprunTrainerCallback
    from tests.apps.hf_gpt2.train import Sequences, markov_tokens

    conf = Path(__file__).resolve().parents[2] / "tests/apps/hf_gpt2/conf"
    with initialize_config_dir(str(conf), version_base="1.3"):
        cfg = compose("train", overrides=[*overrides, f"seed={seed}"])
    watches: list[InvariantWatch] = []

    class Attach(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
            watches.append(InvariantWatch(model, getattr(optimizer, "optimizer", optimizer)))

    set_seed(seed)
    d = cfg.data
    model = GPT2LMHeadModel(GPT2Config(vocab_size=d.vocab_size, n_positions=d.seq_len, **cfg.model))
    training = OmegaConf.to_container(cfg.training, resolve=True)
    training.update(report_to=[], save_strategy="no")
    folder = tempfile.mkdtemp(prefix="hyprun-inv-hf-")
    args = TrainingArguments(output_dir=folder, seed=seed, data_seed=d.seed, **training)
    recorder = Recorder()
    epoch = d.n_train // (args.per_device_train_batch_size * args.gradient_accumulation_steps)
    probe = HyprunTrainerCallback(every_steps=cfg.probe_every, epoch_steps=epoch, tracker=recorder)
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=Sequences(
            markov_tokens(d.vocab_size, d.seq_len, d.n_train, d.seed, d.follow)
        ),
        eval_dataset=Sequences(
            markov_tokens(d.vocab_size, d.seq_len, d.n_eval, d.eval_seed, d.follow)
        ),
        callbacks=[Attach(), probe],
    )
    trainer.train()
    found = watches[0].violations(cfg.training.max_steps)
    out = {name: [v.where for v in found[name]] for name in found if found[name]}
    return out | probe_fired(recorder, f"hf_gpt2 {' '.join(overrides) or 'as shipped'} seed={seed}")


def judged_counts(statuses: dict[str, dict[str, str]]) -> list[tuple[str, tuple[int, int]]]:
    """Per probe check: on how many healthy runs it was judged (not skipped), how many raised."""
    counts = []
    for check in PROBE_CHECKS:
        seen = [run[check] for run in statuses.values()]
        raised = sum(s in ("fail", "warn") for s in seen)
        counts.append((check, (sum(s in ("pass", "fail", "warn") for s in seen), raised)))
    return counts


def main() -> int:
    torch.set_num_threads(1)
    rows = load_corpus().rows
    healthy, faults = {}, {}
    bases = dict.fromkeys([*(tuple(row.twin_overrides) for row in rows), *map(tuple, LOOP_CONFIGS)])
    for base in bases:
        for seed in SEEDS:
            healthy[f"{' '.join(base) or 'default'} seed={seed}"] = fired(list(base), seed)
    for overrides in HF_CONFIGS:
        for seed in SEEDS:
            healthy[f"hf_gpt2 {' '.join(overrides) or 'as shipped'} seed={seed}"] = fired_hf(
                overrides, seed
            )
    healthy_gaps, healthy_statuses = dict(STREAM_GAPS), dict(STATUSES)
    healthy_values = dict(VALUES)
    for row in rows:
        faults[row.id] = fired(row.fault_overrides, 0)
    alarms = {name: sum(bool(f) for f in healthy.values()) for name in ("any",)}
    lines = [
        "# Invariants on the corpus app",
        "",
        f"- healthy runs with any violation: {alarms['any']} of {len(healthy)}",
        "",
        "| healthy run | violations |",
        "| --- | --- |",
        *(f"| {k} | {', '.join(v) or 'none'} |" for k, v in healthy.items()),
        "",
        "| probe check | healthy runs judged | of them raised (fail or warn) |",
        "| --- | --- | --- |",
        *(
            f"| {k} | {judged} | {failed} |"
            for k, (judged, failed) in judged_counts(healthy_statuses)
        ),
        "",
        "| healthy run | fair-stream gap (mean, first epoch) |",
        "| --- | --- |",
        *(f"| {k} | {v:+.4f} |" for k, v in healthy_gaps.items()),
        "",
        f"| healthy run | {' | '.join(MEASURED)} |",
        f"| --- |{' --- |' * len(MEASURED)}",
        *(
            f"| {k} | {' | '.join(f'{v[c]:.3g}' if c in v else '-' for c in MEASURED)} |"
            for k, v in healthy_values.items()
        ),
        "",
        "A fault that diverges shows eval_mode_while_evaluating here: the watch sees the probe's",
        "NaN replay (a no-grad forward in train mode), which the probe's own check excludes.",
        "",
        "| fault (seed 0) | invariants broken |",
        "| --- | --- |",
        *(f"| {k} | {', '.join(v) or 'none'} |" for k, v in faults.items()),
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "invariants.md").write_text(text)
    (RESULTS / "invariants.json").write_text(
        json.dumps(
            {
                "healthy": healthy,
                "faults": faults,
                "stream_gaps": healthy_gaps,
                "measured": healthy_values,
                "probe_statuses": healthy_statuses,
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
