"""Evidence that diagnoses a loop we did not write (issue 26 item 3): a Hugging Face Trainer
app, a Lightning app and a plain PyTorch loop with `Probe`, each with its LR planted 30x too
low, get the step scan's low-LR finding from `hyprun diagnose`; at a healthy LR none does.

The scan's held-out batch comes from the Trainer's eval set and Lightning's validation loader
without a line of user code; the plain loop passes one. Real transformers, lightning, torch,
Hydra and MLflow (sqlite); the apps run through `hyprun baseline --app`, one seed each.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from hyprun.runner.cli.main import main as hyprun
from hyprun.runner.job.probe import Probe
from hyprun.runner.store.investigation import Store
from tests.apps.hf_gpt2.train import markov_tokens

LOW_LR = "steps_too_short"
"""The row that reads the step scan: the held-out loss kept falling out to 8x the step."""
BEST_LR = 1e-2
"""The apps' and the plain loop's best LR at their 40 steps, measured once (held-out loss):
HF 3e-3 1.84, 1e-2 0.95, 3e-2 1.16; Lightning 3e-3 1.96, 1e-2 0.89, 3e-2 0.97; plain loop
(its fixed batch) 3e-3 1.18, 1e-2 0.78, 3e-2 0.92. At 3e-3, the apps' configured LR, all
three read 8x and the row fires, rightly: 3e-3 is 3x below the best LR at this budget."""
APPS = {  # app, its LR key
    "hf": ("tests.apps.hf_gpt2.train:main", "training.learning_rate"),
    "lightning": ("tests.apps.lightning_gpt.train:main", "optim.lr"),
}


INV = ("--investigation", "inv")


def run_cli(*args: str) -> int:
    with pytest.raises(SystemExit) as exit_:
        hyprun(list(args))
    return exit_.value.code


def diagnosis(run_id: str, uri: str, capsys) -> dict:
    capsys.readouterr()
    assert run_cli("diagnose", "--run", run_id, "--uri", uri, "--json") == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture
def uri(workdir: Path, monkeypatch: pytest.MonkeyPatch, one_torch_thread) -> str:
    uri = f"sqlite:///{workdir}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("MLFLOW_RUN_ID", raising=False)
    return uri


@pytest.mark.parametrize("planted", [30.0, 1.0], ids=["lr_30x_low", "healthy"])
@pytest.mark.parametrize("kind", list(APPS))
def test_a_trainer_app_gets_the_low_lr_finding_only_when_planted(kind, planted, uri, capsys):
    app, key = APPS[kind]
    lr = BEST_LR / planted
    assert run_cli("baseline", "--app", app, f"{key}={lr:g}", "--seeds", "1", *INV) == 0
    run_id = Store(uri, "hyprun").find("inv").baseline["seed_runs"][0]
    document = diagnosis(run_id, uri, capsys)
    fired = {f["id"] for f in document["findings"]}
    assert "step_best_multiple" in document["features"], document["why_unmeasured"]
    assert (LOW_LR in fired) == (planted > 1), (fired, document["features"]["step_best_multiple"])
    assert planted > 1 or not fired, fired  # at the best LR nothing fires at all
    checks = {c["id"]: c for c in document["static"]}  # read from the live optimizer
    assert checks["lr_plausible"]["value"] == pytest.approx(lr)
    # on the eval set's batch: evaluation repeats, and no output reads a later token
    model_checks = {
        k: checks[k]["status"] for k in ("functional_dropout_in_eval", "causal_mask_missing")
    }
    assert set(model_checks.values()) == {"pass"}, model_checks


class TinyLM(nn.Module):
    """A user's own causal LM: a two-layer `nn.TransformerEncoder` under a causal mask."""

    def __init__(self, vocab: int, seq_len: int, width: int = 32):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Parameter(torch.zeros(seq_len, width))
        layer = nn.TransformerEncoderLayer(width, 2, 4 * width, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        causal = nn.Transformer.generate_square_subsequent_mask(length)
        x = self.embed(tokens) + self.position[:length]
        return self.head(self.encoder(x, mask=causal, is_causal=True))


def next_token_loss(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())


def plain_loop(lr: float, steps: int = 40, batch: int = 8) -> str:
    """A user's loop with the probe lines; the held-out batch is theirs to pass."""
    torch.manual_seed(0)
    train = markov_tokens(64, 32, steps * batch, seed=0, follow=0.9)
    heldout = markov_tokens(64, 32, batch, seed=99, follow=0.9)
    model = TinyLM(64, 31)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    probe = Probe(model, optimizer, every_steps=5, heldout=heldout, loss_fn=next_token_loss)
    for tokens in train.split(batch):
        loss = next_token_loss(model, tokens)
        loss.backward()
        probe.after_backward(loss)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
    probe.close()
    return probe.run_id


@pytest.mark.parametrize("planted", [30.0, 1.0], ids=["lr_30x_low", "healthy"])
def test_a_plain_loop_with_probe_gets_the_low_lr_finding_only_when_planted(planted, uri, capsys):
    document = diagnosis(plain_loop(BEST_LR / planted), uri, capsys)
    fired = {f["id"] for f in document["findings"]}
    assert (LOW_LR in fired) == (planted > 1), (fired, document["features"])
    assert planted > 1 or not fired, fired
    checks = {c["id"]: c["status"] for c in document["static"]}
    assert checks["lr_plausible"] == "pass" and checks["optimizer_coverage"] == "pass"
    assert checks["gradient_reach"] == "pass", document["static"]
