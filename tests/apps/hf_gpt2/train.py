"""Train a small GPT-2 on synthetic token sequences with Hugging Face's Trainer.

A Hydra app as a user writes one: its own conf/ folder, @hydra.main, seeds from its config,
metrics to MLflow through the Trainer's own MLflow integration (`report_to: [mlflow]`), which
logs into the run MLFLOW_RUN_ID names. Of hyprun it uses the two lines a user adds for L1
evidence, the import and `HyprunTrainerCallback` among the Trainer's callbacks, and
`last_complete_checkpoint` to resume after a requeue (a job killed mid-save leaves a partial
checkpoint that Transformers' `get_last_checkpoint` would pick).

    python -m tests.apps.hf_gpt2.train training.learning_rate=3e-3
"""

from __future__ import annotations

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, set_seed

from hyprun.runner.job.callbacks import HyprunTrainerCallback, last_complete_checkpoint


def markov_tokens(vocab: int, length: int, count: int, seed: int, follow: float) -> torch.Tensor:
    """`count` sequences of a fixed random bigram language: each token is followed by its
    successor in one permutation with probability `follow`, else by a uniform token."""
    successor = torch.randperm(vocab, generator=torch.Generator().manual_seed(1234))
    rng = torch.Generator().manual_seed(seed)
    tokens = torch.empty(count, length, dtype=torch.long)
    tokens[:, 0] = torch.randint(vocab, (count,), generator=rng)
    for t in range(1, length):
        noise = torch.randint(vocab, (count,), generator=rng)
        keep = torch.rand(count, generator=rng) < follow
        tokens[:, t] = torch.where(keep, successor[tokens[:, t - 1]], noise)
    return tokens


class Sequences(torch.utils.data.Dataset):
    def __init__(self, tokens: torch.Tensor):
        self.tokens = tokens

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.tokens[i], "labels": self.tokens[i]}


@hydra.main(config_path="conf", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> float:
    set_seed(cfg.seed)
    data = cfg.data
    train = markov_tokens(data.vocab_size, data.seq_len, data.n_train, data.seed, data.follow)
    heldout = markov_tokens(data.vocab_size, data.seq_len, data.n_eval, data.eval_seed, data.follow)
    model = GPT2LMHeadModel(
        GPT2Config(vocab_size=data.vocab_size, n_positions=data.seq_len, **cfg.model)
    )
    output_dir = HydraConfig.get().runtime.output_dir
    args = TrainingArguments(
        output_dir=output_dir,
        seed=cfg.seed,
        data_seed=data.seed,
        **OmegaConf.to_container(cfg.training, resolve=True),
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=Sequences(train),
        eval_dataset=Sequences(heldout),
        callbacks=[HyprunTrainerCallback(every_steps=cfg.probe_every)],  # L1 evidence
    )
    trainer.train(resume_from_checkpoint=last_complete_checkpoint(output_dir))
    return trainer.evaluate()["eval_loss"]


if __name__ == "__main__":
    main()
