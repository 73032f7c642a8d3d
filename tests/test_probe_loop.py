"""The probe in a hand-written PyTorch loop and in a loop around a DeepSpeed engine: the same
numbers as the built-in job's probes (the pre-clipping gradient norm, also under ZeRO), data
wait measured, bad settings refused."""

from __future__ import annotations

import time

import pytest
import torch
from mlflow.tracking import MlflowClient

from hyprun.diag.live_checks import read_l0_tags
from hyprun.diag.probes import STEP_MULTIPLES, ProbeSchedule, StepScan
from hyprun.runner.job.models import GPT
from hyprun.runner.job.probe import Probe, lm_vocab
from tests.helpers import metric_history

BATCH, SEQ, VOCAB = 4, 32, 64


def gpt() -> GPT:
    torch.manual_seed(0)
    return GPT(vocab_size=VOCAB, seq_len=SEQ, n_layer=2, n_head=2, d_model=32)


def batches(count: int, delay_s: float = 0.0):
    rng = torch.Generator().manual_seed(1)
    for _ in range(count):
        time.sleep(delay_s)  # an input-bound loader
        x = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=rng)
        yield x[:, :-1], x[:, 1:]


def train(
    steps: int,
    delay_s: float = 0.0,
    evaluate_s: float = 0.0,
    said: bool = False,
    evaluated: bool = False,
    **options,
) -> tuple[Probe, list[float]]:
    """A user's loop with the two probe lines; returns the probe and clip_grad_norm_'s norms.
    `evaluate_s`: the loop's own work after each step, `said`: the loop then tells the probe
    it was not waiting for data, `evaluated`: that work ends with a forward without gradients
    (an evaluation), which tells the probe by itself."""
    model = gpt()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    probe = Probe(model, optimizer, **options)
    norms = []
    for x, y in batches(steps, delay_s):
        loss = model(x, y)
        loss.backward()
        probe.after_backward(loss)
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)))
        optimizer.step()
        optimizer.zero_grad()
        time.sleep(evaluate_s)
        if evaluated:
            with torch.no_grad():
                model(x, y)
        if said:
            probe.not_waiting()
    probe.close()
    return probe, norms


def test_plain_loop_logs_the_jobs_metrics_at_token_steps(uri):
    probe, norms = train(6, every_steps=2, flops_per_token=1e6)
    tokens = BATCH * SEQ
    logged = dict(metric_history(uri, probe.run_id, "grad/norm"))
    assert list(logged) == [tokens, 3 * tokens, 5 * tokens]
    assert list(logged.values()) == pytest.approx(norms[::2], rel=1e-5)
    for key in ("act/write_ratio/blocks.1", "param/update_ratio", "grad/norm/tok_emb"):
        assert [s for s, _ in metric_history(uri, probe.run_id, key)] == list(logged), key
    flops = metric_history(uri, probe.run_id, "perf/flops_per_s")
    speed = metric_history(uri, probe.run_id, "perf/tokens_per_s")
    assert [f for _, f in flops] == pytest.approx([1e6 * s for _, s in speed])
    run = MlflowClient(tracking_uri=uri).get_run(probe.run_id)
    assert run.info.status == "FINISHED" and run.data.tags["hyprun.blocks"] == "blocks"
    assert run.data.tags["hyprun.flops_per_token"].startswith("1e+06 (given)")


def test_data_wait_share_sees_a_slow_loader(uri):
    fast, _ = train(6, every_steps=0)
    slow, _ = train(6, delay_s=0.1, every_steps=0)

    def waits_s(probe: Probe) -> list[float]:
        """Seconds waited per step (share x step time), after the first step's start-up."""
        share = metric_history(uri, probe.run_id, "perf/data_wait_frac")[1:]
        step = metric_history(uri, probe.run_id, "perf/step_time_s")[1:]
        return [w * s for (_, w), (_, s) in zip(share, step, strict=True)]

    assert min(waits_s(slow)) >= 0.1  # the loader's sleep, at least: load only adds to it
    assert sorted(waits_s(fast))[2] < 0.03


