"""Tests for the L0 static checks (diag/static.py), memory and all-reduce estimates, dedup."""

from __future__ import annotations

import copy
import time

import numpy as np
import pytest
from omegaconf import OmegaConf

from hyprun.diag.comm import allreduce_estimate, ring_allreduce_bytes
from hyprun.diag.dedup import exact_duplicate_ratio, near_duplicate_ratio, overlap_ratio
from hyprun.diag.memory import activation_bytes, count_params, estimate_memory
from hyprun.diag.static import DataSample, DeviceInfo, device_info, run_checks, worst
from hyprun.runner.compose import compose
from hyprun.runner.job.data import Synthetic
from hyprun.runner.job.models import GPT

A100_40 = DeviceInfo("A100-40GB", memory_gb=40.0, link_gbps=2400.0, world=8)
LAPTOP = DeviceInfo("cpu", memory_gb=16.0, link_gbps=None, world=1)


def config(*overrides: str) -> dict:
    return OmegaConf.to_container(compose(list(overrides)), resolve=True)


def with_keys(cfg: dict, **keys) -> dict:
    """A copy of `cfg` with dotted keys set (`optim__lr=0` sets optim.lr); None deletes."""
    cfg = copy.deepcopy(cfg)
    for dotted, value in keys.items():
        *parents, leaf = dotted.split("__")
        node = cfg
        for part in parents:
            node = node[part]
        if value is None:
            del node[leaf]
        else:
            node[leaf] = value
    return cfg


def by_id(checks) -> dict:
    return {c.id: c for c in checks}


def status(cfg: dict, sample: DataSample, check_id: str, device: DeviceInfo | None = None) -> str:
    return by_id(run_checks(cfg, sample, device))[check_id].status


@pytest.fixture(scope="module")
def healthy() -> dict:
    return config()


@pytest.fixture(scope="module")
def gpt1b() -> dict:
    """The classic report's model: gpt_1b (18 x 2048, 16 heads, seq 2048, vocab 50304)."""
    return config("model=gpt_1b", "data.vocab_size=50304")


@pytest.fixture(scope="module")
def sample() -> DataSample:
    return DataSample.of(Synthetic(), n=8192, seed=0, heldout=512)


@pytest.fixture(scope="module")
def small_sample() -> DataSample:
    """Enough rows for the config-only checks, cheap to dedup."""
    return DataSample.of(Synthetic(), n=1024, seed=0, heldout=128)


# ---------------------------------------------------------------- run_checks on configs


def test_healthy_default_passes_everything(healthy, sample):
    checks = by_id(run_checks(healthy, sample, LAPTOP))
    failing = {k: (c.status, c.why) for k, c in checks.items() if c.status in ("warn", "fail")}
    assert failing == {}
    assert checks["allreduce_time"].status == "skip"  # one rank
    assert checks["sgd_momentum"].status == "skip"  # AdamW
    skipped = ("allreduce_time", "sgd_momentum")
    assert {c.status for k, c in checks.items() if k not in skipped} == {"pass"}
    assert all(c.question in ("Q1", "Q2", "Q3") and c.why and c.threshold for c in checks.values())


PLANTED = [
    # (keys set on the healthy config, check id, expected status)
    ({"optim__lr": 0.0}, "lr_plausible", "fail"),
    ({"optim__lr": 10.0}, "lr_plausible", "fail"),
    ({"optim__lr": 0.05}, "lr_plausible", "warn"),
    ({"optim__lr": 1e-6}, "lr_plausible", "warn"),
    ({"sched__warmup_frac": 0.0}, "warmup", "warn"),
    ({"sched__warmup_frac": None}, "warmup", "warn"),
    ({"sched__warmup_frac": 0.001}, "warmup", "warn"),  # 0.064 of a step
    ({"optim__betas": [0.9, 0.999]}, "adam_betas", "warn"),
    ({"optim__betas": [0.9, 1.0]}, "adam_betas", "fail"),
    ({"optim__weight_decay": 0.0}, "weight_decay", "warn"),
    ({"optim__weight_decay": 0.5}, "weight_decay", "warn"),
    ({"optim__decay_norms_and_biases": True}, "decay_norms_biases", "warn"),
    ({"ds__grad_clip": 0.0}, "grad_clip", "warn"),
    ({"ds__precision": "fp16", "ds__loss_scale": 1}, "fp16_loss_scaling", "fail"),
    ({"ds__precision": "fp16", "ds__loss_scale": 1024}, "fp16_loss_scaling", "warn"),
    ({"ds__precision": "fp16", "ds__loss_scale": 0}, "fp16_loss_scaling", "pass"),
    ({"ds__precision": "bf16", "ds__loss_scale": 1}, "fp16_loss_scaling", "pass"),
    ({"ds__micro_batch": 1}, "tokens_per_step", "warn"),  # 64 tokens vs B_opt ~900
    ({"budget__tokens": 16384}, "optimizer_steps", "warn"),  # 16 steps
    ({"data__source__loader_delay_ms": 20.0}, "loader", "warn"),
    ({"data__loader__num_workers": 2, "data__loader__prefetch_factor": 1}, "loader", "warn"),
    ({"ds__grad_clip": None}, "grad_clip", "skip"),  # a missing key skips, never crashes
]


