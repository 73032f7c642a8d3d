"""Every config composes, validates and instantiates; schedules; the DeepSpeed translation."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra.utils import instantiate

from hyprun.runner.compose import compose
from hyprun.runner.job.engine import deepspeed_config
from hyprun.runner.job.optim import build_optimizer
from hyprun.runner.job.schedules import Constant, Cosine, CosineWarmRestarts, WarmupStableDecay
from hyprun.runner.job.validate import validate

CONF = Path(__file__).resolve().parent.parent / "conf"
GROUPS = sorted(p.name for p in CONF.iterdir() if p.is_dir() and p.name != "__pycache__")
CHOICES = [(g, f.stem) for g in GROUPS for f in sorted((CONF / g).glob("*.yaml"))]


@pytest.fixture(scope="module")
def data_files(tmp_path_factory) -> list[str]:
    folder = tmp_path_factory.mktemp("data")
    tokens = np.random.default_rng(0).integers(0, 50000, 200_000, dtype=np.uint16)
    tokens.tofile(folder / "train.bin")
    (folder / "corpus.txt").write_text("the quick brown fox jumps over the lazy dog. " * 2000)
    np.save(folder / "train.npy", tokens.astype(np.int32))
    from datasets import Dataset

    Dataset.from_dict({"input_ids": tokens.reshape(-1, 1000).tolist()}).save_to_disk(
        str(folder / "tokenized")
    )
    return [
        f"+paths.bin={folder / 'train.bin'}",
        f"+paths.txt={folder / 'corpus.txt'}",
        f"+paths.npy={folder / 'train.npy'}",
        f"+paths.hf={folder / 'tokenized'}",
    ]


def overrides_for(group: str, choice: str, data_files: list[str]) -> list[str]:
    extra = []
    if (group, choice) == ("data", "token_file") or group == "experiment":
        extra = ["data.source.path=${paths.bin}"]
    if (group, choice) == ("data", "text_file"):
        extra = ["data.source.path=${paths.txt}"]
    if (group, choice) == ("data", "npy_file"):
        extra = ["data.source.path=${paths.npy}"]
    if (group, choice) == ("data", "hf_dataset"):
        extra = ["data.source.path=${paths.hf}"]
    return [*data_files, f"{group}={choice}", *extra]


@pytest.mark.parametrize(("group", "choice"), CHOICES, ids=[f"{g}={c}" for g, c in CHOICES])
def test_every_config_composes_and_instantiates(group, choice, data_files):
    cfg = compose(overrides_for(group, choice, data_files))
    if cfg.ds.precision != "fp16" or torch.cuda.is_available():
        validate(cfg)
    source = instantiate(cfg.data.source)
    assert source.vocab_size == cfg.data.vocab_size and source.seq_len == cfg.model.seq_len
    with torch.device("meta"):  # the 1B model is built without allocating 4 GB
        model = instantiate(cfg.model)
    assert model.num_params() > 0
    tiny = torch.nn.Linear(4, 4)
    optimizer = build_optimizer(tiny, cfg.optim)
    assert optimizer.param_groups[0]["lr"] == cfg.optim.lr
    schedule = instantiate(cfg.sched)
    assert all(0.0 <= schedule(s, 100) <= 1.0 for s in range(100))
    ds = deepspeed_config(cfg.ds)
    assert ds["zero_optimization"]["stage"] == cfg.ds.zero_stage


@pytest.mark.parametrize(
    ("model", "low", "high"),
    [("gpt_tiny", 1.1e5, 1.3e5), ("gpt_125m", 123e6, 126e6), ("gpt_1b", 0.95e9, 1.05e9)],
)
def test_model_sizes(model, low, high):
    """The named sizes hold with the vocabulary they are meant for (GPT-2's padded 50304)."""
    vocab = 256 if model == "gpt_tiny" else 50304
    cfg = compose([f"model={model}", f"data.vocab_size={vocab}"])
    with torch.device("meta"):
        assert low <= instantiate(cfg.model).num_params() <= high


def test_presets_set_only_deltas():
    base = compose([])
    preset = compose(["model=gpt_small"])
    assert preset.model.norm == base.model.norm and preset.model.d_model != base.model.d_model


def test_weight_decay_skips_norms_and_biases():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    optimizer = build_optimizer(model, compose([]).optim)
    decays = {len(g["params"]): g["weight_decay"] for g in optimizer.param_groups}
    assert decays == {1: 0.1, 3: 0.0}  # one weight matrix decays; bias, norm weight and bias don't
    optimizer = build_optimizer(model, compose(["optim.decay_norms_and_biases=true"]).optim)
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.1]


def test_schedules_shapes():
    total = 1000
    warm = Cosine(warmup_frac=0.1, min_lr_ratio=0.1)
    assert warm(0, total) == pytest.approx(0.01) and warm(99, total) == pytest.approx(1.0)
    assert warm(100, total) == pytest.approx(1.0) and warm(999, total) == pytest.approx(
        0.1, abs=1e-4
    )
    assert Constant()(500, total) == 1.0
    sgdr = CosineWarmRestarts(cycles=4, min_lr_ratio=0.0)
    values = [sgdr(s, total) for s in range(total)]
    restarts = [s for s in range(1, total) if values[s] > values[s - 1] + 0.5]
    assert restarts == [250, 500, 750]
    wsd = WarmupStableDecay(warmup_frac=0.0, decay_frac=0.2, min_lr_ratio=0.0)
    assert wsd(799, total) == 1.0 and wsd(900, total) == pytest.approx(0.5, abs=0.01)
    with pytest.raises(ValueError, match="warmup_frac"):
        Cosine(warmup_frac=1.5)


def test_deepspeed_config_translation():
    cfg = compose(
        ["ds=zero2_bf16", "ds.grad_accum=4", "+ds.extra.zero_optimization.overlap_comm=true"]
    )
    ds = deepspeed_config(cfg.ds)
    assert ds["bf16"] == {"enabled": True} and "fp16" not in ds
    assert ds["zero_optimization"] == {"stage": 2, "overlap_comm": True}
    assert ds["gradient_accumulation_steps"] == 4 and ds["gradient_clipping"] == 1.0
    fp16 = deepspeed_config(compose(["ds=fp16"]).ds)["fp16"]
    assert (
        fp16["enabled"]
        and fp16["loss_scale"] == 0.0
        and math.isclose(fp16["initial_scale_power"], 16)
    )
