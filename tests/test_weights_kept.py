"""Three invariants of what trains (diag/invariants.py outputs_unused, weights_overwritten,
steps_without_backward).

A module the training forward runs passes a gradient to its parameters, unless its output is
thrown away (theislab/CellFlow PR 296: the feed-forward block's output assigned to the wrong
variable) or cut (a .detach(); a learned position embedding added through its .data:
d2l-ai/d2l-en PR 2121). Only the optimizer writes trained weights between steps, unless
an average is copied in for an evaluation and never restored (harubaru/waifu-diffusion PR 31)
or a resumed checkpoint loads nothing (pytorch/examples#1029: `module.` keys, strict=False).
Each through the probe of a real loop, against its healthy form: a spare head never called, an
EMA swapped in and restored, a checkpoint that loads; the HF GPT-2 passes them. And a backward
runs before each optimizer step, unless step() runs twice on one batch's gradients."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel

from hyprun.diag.evidence import Evidence
from hyprun.diag.live_checks import LiveFacts, live_checks
from hyprun.diag.triage import triage
from hyprun.runner.job.probe import Probe
from tests.helpers import probe_checks

VOCAB, WIDTH, SEQ, STEPS = 32, 16, 12, 8
CHECKS = ("sublayer_output_discarded", "weights_overwritten", "steps_without_backward")


class Net(nn.Module):
    """Embedding, one feed-forward block on a residual stream, a head; `bug` plants a fault."""

    def __init__(self, bug: str = ""):
        super().__init__()
        torch.manual_seed(0)
        self.bug = bug
        self.embed = nn.Embedding(VOCAB, WIDTH, max_norm=1.0 if bug == "max_norm" else None)
        self.up, self.down = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)
        self.spare = nn.Linear(WIDTH, 2)  # built, never called: a pooler, an unused head
        self.positions = nn.Parameter(torch.zeros(1, SEQ, WIDTH))  # learned, no module of its own

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = self.positions.data if self.bug == "positions_data" else self.positions
        h = self.embed(ids) + positions[:, : ids.shape[1]]
        branch = self.down(F.gelu(self.up(h)))
        if self.bug == "discarded":  # CellFlow PR 296: z_ = Dense(z); z_ = Dropout(z)
            branch = F.dropout(h, 0.0, self.training)
        elif self.bug == "detached":
            branch = branch.detach()
        return self.head(h + branch)


def batch(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(VOCAB, (4, SEQ + 1), generator=torch.Generator().manual_seed(seed))
    return tokens[:, :-1], tokens[:, 1:]


def loss_of(model: nn.Module, pair) -> torch.Tensor:
    x, y = pair
    logits = model(x) if not isinstance(model, GPT2LMHeadModel) else model(input_ids=x).logits
    return F.cross_entropy(logits.flatten(0, 1), y.flatten())


def between_steps(bug: str, model: nn.Module, average: nn.Module, step: int) -> None:
    """What the loop does after step `step`: an evaluation with the average every 3 steps, a
    resume from a checkpoint at step 4."""
    if step % 3 == 2 and bug in ("ema_kept", "ema_restored"):
        trained = copy.deepcopy(model.state_dict())
        model.load_state_dict(average.state_dict())  # copy the average in, evaluate
        with torch.no_grad():
            loss_of(model, batch(99))
        if bug == "ema_restored":
            model.load_state_dict(trained)
    if step == 4 and bug == "head_from_embedding":  # a resume fills one tensor from another
        with torch.no_grad():  # (NVIDIA-NeMo/Automodel PR 2511: the head from the embedding)
            model.head.weight.copy_(model.embed.weight)
    if step == 4 and bug in ("resume_prefixed", "resume"):
        saved = copy.deepcopy(model.state_dict())
        if bug == "resume_prefixed":  # saved from a DataParallel wrapper, loaded strict=False
            saved = {f"module.{key}": value for key, value in saved.items()}
        model.load_state_dict(type(model)().state_dict())  # a new process builds it afresh
        model.load_state_dict(saved, strict=bug == "resume")


def statuses(bug: str = "", model: nn.Module | None = None) -> dict[str, str]:
    """The checks' statuses on a probed AdamW loop of STEPS steps with `bug` planted."""
    model = model or Net(bug)
    average = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    probe = Probe(
        model, optimizer, step_unit="steps", every_steps=2, heldout=batch(99), loss_fn=loss_of
    )
    for step in range(STEPS):
        loss = loss_of(model, batch(step))
        loss.backward()
        probe.after_backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        with torch.no_grad():
            for kept, now in zip(average.parameters(), model.parameters(), strict=True):
                kept.lerp_(now, 0.1)
        between_steps(bug, model, average, step)
    probe.close()
    checks = probe_checks(probe.run_id)
    return {check: checks[check]["status"] for check in CHECKS}