@pytest.mark.parametrize("keys,check_id,expected", PLANTED)
def test_each_check_flips_on_its_planted_fault(healthy, small_sample, keys, check_id, expected):
    assert status(healthy, small_sample, check_id, LAPTOP) == "pass"
    check = by_id(run_checks(with_keys(healthy, **keys), small_sample, LAPTOP))[check_id]
    assert check.status == expected, check


def test_token_checks_count_the_datas_sequence_length(small_sample):
    """data.source.seq_len=8 on a seq_len-64 model: 16 x 8 = 128 tokens a step (issue 25)."""
    checks = by_id(run_checks(config("data.source.seq_len=8"), small_sample, LAPTOP))
    assert checks["tokens_per_step"].value == 128
    assert checks["optimizer_steps"].value == config()["budget"]["tokens"] / 128


def test_sgd_has_its_own_lr_band(small_sample):
    sgd = config("optim=sgd", "optim.weight_decay=1e-4")
    assert status(sgd, small_sample, "lr_plausible") == "pass"  # lr 0.1
    assert status(with_keys(sgd, optim__lr=1e-3), small_sample, "lr_plausible") == "pass"
    assert status(with_keys(sgd, optim__lr=1e-5), small_sample, "lr_plausible") == "warn"
    assert status(sgd, small_sample, "warmup") == "skip"
    assert status(sgd, small_sample, "adam_betas") == "skip"


def test_lr_band_scales_with_width(gpt1b, healthy, small_sample):
    """3e-3 is fine at d_model 64 but above the band at d_model 2048."""
    assert status(with_keys(healthy, optim__lr=3e-3), small_sample, "lr_plausible") == "pass"
    wide = by_id(run_checks(with_keys(gpt1b, optim__lr=3e-3), small_sample))["lr_plausible"]
    assert wide.status == "warn" and "d_model 2048" in wide.threshold


def test_memory_over_the_device(gpt1b, small_sample):
    fp32 = with_keys(gpt1b, ds__precision="fp32", ds__zero_stage=0)
    memory = {
        mb: by_id(run_checks(with_keys(fp32, ds__micro_batch=mb), small_sample, A100_40))["memory"]
        for mb in (2, 4, 8)
    }
    assert memory[2].status == "pass" and 27 < memory[2].value < 29  # the classic 28 GB
    assert memory[4].status == "warn"  # ~39 GB of 40: no headroom
    assert memory[8].status == "fail" and memory[8].value > 40
    assert "ZeRO-0" in memory[8].threshold and "fp32" in memory[8].threshold
    zero2 = with_keys(gpt1b, ds__precision="bf16", ds__zero_stage=2, ds__micro_batch=4)
    assert status(zero2, small_sample, "memory", A100_40) == "pass"


def test_fused_attention_on_gpu(gpt1b, small_sample):
    gpu = device_info("NVIDIA H100 80GB HBM3", world=8)
    bf16 = with_keys(gpt1b, ds__precision="bf16")
    assert by_id(run_checks(bf16, small_sample, gpu))["fused_attention"].value == "flash"
    fp32 = by_id(run_checks(with_keys(gpt1b, ds__precision="fp32"), small_sample, gpu))
    assert fp32["fused_attention"].status == "warn"
    odd = with_keys(bf16, model__d_model=2040, model__n_head=12)  # head dim 170
    assert status(odd, small_sample, "fused_attention", gpu) == "warn"
    cpu = by_id(run_checks(with_keys(gpt1b, ds__precision="fp32"), small_sample, LAPTOP))
    assert cpu["fused_attention"].status == "pass" and cpu["fused_attention"].value == "cpu"


