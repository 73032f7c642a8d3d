"""An optimizer that calls itself Adam stepping beyond Adam's own bound (runner/job/adam_step.py;
frgfm/holocron#1, kozistr/pytorch_optimizer PR 308).

Adam's |m_hat| / sqrt(v_hat) is bounded by the betas alone, whatever the gradients. Through the
probe of a plain loop: torch's AdamW and a hand-written AdamW pass; the same hand-written AdamW
with its first moment's bias correction written into the buffer, or both corrections inverted,
fails; SGD and RAdam (whose first steps are not Adam's) are not judged. The bound itself holds
on gradients built to reach it (sparse spikes after silence, geometric decay)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hyprun.runner.job.adam_step import adam_bound
from tests.helpers import probed_checks

VOCAB, SEQ, WIDTH = 256, 32, 64
CHECK = "adam_step_beyond_bound"


class MyAdamW(torch.optim.Optimizer):
    """AdamW as a loop writes it by hand, with torch's state names; `bug`: 'in_place' (the first
    moment bias-corrected in its buffer), 'inverted' (each correction 1 - (1 - beta**t)), or
    'first' / 'second' (that moment's update drops its (1 - beta) weight)."""

    def __init__(self, params, lr: float = 1e-3, bug: str = "") -> None:
        super().__init__(params, {"lr": lr, "betas": (0.9, 0.999), "eps": 1e-8})
        self.bug = bug

    @torch.no_grad()
    def step(self, closure=None) -> None:
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                state = self.state[p]
                if not state:
                    state.update(
                        step=0, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p)
                    )
                state["step"] += 1
                t, m, v = state["step"], state["exp_avg"], state["exp_avg_sq"]
                m.mul_(beta1).add_(p.grad, alpha=1.0 if self.bug == "first" else 1 - beta1)
                v.mul_(beta2).addcmul_(
                    p.grad, p.grad, value=1.0 if self.bug == "second" else 1 - beta2
                )
                if self.bug == "in_place":
                    m_hat, v_hat = m.div_(1 - beta1**t), v / (1 - beta2**t)
                elif self.bug == "inverted":
                    m_hat, v_hat = m / beta1**t, v / beta2**t
                else:
                    m_hat, v_hat = m / (1 - beta1**t), v / (1 - beta2**t)
                p.addcdiv_(m_hat, v_hat.sqrt().add_(group["eps"]), value=-group["lr"])


def batch(seed: int) -> torch.Tensor:
    return torch.randint(VOCAB, (16, SEQ + 1), generator=torch.Generator().manual_seed(seed))


def loss_of(model: nn.Module, rows: torch.Tensor) -> torch.Tensor:
    logits = model(rows[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1), rows[:, 1:].flatten())


def check(optimizer_of) -> dict:
    """The check on 12 steps (probed every 2)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(VOCAB, WIDTH), nn.Linear(WIDTH, VOCAB))
    batches = [batch(seed) for seed in range(12)]
    optimizer = optimizer_of(model.parameters())
    return probed_checks(model, optimizer, loss_of, batches, batch(99))[CHECK]


@pytest.mark.parametrize(
    ("optimizer_of", "status"),
    [
        (lambda params: torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1), "pass"),
        (lambda params: MyAdamW(params), "pass"),
        (lambda params: MyAdamW(params, bug="in_place"), "fail"),
        (lambda params: MyAdamW(params, bug="inverted"), "fail"),
        (lambda params: torch.optim.SGD(params, lr=1e-1), "skip"),
        (lambda params: torch.optim.RAdam(params, lr=1e-3), "skip"),
    ],
    ids=["torch_adamw", "by_hand", "in_place", "inverted", "sgd", "radam"],
)
def test_adam_step_beyond_its_bound_fails(uri, optimizer_of, status):
    read = check(optimizer_of)
    assert read["status"] == status, read


@pytest.mark.parametrize("betas", [(0.9, 0.999), (0.9, 0.95), (0.5, 0.9)])
def test_adam_never_steps_beyond_the_bound(betas):
    """Gradients built to make Adam's ratio large stay under the bound: a spike after silence,
    and, after silence long enough for the bias corrections to fade, gradients growing by
    beta2 / beta1 a step, where Cauchy-Schwarz is tight (the ratio comes within 10% of it)."""
    beta1, beta2 = betas
    growing = [(beta2 / beta1) ** i for i in range(min(150, int(15 / math.log10(beta2 / beta1))))]
    largest = 0.0
    for grads in ([0.0] * 50 + [1.0], [0.0] * 5000 + growing):
        param = nn.Parameter(torch.zeros(1, dtype=torch.float64))
        optimizer = torch.optim.Adam([param], lr=1.0, betas=betas, eps=1e-300)
        for grad in grads:
            before = param.detach().clone()
            param.grad = torch.tensor([grad], dtype=torch.float64)
            optimizer.step()
            largest = max(largest, float((param.detach() - before).abs()))
    bound = adam_bound(betas)
    assert bound * 0.9 <= largest <= bound * (1 + 1e-9), (largest, bound)
