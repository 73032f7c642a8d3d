"""The run-long invariants the probe reads (runner/job/invariant_hooks.py -> diag/live_checks.py):
each check on crafted facts, then one real loop per invariant with its bug planted, a healthy
loop that passes them all, and the diagnosis naming the corpus cause id."""

from __future__ import annotations

import os

import pytest
import torch
from mlflow.tracking import MlflowClient
from torch import nn

from hyprun.diag.evidence import Evidence
from hyprun.diag.live_checks import LiveFacts, live_checks, read_l0_tags
from hyprun.diag.triage import triage
from hyprun.runner.job.probe import Probe

STEPS = 8


def by_id(facts: LiveFacts) -> dict[str, str]:
    return {c.id: c.status for c in live_checks(facts)}


def healthy_facts(**changes) -> LiveFacts:
    facts = LiveFacts(optimizer="AdamW", peak_lr=1e-3, first_lr=1e-4, second_lr=2e-4)
    facts.stale_grads = {0: 0.0, 1: 0.0, 2: 0.0}
    facts.trainable_elements = facts.total_elements = 1000
    for name, value in changes.items():
        setattr(facts, name, value)
    return facts


def test_each_invariant_check_passes_healthy_facts_and_fails_the_violated_one():
    healthy = by_id(healthy_facts())
    assert healthy["grads_not_reset"] == healthy["eval_mode_in_training"] == "pass"
    assert healthy["eval_in_train_mode"] == healthy["params_frozen"] == "pass"
    assert healthy["lr_schedule_collapse"] == healthy["replicas_disagree"] == "skip"
    assert by_id(healthy_facts(stale_grads={0: 0.0, 1: 0.3}))["grads_not_reset"] == "fail"
    assert healthy["accumulation_grads_discarded"] == "skip"  # no step of several backwards
    kept = healthy_facts(emptied_grads={0: (0, 4), 1: (1, 4)})  # one tensor's gradient was 0
    assert by_id(kept)["accumulation_grads_discarded"] == "pass"
    emptied = healthy_facts(emptied_grads={0: (0, 4), 1: (4, 4)})
    assert by_id(emptied)["accumulation_grads_discarded"] == "fail"
    assert by_id(healthy_facts(eval_at_train=["drop"]))["eval_mode_in_training"] == "fail"
    assert by_id(healthy_facts(train_at_eval=["drop"]))["eval_in_train_mode"] == "fail"
    assert by_id(healthy_facts(trainable_elements=10))["params_frozen"] == "warn"  # 99% frozen
    decayed = [1e-3 * 0.1**step for step in range(STEPS)]  # per-batch decay of a per-epoch one
    collapse = healthy_facts(lrs=decayed, total_steps=100)
    assert by_id(collapse)["lr_schedule_collapse"] == "fail"
    cosine = healthy_facts(lrs=[1e-3] * 50 + [1e-5] * 50, total_steps=100)  # late: allowed
    assert by_id(cosine)["lr_schedule_collapse"] == "pass"
    assert by_id(healthy_facts(replica_checksums=[1.0, 1.0]))["replicas_disagree"] == "pass"
    assert by_id(healthy_facts(replica_checksums=[1.0, 1.5]))["replicas_disagree"] == "fail"


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 1))

    detached = False
    """On: the hidden layer's output is detached, so the first layer gets no gradient."""

    def forward(self, x, y):
        hidden = self.body[:3](x)
        out = self.body[3](hidden.detach() if self.detached else hidden)
        return nn.functional.mse_loss(out, y)