def test_loader_on_gpu(healthy, small_sample):
    gpu = device_info("A100-80GB", world=1)
    check = by_id(run_checks(healthy, small_sample, gpu))["loader"]  # 0 workers, unpinned
    assert check.status == "warn" and "num_workers" in check.why and "pin_memory" in check.why
    good = with_keys(healthy, data__loader__num_workers=2, data__loader__pin_memory=True)
    assert status(good, small_sample, "loader", gpu) == "pass"


# ---------------------------------------------------------------- data checks on real samples


def test_duplicated_rows_fail(healthy):
    duplicated = DataSample.of(Synthetic(duplicate_frac=0.3), n=8192, heldout=512)
    checks = by_id(run_checks(healthy, duplicated))
    assert checks["duplicates"].status == "fail"
    assert checks["duplicates"].value == pytest.approx(0.3, abs=0.01)
    assert checks["near_duplicates"].status == "pass"  # exact copies are not counted twice


def test_padded_rows_fail(healthy):
    padded = DataSample.of(Synthetic(min_len=8), n=2048, heldout=128)
    check = by_id(run_checks(healthy, padded))["padding_waste"]
    assert check.status == "fail" and 0.35 < check.value < 0.5  # lengths ~U[8, 64]
    mild = DataSample.of(Synthetic(min_len=48), n=2048, heldout=128)  # ~12% padding
    assert status(healthy, mild, "padding_waste") == "warn"


def test_padding_ignored_when_comparing_rows(healthy):
    """With padding, rows are compared by real tokens: a padded sample has no false duplicates."""
    padded = DataSample.of(Synthetic(min_len=8), n=2048, heldout=128)
    checks = by_id(run_checks(healthy, padded))
    assert checks["duplicates"].value == 0.0 and checks["heldout_overlap"].value == 0.0


def test_heldout_overlap_fails(healthy, small_sample):
    leaky = DataSample(
        small_sample.train_x,
        small_sample.train_y,
        np.concatenate([small_sample.heldout_x[:96], small_sample.train_x[:32]]),
    )
    check = by_id(run_checks(healthy, leaky))["heldout_overlap"]
    assert check.status == "fail" and check.value == pytest.approx(32 / 128)


def plant_near_duplicates(x: np.ndarray, frac: float, seed: int = 0) -> tuple[np.ndarray, int]:
    """Overwrite `frac` of the rows with a copy of another row with 1 token of 64 changed."""
    rng = np.random.default_rng(seed)
    x = x.copy()
    n = len(x)
    targets = rng.choice(n, int(frac * n), replace=False)
    sources = rng.choice(np.setdiff1d(np.arange(n), targets), len(targets))
    x[targets] = x[sources]
    where = rng.integers(0, x.shape[1], len(targets))
    x[targets, where] = (x[targets, where] + 1) % 256
    return x, len(targets)


def test_near_duplicates_found(healthy):
    """One token changed in 64 leaves Jaccard(5-grams) ~ 55/65 = 0.85 >= 0.8.

    copy_prob=0: rows without repeated spans, so each row has ~60 distinct 5-grams.
    """
    clean = DataSample.of(Synthetic(copy_prob=0.0), n=8192, heldout=64)
    x, planted = plant_near_duplicates(clean.train_x, 0.2)
    near, exact = near_duplicate_ratio(x), exact_duplicate_ratio(x)
    assert exact < 0.001  # two planted rows may get the same edit of the same source
    assert planted / len(x) * 0.99 <= near + exact <= planted / len(x)  # they add up
    checks = by_id(run_checks(healthy, DataSample(x, clean.train_y, clean.heldout_x)))
    assert checks["near_duplicates"].status == "fail" and checks["duplicates"].status == "pass"
    assert near_duplicate_ratio(clean.train_x) == 0.0


def test_dedup_is_fast_on_8192_by_64(sample):
    start = time.perf_counter()
    exact_duplicate_ratio(sample.train_x, mask=sample.train_y != -100)
    near_duplicate_ratio(sample.train_x, mask=sample.train_y != -100)
    overlap_ratio(sample.heldout_x, sample.train_x)
    assert sample.train_x.shape == (8192, 64)
    assert time.perf_counter() - start < 2.0