def test_a_loops_own_work_between_steps_is_not_data_wait_once_it_says_so(uri):
    """Work between steps counts as waiting unless the loop says it ended (the HF and Lightning
    callbacks do, after evaluating, saving and logging) or evaluates: a forward without
    gradients ends the wait by itself."""
    unsaid, _ = train(6, evaluate_s=0.1, every_steps=0)
    said, _ = train(6, evaluate_s=0.1, said=True, every_steps=0)
    evaluated, _ = train(6, evaluate_s=0.1, evaluated=True, every_steps=0)
    unsaid_waits = metric_history(uri, unsaid.run_id, "perf/data_wait_frac")[1:]
    assert min(w for _, w in unsaid_waits) > 0.5  # 0.1 s of a step of ~0.1 s plus compute
    for quiet in (said, evaluated):  # said, or shown by a forward without gradients
        waits = metric_history(uri, quiet.run_id, "perf/data_wait_frac")[1:]
        assert sorted(w for _, w in waits)[2] < 0.1


def test_steps_as_the_unit_when_declared(uri):
    probe, _ = train(3, every_steps=0, step_unit="steps")
    assert [s for s, _ in metric_history(uri, probe.run_id, "train/loss")] == [1, 2, 3]


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"step_unit": "epochs"}, "step_unit='epochs' is unknown"),
        ({"log_every_steps": 0}, "need every_steps >= 0 and log_every_steps >= 1"),
        ({"max_overhead": 2.0}, "need 0 <= max_overhead < 1"),
        ({"pad_id": "<pad>"}, "need the integer token id that pads"),
    ],
)
def test_bad_settings_are_refused_before_any_run(uri, workdir, options, expected):
    with pytest.raises(ValueError, match=expected):
        Probe(gpt(), **options)
    assert not (workdir / "mlflow.db").exists()


@pytest.mark.parametrize("stage", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_grad_norm_under_zero_equals_the_unsharded_one(uri, stage):
    import deepspeed

    from hyprun.runner.job import dist

    dist.init()
    model = gpt()
    engine, *_ = deepspeed.initialize(
        model=model,
        optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2),
        config={
            "train_micro_batch_size_per_gpu": BATCH,
            "gradient_clipping": 0.1,
            "zero_optimization": {"stage": stage},
        },
    )
    probe = Probe(engine.module, every_steps=1)
    for x, y in batches(2):
        loss = engine(x, y)
        engine.backward(loss)
        probe.after_backward(loss)
        engine.step()
        probe.after_step()
    probe.close()

    reference = gpt()
    x, y = next(batches(1))
    reference(x, y).backward()
    first = float(torch.nn.utils.clip_grad_norm_(reference.parameters(), 1e9))
    norms = metric_history(uri, probe.run_id, "grad/norm")
    assert norms[0] == (BATCH * SEQ, pytest.approx(first, rel=1e-5))


def test_the_step_scan_puts_the_weights_back_bit_for_bit():
    model = gpt()
    params = [p.data for p in model.parameters()]
    taken = [p.clone() for p in params]
    delta = [torch.randn_like(p) * 1e-2 for p in params]
    x, y = next(batches(1))
    before: list[torch.Tensor] = []  # the model checks read the weights before the step

    def read_before() -> None:
        before.extend(p.clone() for p in params)

    losses = StepScan()(model, params, delta, lambda: model(x, y), read_before)
    assert list(losses) == [f"step/loss_x{m:g}" for m in STEP_MULTIPLES]
    assert all(torch.equal(p, t) for p, t in zip(params, taken, strict=True))
    assert losses["step/loss_x1"] == pytest.approx(float(model.eval()(x, y)))
    for old, now, step in zip(before, taken, delta, strict=True):
        assert torch.allclose(old, now - step, atol=1e-6)