def loop(uri: str, bug: str = "", total_steps: int | None = None) -> dict[str, dict]:
    """A plain loop with one bug planted; the L0 checks the probe recorded, by id."""
    model = Net()
    model.detached = bug == "hidden_detached"
    if bug == "constant_init":  # one value for every weight and bias: the units never differ
        for layer in (model.body[0], model.body[3]):
            nn.init.constant_(layer.weight, 0.1)
            nn.init.zeros_(layer.bias)
        model.body[2].p = 0.0  # dropout's noise would tell the units apart
    dtype = torch.bfloat16 if bug == "bf16_weights" else torch.float32
    model.to(dtype)  # bf16 weights and a plain optimizer: no fp32 master copy
    optimizer = (
        torch.optim.AdamW(model.parameters(), lr=1e-4)  # a fine-tuning LR
        if bug == "bf16_weights"
        else torch.optim.SGD(model.parameters(), lr=0.05)
    )
    step_size = 1 if bug == "scheduler_per_batch" else 100
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size, gamma=0.01)
    if bug == "warmup_as_long_as_run":  # a warmup sized in samples, read as steps
        warmup = STEPS * 4
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: (s + 1) / warmup)
    probe = Probe(model, optimizer, step_unit="steps", every_steps=4, total_steps=total_steps)
    rng = torch.Generator().manual_seed(1)
    for step in range(STEPS):
        x = torch.randn(4, 8, generator=rng).to(dtype)
        for _ in range(2):  # two accumulation micro-batches: the second adds on purpose
            if bug == "accum_grads_zeroed":  # zero_grad inside the micro-batch loop (RAE#67)
                optimizer.zero_grad()
            loss = model(x, x.sum(1, keepdim=True)) / 2
            loss.backward()
        probe.after_backward(loss)
        optimizer.step()
        if bug != "zero_grad_missing":
            optimizer.zero_grad()
        schedule.step()
        if step == 1:  # an evaluation
            if bug != "eval_without_eval_mode":
                model.eval()
            with torch.no_grad():
                model(x, x.sum(1, keepdim=True))
            if bug != "eval_mode_left_on":
                model.train()
    probe.close()
    tags = MlflowClient(uri).get_run(probe.run_id).data.tags
    return {c["id"]: c for c in read_l0_tags(tags)}


INVARIANTS = [
    "grads_not_reset",
    "accumulation_grads_discarded",
    "eval_mode_in_training",
    "eval_in_train_mode",
    "warmup_never_ends",
    "updates_below_precision",
    "symmetric_init",
]


def test_a_healthy_loop_with_accumulation_and_evaluation_breaks_no_invariant(uri):
    checks = loop(uri, total_steps=STEPS)
    statuses = {k: checks[k]["status"] for k in [*INVARIANTS, "lr_schedule_collapse"]}
    assert set(statuses.values()) == {"pass"}, statuses
    assert checks["params_frozen"]["status"] == "pass"


@pytest.mark.parametrize(
    ("bug", "check"),
    [
        ("zero_grad_missing", "grads_not_reset"),
        ("accum_grads_zeroed", "accumulation_grads_discarded"),
        ("eval_mode_left_on", "eval_mode_in_training"),
        ("eval_without_eval_mode", "eval_in_train_mode"),
        ("scheduler_per_batch", "lr_schedule_collapse"),
        ("warmup_as_long_as_run", "warmup_never_ends"),
        ("bf16_weights", "updates_below_precision"),
        ("constant_init", "symmetric_init"),
    ],
)
def test_each_planted_bug_fails_its_own_check_and_only_it(uri, bug, check):
    checks = loop(uri, bug, total_steps=STEPS)
    assert checks[check]["status"] == "fail", checks[check]
    others = [k for k in [*INVARIANTS, "lr_schedule_collapse"] if k != check]
    assert all(checks[k]["status"] == "pass" for k in others), {k: checks[k] for k in others}


def test_parameters_off_the_loss_path_are_counted_by_their_share_of_the_elements(uri):
    """A detached hidden layer gets no gradient: the L0 check warns with its share of the
    trainable elements (the first layer's 144 of 161), not just how many tensors."""
    checks = loop(uri, "hidden_detached")
    reach = checks["gradient_reach"]
    assert reach["status"] == "warn" and reach["value"] == pytest.approx(144 / 161)
    assert "body.0.weight" in reach["why"] and "89.4%" in reach["why"]
    assert loop(uri)["gradient_reach"]["status"] == "pass"