def test_dedup_semantics():
    a, b = np.arange(10), np.arange(10, 20)
    assert exact_duplicate_ratio(np.stack([a, a, b, a])) == 0.5  # rows 1 and 3 repeat row 0
    # Same real tokens, different padding: equal. Ragged rows as a list work too.
    x = np.array([[1, 2, 3, 0, 0], [1, 2, 3, 9, 0]])
    assert exact_duplicate_ratio(x, mask=x != 0) == 0.0
    assert exact_duplicate_ratio(x, mask=np.array([[1, 1, 1, 0, 0], [1, 1, 1, 0, 0]])) == 0.5
    assert exact_duplicate_ratio([a, a[:5], a]) == pytest.approx(1 / 3)
    assert overlap_ratio(np.stack([a, b]), np.stack([b])) == 0.5
    changed = a.copy()
    changed[0] = 99  # the first 5-gram differs: Jaccard 5/7
    assert near_duplicate_ratio([a, changed], threshold=0.7) == 0.5
    assert near_duplicate_ratio([a, changed], threshold=0.8) == 0.0


# ---------------------------------------------------------------- memory and communication


def test_count_params_matches_the_built_gpt():
    base = dict(vocab_size=97, seq_len=16, n_layer=2, n_head=4, d_model=32)
    variants = [
        {},
        {"mlp": "swiglu"},
        {"n_experts": 4, "top_k": 2},
        {"tied_embeddings": False, "bias": True},
        {"norm": "rmsnorm", "placement": "post", "pos": "rope", "d_ff": 40},
    ]
    for variant in variants:
        cfg = {**base, **variant}
        assert count_params(cfg) == GPT(**cfg).num_params(), variant
        assert count_params(cfg, non_embedding=True) == GPT(**cfg).num_params(True), variant


def test_classic_memory_table(gpt1b):
    """1B in fp32 on A100-40GB, world 8, ZeRO-0: 4 + 4 + 8 = 16 GB of states, ~12 GB activations.

    Activations for micro_batch 2 at seq_len 2048 (dropout 0, fused SDPA, no checkpointing):
    18 layers x 2*s*h*32 bytes + logits 2*s*V*8 bytes = 9.66 + 1.65 = 11.35 GB -> 27.6 GB.
    """
    model = gpt1b["model"]
    n = count_params(model)
    assert 1.00e9 < n < 1.02e9
    estimate = estimate_memory(n, 0, 8, "fp32", activation_bytes(model, 2, "fp32"))
    assert estimate.params_gb == pytest.approx(4.0, rel=0.02)
    assert estimate.grads_gb == pytest.approx(4.0, rel=0.02)
    assert estimate.optimizer_gb == pytest.approx(8.0, rel=0.02)
    assert estimate.activations_gb == pytest.approx(12.0, rel=0.06)
    assert estimate.total_gb == pytest.approx(28.0, rel=0.03)
    assert estimate.total_gb < A100_40.memory_gb


def test_zero2_on_8_gpus_shrinks_grads_and_optimizer_8x(gpt1b):
    n = count_params(gpt1b["model"])
    for precision in ("fp32", "bf16"):
        zero0 = estimate_memory(n, 0, 8, precision, 0.0)
        zero2 = estimate_memory(n, 2, 8, precision, 0.0)
        assert zero2.grads_gb + zero2.optimizer_gb == pytest.approx(
            (zero0.grads_gb + zero0.optimizer_gb) / 8
        )
        assert zero2.params_gb == zero0.params_gb
        zero1 = estimate_memory(n, 1, 8, precision, 0.0)  # stage 1: optimizer states only
        assert zero1.grads_gb == zero0.grads_gb
        assert zero1.optimizer_gb == pytest.approx(zero0.optimizer_gb / 8)
    mixed = estimate_memory(n, 0, 1, "bf16", 0.0)  # 2 + 2 + 12 bytes per parameter
    assert mixed.total_gb == pytest.approx(16 * n / 1e9)
    assert estimate_memory(n, 3, 8, "bf16", 0.0).total_gb == pytest.approx(mixed.total_gb / 8)