@pytest.mark.parametrize(
    "bug, failed",
    [
        ("discarded", "sublayer_output_discarded"),
        ("detached", "sublayer_output_discarded"),
        ("positions_data", "sublayer_output_discarded"),
        ("ema_kept", "weights_overwritten"),
        ("resume_prefixed", "weights_overwritten"),
        ("head_from_embedding", "weights_overwritten"),
    ],
)
def test_each_fault_fails_its_own_check_and_only_it(uri, bug, failed):
    found = statuses(bug)
    assert found.pop(failed) == "fail"
    assert set(found.values()) == {"pass"}


@pytest.mark.parametrize("bug", ["", "ema_restored", "resume", "max_norm"])
def test_healthy_loops_pass_with_a_spare_head_a_restored_average_a_checkpoint_or_max_norm(uri, bug):
    assert statuses(bug) == dict.fromkeys(CHECKS, "pass")


def test_the_hf_gpt2_passes_all_three(uri):
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=VOCAB))
    assert statuses(model=gpt2) == dict.fromkeys(CHECKS, "pass")


@pytest.mark.parametrize(
    "changes, finding",
    [
        ({"output_unused": ["down.weight"]}, "sublayer_output_discarded"),
        ({"weight_rewrites": (2, 5, 7)}, "weights_overwritten"),
        ({"unbacked_steps": [1]}, "steps_without_backward"),
    ],
)
def test_a_violation_is_the_finding_of_its_id(changes, finding):
    facts = LiveFacts(optimizer="AdamW", peak_lr=1e-3, first_lr=1e-4, second_lr=2e-4)
    for name, value in changes.items():
        setattr(facts, name, value)
    checks = [c.__dict__ for c in live_checks(facts)]
    assert [f.id for f in triage(Evidence(static=checks)).findings] == [finding]


def stepped_twice_status(twice: bool) -> str:
    """steps_without_backward on a probed loop whose step() runs once, or twice, per batch."""
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    probe = Probe(
        model, optimizer, step_unit="steps", every_steps=2, heldout=batch(99), loss_fn=loss_of
    )
    for step in range(4):
        loss = loss_of(model, batch(step))
        loss.backward()
        probe.after_backward(loss)
        optimizer.step()
        if twice:  # the loop steps, then a wrapper steps the same gradients again
            optimizer.step()
        optimizer.zero_grad()
    probe.close()
    return probe_checks(probe.run_id)["steps_without_backward"]["status"]


def test_a_second_step_on_the_same_gradients_fails_and_one_step_passes(uri):
    assert (stepped_twice_status(False), stepped_twice_status(True)) == ("pass", "fail")


def test_a_loop_that_never_steps_fails_and_says_so_at_close(uri):
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    probe = Probe(
        model, optimizer, step_unit="steps", every_steps=2, heldout=batch(99), loss_fn=loss_of
    )
    for step in range(4):  # tedlasai/learn2refocus#5: backward, zero_grad, no step()
        loss = loss_of(model, batch(step))
        loss.backward()
        probe.after_backward(loss)
        optimizer.zero_grad()
    probe.close()
    assert probe_checks(probe.run_id)["optimizer_step_missing"]["status"] == "fail"
    assert stepped_twice_status(False) == "pass"  # a loop that steps: the check is not read