def test_the_schedule_check_is_skipped_without_the_budget(uri):
    assert loop(uri, "scheduler_per_batch")["lr_schedule_collapse"]["status"] == "skip"


def test_a_failed_invariant_is_a_finding_named_by_the_corpus_cause_id():
    checks = [c.__dict__ for c in live_checks(healthy_facts(stale_grads={0: 0.0, 1: 0.3}))]
    diagnosis = triage(Evidence(static=checks))
    assert diagnosis.findings[0].id == "grads_not_reset"
    # zero_grad() leaves a parameter outside the optimizer alone: the cause ranks first
    both = healthy_facts(stale_grads={0: 0.0, 1: 0.3}, missing_from_optimizer=["head.w"])
    findings = triage(Evidence(static=[c.__dict__ for c in live_checks(both)])).findings
    assert [f.id for f in findings] == ["params_not_in_optimizer", "grads_not_reset"]
    frozen = [c.__dict__ for c in live_checks(healthy_facts(trainable_elements=10))]
    assert not triage(Evidence(static=frozen)).findings  # a warning alone is no finding
    emptied = healthy_facts(emptied_grads={0: (4, 4)})
    checks = [c.__dict__ for c in live_checks(emptied)]
    assert triage(Evidence(static=checks)).findings[0].id == "accumulation_grads_discarded"


def test_mostly_frozen_is_a_finding_only_with_the_flat_loss_it_predicts():
    frozen = [c.__dict__ for c in live_checks(healthy_facts(trainable_elements=10))]
    falling = [(step, 4.0 * 0.9**step) for step in range(20)]  # dropped 85%
    flat = [(step, 4.0 - 0.01 * step) for step in range(20)]  # dropped 5%
    ids = [
        [f.id for f in triage(Evidence(static=frozen, series={"train/loss": loss})).findings]
        for loss in (falling, flat)
    ]
    assert "params_frozen" not in ids[0] and ids[1][0] == "params_frozen"


def _probe_on_rank(rank: int, init_file: str, uri: str, out: str) -> None:
    os.environ["MLFLOW_TRACKING_URI"] = uri
    torch.distributed.init_process_group("gloo", f"file://{init_file}", rank=rank, world_size=2)
    statuses = []
    for wrapped in (True, False):  # DDP all-reduces the gradients; a bare model steps alone
        net = Net()
        model = nn.parallel.DistributedDataParallel(net) if wrapped else net
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        probe = Probe(model, optimizer, step_unit="steps", every_steps=0)
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(rank))  # rank's own data
        for _ in range(2):
            model(x, x.sum(1, keepdim=True)).backward()
            probe.after_backward()
            optimizer.step()
            optimizer.zero_grad()
        probe.close()
        if rank == 0:
            tags = MlflowClient(uri).get_run(probe.run_id).data.tags
            checks = {c["id"]: c["status"] for c in read_l0_tags(tags)}
            statuses.append(checks["replicas_disagree"])
    if rank == 0:
        torch.save(statuses, out)
    torch.distributed.barrier()  # neither rank tears gloo down while the other still reads
    torch.distributed.destroy_process_group()


def test_the_probe_compares_replicas_after_the_first_step_in_two_gloo_processes(workdir, uri):
    out = str(workdir / "statuses.pt")
    args = (str(workdir / "init-probe"), uri, out)
    torch.multiprocessing.spawn(_probe_on_rank, args=args, nprocs=2)
    assert torch.load(out) == ["pass", "fail"]  # with DDP, then without


def stream(gap: float, steps: range) -> list[tuple[int, float, float]]:
    """Reads whose training loss sits `gap` (a share) below a held-out loss of 2.0."""
    return [(step, 2.0 * (1 - gap), 2.0) for step in steps]