def test_activations_follow_korthikanti(gpt1b):
    """16-bit, dropout on, unfused softmax: s*b*h*(34 + 5*a*s/h) bytes per layer, plus logits."""
    model = {**gpt1b["model"], "dropout": 0.1}
    s, h, a, L, V, b = 2048, 2048, 16, 18, 50304, 1
    layers = L * s * b * h * (34 + 5 * a * s / h)
    outside = 2 * s * b * h + s * b * V * (2 + 4 + 4)  # embedding out, logits, fp32 copy, softmax
    assert activation_bytes(model, 1, "bf16", fused_attention=False) == layers + outside
    # Fused SDPA keeps a log-sum-exp per row instead of the s x s matrices.
    fused_layer = s * b * h * 34 + 4 * a * s * b
    assert activation_bytes(model, 1, "bf16") == L * fused_layer + outside
    # Checkpointing keeps each layer's input (2*s*b*h) plus one layer recomputed in backward.
    checkpointed = activation_bytes({**model, "activation_checkpointing": True}, 1, "bf16")
    assert checkpointed == L * 2 * s * b * h + fused_layer + outside


def test_allreduce_arithmetic(gpt1b, small_sample):
    assert ring_allreduce_bytes(1e9, 8) == pytest.approx(1.75e9)
    assert ring_allreduce_bytes(1e9, 1) == 0.0
    estimate = allreduce_estimate(4e9, 8, 100.0)  # 4 GB over 100 Gbit/s: 7 GB on the wire
    assert estimate.bytes_on_wire == pytest.approx(7e9)
    assert estimate.seconds == pytest.approx(0.56)
    assert allreduce_estimate(4e9, 8, 100.0, volume_factor=1.5).seconds == pytest.approx(0.84)

    fp32 = with_keys(gpt1b, ds__precision="fp32", ds__zero_stage=0)
    node = DeviceInfo("A100-40GB", 40.0, link_gbps=200.0, world=16)  # InfiniBand HDR
    check = by_id(run_checks(fp32, small_sample, node))["allreduce_time"]
    expected = 2 * 15 / 16 * count_params(gpt1b["model"]) * 4 * 8 / 200e9
    assert check.status == "pass" and check.value == pytest.approx(expected)
    unknown = DeviceInfo("A100-40GB", 40.0, link_gbps=None, world=8)
    assert status(fp32, small_sample, "allreduce_time", unknown) == "skip"


def test_device_table():
    assert device_info("NVIDIA A100-SXM4-80GB").memory_gb == 80
    assert device_info("A100-40GB", world=8).memory_gb == 40
    assert device_info("NVIDIA H100 80GB HBM3").link_gbps == 3600
    assert device_info("NVIDIA L40").memory_gb == 48
    assert device_info("A100-40GB", link_gbps=200).link_gbps == 200
    assert device_info("NVIDIA H200", memory_gb=150.1).memory_gb == 150.1
    assert device_info("some new chip").memory_gb is None


def test_worst_status(healthy, small_sample):
    assert worst(run_checks(healthy, small_sample)) == "pass"
    assert worst(run_checks(with_keys(healthy, optim__lr=0.0), small_sample)) == "fail"


@pytest.mark.parametrize(
    ("before", "after", "named"),
    [
        ("    min_steps: 20\n", "    min_stepz: 20\n", "unknown key 'min_stepz'"),
        ("    warn_above: 0.85", "    warn_above: lots", "checks.memory.warn_above"),
        ('      few: "with fewer', '      fewer: "with fewer', "why lacks the outcome(s) few"),
    ],
)
def test_a_typo_in_the_static_table_is_one_line_naming_file_and_field(
    tmp_path, before, after, named
):
    """The L0 settings are validated when read, not a KeyError in the middle of a check."""
    from hyprun.diag.rules import TABLES, static_table

    text = (TABLES / "static.yaml").read_text()
    assert before in text
    broken = tmp_path / "static.yaml"
    broken.write_text(text.replace(before, after, 1))
    with pytest.raises(ValueError) as err:
        static_table(broken)
    message = str(err.value)
    assert named in message and "static.yaml" in message and "\n" not in message


def test_a_device_peak_without_a_precision_is_refused(tmp_path):
    from hyprun.diag.rules import peaks

    table = tmp_path / "hardware.yaml"
    table.write_text("peaks:\n  - {match: H100, bf16: 989.0e12, fp16: 989.0e12}\n")
    with pytest.raises(ValueError, match=r"hardware.yaml: missing field 'fp32' in peaks.0"):
        peaks(table)