def test_probes_past_the_free_ones_wait_while_over_the_overhead_cap():
    free = ProbeSchedule(every_steps=2, max_overhead=0.02, free_probes=2)
    free.spent(3600.0)  # an hour of probing in a run a moment old: far over 2%
    assert [s for s in range(10) if free.due(s)] == [0, 2]  # the free ones, then none
    uncapped = ProbeSchedule(every_steps=2, max_overhead=0.0, free_probes=0)
    uncapped.spent(3600.0)
    assert [s for s in range(10) if uncapped.due(s)] == [0, 2, 4, 6, 8]


class Unused(torch.nn.Module):
    """A GPT beside a layer no forward reaches."""

    def __init__(self):
        super().__init__()
        self.gpt = gpt()
        self.unused = torch.nn.Linear(4, 4)

    def forward(self, x, y):
        return self.gpt(x, y)


def live_run(
    uri: str, model, optimizer, steps: int = 3, clip: float | None = None, schedule=None
) -> dict:
    probe = Probe(model, optimizer, every_steps=0)
    for x, y in batches(steps):
        loss = model(x, y)
        loss.backward()
        probe.after_backward(loss)
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        optimizer.zero_grad()
        if schedule is not None:
            schedule.step()
    probe.close()
    # the store named, not the process's current one (another test may have set it)
    tags = MlflowClient(uri).get_run(probe.run_id).data.tags
    return {c["id"]: c for c in read_l0_tags(tags)}


def test_l0_checks_read_the_live_optimizer_and_model(uri):
    model = Unused()
    late = [p for n, p in model.named_parameters() if n.startswith("gpt.blocks.1.")]
    early = [p for n, p in model.named_parameters() if not n.startswith("gpt.blocks.1.")]
    checks = live_run(uri, model, torch.optim.AdamW(early, lr=1e-3, weight_decay=0.1))
    assert checks["optimizer_coverage"]["status"] == "fail" and late
    assert "gpt.blocks.1." in checks["optimizer_coverage"]["why"]
    assert checks["gradient_reach"]["status"] == "warn"
    assert "unused.weight" in checks["gradient_reach"]["why"]
    assert checks["decay_norms_biases"]["status"] == "warn"  # AdamW decays every group
    assert checks["warmup"]["status"] == "warn"  # a constant LR: full steps from step 0
    assert checks["grad_clip"]["status"] == "skip"  # nothing clipped, nothing told
    assert checks["lr_plausible"]["value"] == 1e-3


def test_a_warmup_and_clipping_are_seen_at_work(uri):
    model = gpt()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ramp = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 10))
    checks = live_run(uri, model, optimizer, clip=1e-3, schedule=ramp)
    assert checks["warmup"]["status"] == "pass" and checks["grad_clip"]["status"] == "pass"
    assert checks["grad_clip"]["value"] == pytest.approx(1e-3, rel=1e-3)  # the norm it left
    assert checks["lr_plausible"]["value"] == 1e-3  # the peak, not the ramp's first LR
    assert checks["optimizer_coverage"]["status"] == checks["gradient_reach"]["status"] == "pass"


def test_a_language_models_vocabulary_is_read_off_its_head_and_a_classifiers_is_not():
    """The vocabulary (for the first loss against ln(vocab)) when the last linear layer maps
    back onto the token embedding's rows; a token classifier ends in a head onto its classes,
    even when a hidden layer happens to be as wide as the vocabulary."""
    assert lm_vocab(gpt()) == VOCAB
    classifier = torch.nn.Sequential(
        torch.nn.Embedding(VOCAB, 16), torch.nn.Linear(16, VOCAB), torch.nn.Linear(VOCAB, 4)
    )
    assert lm_vocab(classifier) is None
    assert lm_vocab(torch.nn.Linear(8, 8)) is None  # no embedding