def test_the_fair_stream_check_reads_the_first_epoch_only():
    fair = healthy_facts(stream=stream(0.01, range(0, 64, 8)), epoch_steps=64)
    assert by_id(fair)["unshuffled_data"] == "pass"
    assert (
        by_id(healthy_facts(stream=stream(0.4, range(0, 64, 8)), epoch_steps=64))["unshuffled_data"]
        == "fail"
    )
    # after the first epoch a training loss below the held-out one is fitting, not a bad stream
    late = stream(0.0, range(0, 64, 16)) + stream(0.4, range(64, 256, 16))
    assert by_id(healthy_facts(stream=late, epoch_steps=64))["unshuffled_data"] == "pass"
    unknown = healthy_facts(stream=stream(0.4, range(0, 64, 8)))  # no epoch length told
    assert by_id(unknown)["unshuffled_data"] == "skip"


def test_the_loss_input_check_fails_probabilities_and_passes_logits():
    assert by_id(healthy_facts())["probabilities_into_cross_entropy"] == "skip"  # none read
    logits = healthy_facts(loss_inputs=[(-4.2, 6.1, 3.5)])
    assert by_id(logits)["probabilities_into_cross_entropy"] == "pass"
    probabilities = healthy_facts(loss_inputs=[(0.002, 0.15, 2e-7)])
    assert by_id(probabilities)["probabilities_into_cross_entropy"] == "fail"


CLASSES, FEATURES, TRAIN, HELDOUT, BATCH = 4, 8, 1024, 4096, 32


def classifier_loop(uri: str, bug: str = "") -> dict[str, dict]:
    """A 4-class classifier trained one epoch under the probe, with batches large enough that
    their losses are tight estimates (the fair-stream check compares them);
    `sorted`: the data stored by class and not shuffled; `softmax`: probabilities into
    cross-entropy; `relu`: logits clamped at 0 before it. The L0 checks the probe recorded, by
    id."""
    torch.manual_seed(0)
    centres = torch.randn(CLASSES, FEATURES) * 2
    labels = torch.randint(0, CLASSES, (TRAIN + HELDOUT,))
    x = centres[labels] + torch.randn(TRAIN + HELDOUT, FEATURES) * 2
    train_x, train_y, heldout = x[:TRAIN], labels[:TRAIN], (x[TRAIN:], labels[TRAIN:])
    order = torch.argsort(train_y, stable=True) if bug == "sorted" else torch.randperm(TRAIN)
    model = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, CLASSES))

    def loss_fn(net, batch):
        scores = net(batch[0])
        scores = scores.softmax(-1) if bug == "softmax" else scores
        scores = scores.relu() if bug == "relu" else scores  # pytorch/tutorials PR 1644
        return nn.functional.cross_entropy(scores, batch[1])

    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = Probe(
        model,
        optimizer,
        step_unit="steps",
        every_steps=4,
        heldout=heldout,
        loss_fn=loss_fn,
        epoch_steps=32,
    )
    for rows in order.split(BATCH):
        loss = loss_fn(model, (train_x[rows], train_y[rows]))
        loss.backward()
        probe.after_backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    probe.close()
    tags = MlflowClient(uri).get_run(probe.run_id).data.tags
    return {c["id"]: c for c in read_l0_tags(tags)}


def test_a_real_loop_fails_the_fair_stream_check_only_when_its_data_is_in_order(uri):
    fair, ordered = classifier_loop(uri), classifier_loop(uri, "sorted")
    assert fair["unshuffled_data"]["status"] == "pass", fair["unshuffled_data"]
    assert ordered["unshuffled_data"]["status"] == "fail", ordered["unshuffled_data"]
    assert ordered["probabilities_into_cross_entropy"]["status"] == "pass"


def test_a_real_loop_fails_the_loss_input_check_only_with_softmax_before_cross_entropy(uri):
    fair, twice = classifier_loop(uri), classifier_loop(uri, "softmax")
    assert fair["probabilities_into_cross_entropy"]["status"] == "pass"
    assert twice["probabilities_into_cross_entropy"]["status"] == "fail"
    assert twice["unshuffled_data"]["status"] == "pass"


