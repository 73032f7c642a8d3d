"""The corpus's Hugging Face Trainer form (bench/corpus/forms.yaml, form `hf`): a Hydra app that
trains a tiny GPT-2 with `transformers.Trainer`, logs `eval_loss` to the MLflow run hyprun hands
it (`report_to: [mlflow]`) and carries hyprun's `HyprunTrainerCallback` for L1 evidence.

The data is the loop form's synthetic language (bench/corpus/apps/loop/data.py), each sequence
given to the model whole with `labels = input_ids` and -100 at padding, as a Trainer user does.
Every bug reported against Hugging Face code is one switch under `bug:`, written the way a
Trainer user writes it; all off is the clean twin.

    python -m bench.corpus.apps.hf.train bug.frozen_except_norm=true
"""

from __future__ import annotations

import hydra
import torch
import torch.nn.functional as F
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments, set_seed

from bench.corpus.apps.loop.data import IGNORE, PAD, sequences
from hyprun.runner.job.callbacks import HyprunTrainerCallback


def examples(data: DictConfig, count: int, seed: int, bug=None) -> dict:
    """`count` sequences as a causal-LM dataset: input_ids and attention_mask of seq_len + 1
    ids, labels the ids with -100 at padding (the model shifts them itself), or as the user
    wrote them under the switches of `bug` (None: correct)."""
    drawn = sequences(count, data.vocab, data.seq_len, data.min_len, seed)
    labels = torch.cat([drawn["x"][:, :1], drawn["y"]], dim=1)
    input_ids = labels.masked_fill(labels == IGNORE, PAD)
    mask = (labels != IGNORE).long()
    if bug is not None and bug.padding_in_loss:  # labels = input_ids: padding is a target
        labels = input_ids.clone()
    if bug is not None and bug.labels_shifted_twice:  # pre-shifted, shifted again by the model
        labels = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], IGNORE)], dim=1)
    return {"input_ids": input_ids, "attention_mask": mask, "labels": labels}


class Examples(torch.utils.data.Dataset):
    """Rows of a dict of equal-length tensors, one dict per row (the Trainer's default
    collator stacks them)."""

    def __init__(self, columns: dict):
        self.columns = columns

    def __len__(self) -> int:
        return len(self.columns["input_ids"])

    def __getitem__(self, i: int) -> dict:
        return {key: column[i] for key, column in self.columns.items()}


class UserLossTrainer(Trainer):
    """A Trainer whose loss the user computes in `compute_loss`: each micro-batch's mean token
    loss, the Trainer told to divide it by the accumulation steps (`loss_is_scaled_for_ga =
    False`, as its docstring says for a per-batch mean).

    shift: compare position t's logits with label t + 1 (False: with label t itself)."""

    def __init__(self, *args, shift: bool = True, **kwargs):
        super().__init__(*args, **kwargs)
        self.shift = shift
        self.loss_is_scaled_for_ga = False

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        labels = inputs["labels"]
        outputs = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
        logits = outputs.logits
        if self.shift:
            logits, labels = logits[:, :-1], labels[:, 1:]
        flat = logits.reshape(-1, logits.shape[-1])
        loss = F.cross_entropy(flat, labels.reshape(-1), ignore_index=IGNORE)
        return (loss, outputs) if return_outputs else loss


def build_model(cfg: DictConfig) -> tuple:
    """The model and, where the user builds it, the optimizer: `optimizers=` for the Trainer."""
    set_seed(cfg.seed)
    d, bug = cfg.data, cfg.bug
    config = GPT2Config(vocab_size=d.vocab, n_positions=d.seq_len + 1, **cfg.model)
    model = GPT2LMHeadModel(config)
    if bug.frozen_except_norm:  # PyTorch forum 84911: every weight but the LayerNorms frozen
        for name, parameter in model.named_parameters():
            parameter.requires_grad = "ln_" in name
    if not cfg.finetune.new_head:
        return model, (None, None)
    head = torch.nn.Linear(config.n_embd, d.vocab, bias=False)  # a fresh head, as in fine-tuning
    if not bug.head_not_in_optimizer:
        model.lm_head = head
    trainable = [p for p in model.parameters() if p.requires_grad]
    t = cfg.training
    optimizer = torch.optim.AdamW(trainable, lr=t.learning_rate, weight_decay=t.weight_decay)
    if bug.head_not_in_optimizer:  # microsoft/nni#4521: replaced after the optimizer took them
        model.lm_head = head
    return model, (optimizer, None)


def make_trainer(cfg: DictConfig, output_dir: str, callbacks: list, report_to=None) -> Trainer:
    """The Trainer as the user sets it up; `report_to` overrides the config's (tests: [])."""
    d, bug = cfg.data, cfg.bug
    model, optimizers = build_model(cfg)
    training = OmegaConf.to_container(cfg.training, resolve=True)
    if report_to is not None:
        training["report_to"] = report_to
    args = TrainingArguments(output_dir=output_dir, seed=cfg.seed, data_seed=d.seed, **training)
    parts = dict(
        model=model,
        args=args,
        train_dataset=Examples(examples(d, d.n_train, d.seed, bug)),
        eval_dataset=Examples(examples(d, d.n_eval, d.eval_seed, bug)),
        callbacks=callbacks,
        optimizers=optimizers,
    )
    if bug.labels_not_shifted:  # the loss against the current token (macrocosm-os #64)
        return UserLossTrainer(**parts, shift=False)
    if bug.accum_mean_of_means:  # per-micro-batch means, averaged (transformers PR 34191)
        return UserLossTrainer(**parts, shift=True)
    return Trainer(**parts)


def epoch_steps(cfg: DictConfig) -> int:
    """Optimizer steps in one pass over the training set."""
    t = cfg.training
    return cfg.data.n_train // (t.per_device_train_batch_size * t.gradient_accumulation_steps)


def heldout_loss(model, cfg: DictConfig) -> float:
    """The correct next-token loss on the held-out set, whatever loss the user trained with:
    the harm a bug did, which a wrong loss can hide from the user's own `eval_loss`."""
    batch = examples(cfg.data, cfg.data.n_eval, cfg.data.eval_seed)
    model.eval()
    with torch.no_grad():
        return float(model(**{k: v.to(model.device) for k, v in batch.items()}).loss)


def fit(cfg: DictConfig, output_dir: str, callbacks: list, report_to=None) -> dict[str, float]:
    """Train; the last `eval_loss` the Trainer logged (the user's loss) and `heldout_loss`."""
    trainer = make_trainer(cfg, output_dir, callbacks, report_to)
    trainer.train()
    logged = [entry["eval_loss"] for entry in trainer.state.log_history if "eval_loss" in entry]
    eval_loss = logged[-1] if logged else trainer.evaluate()["eval_loss"]
    return {"eval_loss": float(eval_loss), "heldout_loss": heldout_loss(trainer.model, cfg)}


@hydra.main(config_path="conf", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> float:
    probe = HyprunTrainerCallback(every_steps=cfg.probe_every, epoch_steps=epoch_steps(cfg))
    output_dir = HydraConfig.get().runtime.output_dir
    return fit(cfg, output_dir, callbacks=[probe])["eval_loss"]  # L1 evidence: the callback


if __name__ == "__main__":
    main()
