"""Train a tiny causal transformer with Lightning: a Hydra app as a user writes one.

Its own conf/ folder, @hydra.main, `seed_everything` from its config, and the Lightning logger
it would use anyway, `MLFlowLogger`, configured in its YAML to log into the run that
MLFLOW_RUN_ID names (a new one when unset). Of hyprun it uses only the L1 callback.

    python -m tests.apps.lightning_gpt.train optim.lr=3e-3
"""

from __future__ import annotations

import hydra
import lightning as L
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig
from torch import nn
from torch.nn import functional as F

from hyprun.runner.job.callbacks import HyprunLightningCallback


def markov_tokens(vocab: int, length: int, count: int, seed: int, follow: float) -> torch.Tensor:
    """`count` sequences of a fixed random bigram language (a token is followed by its
    successor in one permutation with probability `follow`, else by a uniform token)."""
    successor = torch.randperm(vocab, generator=torch.Generator().manual_seed(1234))
    rng = torch.Generator().manual_seed(seed)
    tokens = torch.empty(count, length, dtype=torch.long)
    tokens[:, 0] = torch.randint(vocab, (count,), generator=rng)
    for t in range(1, length):
        noise = torch.randint(vocab, (count,), generator=rng)
        keep = torch.rand(count, generator=rng) < follow
        tokens[:, t] = torch.where(keep, successor[tokens[:, t - 1]], noise)
    return tokens


class TinyCausalLM(L.LightningModule):
    def __init__(
        self,
        vocab_size: int,
        seq_len: int,
        d_model: int,
        n_layer: int,
        lr: float,
        warmup_steps: int,
        final: float,
        steps: int,
    ):
        super().__init__()
        self.save_hyperparameters()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.position = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(d_model, 2, 4 * d_model, dropout=0.0, batch_first=True)
            for _ in range(n_layer)
        )
        self.head = nn.Linear(d_model, vocab_size)
        nn.init.zeros_(self.head.weight)  # every run starts at loss ln(vocab)
        self.register_buffer("causal", nn.Transformer.generate_square_subsequent_mask(seq_len))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        x = self.embed(tokens) + self.position.weight[:length]
        for block in self.blocks:
            x = block(x, src_mask=self.causal[:length, :length], is_causal=True)
        return self.head(x)

    def loss(self, tokens: torch.Tensor) -> torch.Tensor:
        logits = self(tokens[:, :-1])
        return F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())

    def training_step(self, batch, batch_idx):
        loss = self.loss(batch[0])
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self.loss(batch[0]))

    def configure_optimizers(self):
        optimizer = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr)
        warmup, steps, final = self.hparams.warmup_steps, self.hparams.steps, self.hparams.final
        schedule = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lambda step: min(1.0, (step + 1) / (warmup + 1)) * linear(step, steps, final)
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def linear(step: int, steps: int, final: float) -> float:
    """From 1 down to `final` over `steps`."""
    return 1.0 - (1.0 - final) * min(step, steps) / steps


def loader(tokens: torch.Tensor, batch_size: int, shuffle: bool, seed: int):
    generator = torch.Generator().manual_seed(seed)
    data = torch.utils.data.TensorDataset(tokens)
    return torch.utils.data.DataLoader(data, batch_size, shuffle=shuffle, generator=generator)


@hydra.main(config_path="conf", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    L.seed_everything(cfg.seed, verbose=False)
    data = cfg.data
    train = markov_tokens(data.vocab_size, data.seq_len, data.n_train, data.seed, data.follow)
    heldout = markov_tokens(data.vocab_size, data.seq_len, data.n_val, data.val_seed, data.follow)
    model = TinyCausalLM(
        data.vocab_size,
        data.seq_len,
        **cfg.model,
        lr=cfg.optim.lr,
        warmup_steps=cfg.optim.warmup_steps,
        final=cfg.optim.final_lr_fraction,
        steps=cfg.trainer.max_steps,
    )
    trainer = L.Trainer(
        **cfg.trainer,
        logger=instantiate(cfg.logger),
        callbacks=[HyprunLightningCallback(every_steps=cfg.probe_every, step_unit="steps")],
    )
    trainer.fit(
        model,
        loader(train, cfg.batch_size, shuffle=True, seed=data.seed),
        loader(heldout, 64, shuffle=False, seed=0),
    )


if __name__ == "__main__":
    main()