def test_logits_through_a_relu_fail_the_sign_check_and_free_logits_or_probabilities_do_not(uri):
    fair, clamped = classifier_loop(uri), classifier_loop(uri, "relu")
    assert fair["logits_nonnegative"]["status"] == "pass"
    assert clamped["logits_nonnegative"]["status"] == "fail", clamped["logits_nonnegative"]
    assert clamped["probabilities_into_cross_entropy"]["status"] == "pass"
    twice = classifier_loop(uri, "softmax")  # probabilities: the other check's, not this one's
    assert twice["logits_nonnegative"]["status"] == "pass"


def test_probabilities_into_cross_entropy_outranks_the_flat_loss_it_causes():
    checks = [c.__dict__ for c in live_checks(healthy_facts(loss_inputs=[(0.0, 0.2, 1e-7)]))]
    flat = [(step, 3.87 - 0.001 * step) for step in range(40)]  # as double_softmax's loss
    small_steps = [(step, 1e-3) for step in range(0, 40, 4)]
    series = {"train/loss": flat, "param/update_ratio": small_steps}
    findings = triage(Evidence(static=checks, series=series)).findings
    assert findings[0].id == "probabilities_into_cross_entropy", [f.id for f in findings]
    assert "loss_flat" in [f.id for f in findings[1:]]  # the harm it causes, ranked below


def test_the_warmup_reach_lost_update_and_symmetry_checks_judge_their_facts_and_become_findings():
    set_lr = healthy_facts().peak_lr
    endless = [set_lr * (step + 1) / 200 for step in range(60)]  # a warmup of 200 steps in 100
    assert by_id(healthy_facts(lrs=endless, total_steps=100))["warmup_never_ends"] == "fail"
    warmed = [set_lr * min(1.0, (step + 1) / 10) for step in range(60)]
    assert by_id(healthy_facts(lrs=warmed, total_steps=100))["warmup_never_ends"] == "pass"
    swapped = [set_lr * (step + 1) / 100 for step in range(60)]  # warmup and run swapped
    assert by_id(healthy_facts(lrs=swapped, total_steps=100))["warmup_never_ends"] == "fail"
    a_fifth = [set_lr * min(1.0, (step + 1) / 20) for step in range(60)]  # over 20% of the run
    assert by_id(healthy_facts(lrs=a_fifth, total_steps=100))["warmup_never_ends"] == "pass"
    early = healthy_facts(lrs=endless[:25], total_steps=100)  # the first quarter not done
    assert by_id(early)["warmup_never_ends"] == "skip"
    assert by_id(healthy_facts(lost_updates=(0, 1000)))["updates_below_precision"] == "pass"
    assert by_id(healthy_facts(lost_updates=(900, 1000)))["updates_below_precision"] == "fail"
    for facts, finding in [
        (healthy_facts(lrs=endless, total_steps=100), "warmup_never_ends"),
        (healthy_facts(lost_updates=(900, 1000)), "updates_below_precision"),
        (healthy_facts(symmetric=["body.0.weight"]), "symmetric_init"),
    ]:
        checks = [c.__dict__ for c in live_checks(facts)]
        assert [f.id for f in triage(Evidence(static=checks)).findings] == [finding]


def test_a_later_write_of_fewer_chunks_reads_alone():
    """A run's checks are logged again as it goes; tags are never deleted, so a later write of
    fewer chunks leaves the earlier one's last chunk behind, which the count leaves out."""
    from hyprun.diag.live_checks import l0_tags

    long = [{"id": f"check_{i}", "why": "x" * 500} for i in range(30)]  # three chunks
    short = [{"id": "only", "why": "y" * 8000}]  # two
    run_tags = {**l0_tags(long), **l0_tags(short)}  # as MLflow keeps them: the later wins
    assert len([k for k in run_tags if k.startswith("hyprun.l0_checks")]) == 4
    assert read_l0_tags(run_tags) == short
    del run_tags["hyprun.l0_checks.chunks"]  # a run recorded before the count: read as before
    assert read_l0_tags(run_tags) == []
