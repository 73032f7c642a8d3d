"""Data a user has: uint16 and uint32 token files (vocabularies above 65,535), .npy arrays and a
tokenized Hugging Face dataset saved on disk, each trained by the built-in job on a small file
made here; a bad file is one line, exit 2, nothing written."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from datasets import Dataset, DatasetDict, disable_progress_bars

from hyprun.runner.cli.main import main as hyprun
from hyprun.runner.job.data import HFDataset, NpyFile, TokenFile
from hyprun.runner.job.train import run
from tests.helpers import job_config

BIG_VOCAB = 70_000  # above 65,535: does not fit uint16
disable_progress_bars()  # one line of stderr is what the refusal tests read


def stream(vocab: int, n: int = 12_000, seed: int = 0) -> np.ndarray:
    """A learnable stream: runs of a repeating pattern, shifted by a random offset, ids spread
    over the whole vocabulary."""
    rng = np.random.default_rng(seed)
    base = np.arange(n) % 11 * ((vocab - 3) // 10)
    return (base + rng.integers(0, 3, n)) % vocab


def token_file(folder: Path, dtype: str, vocab: int) -> Path:
    path = folder / f"train_{dtype}.bin"
    stream(vocab).astype(dtype).tofile(path)
    return path


def npy_file(folder: Path, vocab: int) -> Path:
    path = folder / "train.npy"
    np.save(path, stream(vocab).astype(np.int32).reshape(-1, 100))  # 2-D: read row by row
    return path


def hf_dataset(folder: Path, vocab: int) -> Path:
    path = folder / "tokenized"
    rows = stream(vocab).reshape(-1, 120).tolist()
    held = stream(vocab, n=2400, seed=1).reshape(-1, 120).tolist()
    DatasetDict(
        {
            "train": Dataset.from_dict({"input_ids": rows, "text": ["doc"] * len(rows)}),
            "validation": Dataset.from_dict({"input_ids": held, "text": ["doc"] * len(held)}),
        }
    ).save_to_disk(str(path))
    return path


FORMATS = {
    "uint16 token file": lambda d: (["data=token_file"], token_file(d, "uint16", 256), 256),
    # uint32 trained on a small vocabulary (a 70k embedding would take a minute on 2 cores);
    # ids above 65,535 are read back in test_sources_read_what_was_written.
    "uint32 token file": lambda d: (
        ["data=token_file", "data.source.dtype=uint32"],
        token_file(d, "uint32", 256),
        256,
    ),
    "npy array": lambda d: (["data=npy_file"], npy_file(d, 256), 256),
    "saved HF dataset": lambda d: (["data=hf_dataset"], hf_dataset(d, 256), 256),
}


@pytest.mark.parametrize("make", FORMATS.values(), ids=FORMATS.keys())
def test_the_job_trains_on_each_format(workdir, make):
    overrides, path, vocab = make(workdir)
    cfg = job_config(
        workdir,
        *overrides,
        f"data.source.path={path}",
        f"data.vocab_size={vocab}",
        "data.loader.num_workers=0",
        "data.loader.prefetch_factor=null",
        "budget.tokens=8192",
        "budget.eval_sequences=8",
        *overrides,  # a format's own budget wins
    )
    result = run(cfg)
    assert result.status == "completed" and result.eval_loss < result_first_loss(cfg, result)


def result_first_loss(cfg, result) -> float:
    from tests.helpers import metric_history

    return metric_history(cfg.tracking.uri, result.run_id, "train/loss")[0][1]


def test_sources_read_what_was_written(tmp_path):
    big = TokenFile(token_file(tmp_path, "uint32", BIG_VOCAB), 16, BIG_VOCAB, dtype="uint32")
    x, y = big.train(0, 4, seed=0)
    assert int(x.max()) > 65_535 and (x[:, 1:] == y[:, :-1]).all()
    npy = NpyFile(npy_file(tmp_path, 256), 16, 256)
    assert npy.describe()["train_tokens"] + npy.describe()["heldout_tokens"] == 12_000
    hf = HFDataset(hf_dataset(tmp_path, 256), 16, 256)
    facts = hf.describe()
    assert facts["train_tokens"] == 12_000 and facts["heldout_tokens"] == 2400
    heldout_x, _ = hf.heldout(2)
    assert heldout_x[0].tolist() == stream(256, n=2400, seed=1)[:16].tolist()


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


BAD = {
    "uint32 ids read as uint16": lambda d: (
        ["data=token_file", f"data.source.path={token_file(d, 'uint32', 256)}"],
        "looks like uint32 ids read as uint16 (every other token is 0): set data.source.dtype",
    ),
    "big vocabulary as uint16": lambda d: (
        ["data=token_file", f"data.source.path={token_file(d, 'uint16', 256)}"]
        + [f"data.vocab_size={BIG_VOCAB}"],
        "vocab_size 70000 does not fit uint16 token ids: set data.source.dtype=uint32",
    ),
    "unknown dtype": lambda d: (
        ["data=token_file", f"data.source.path={token_file(d, 'uint16', 256)}"]
        + ["data.source.dtype=int8"],
        "data.source.dtype=int8 is not a token file type",
    ),
    "not an npy file": lambda d: (
        ["data=npy_file", f"data.source.path={write(d / 'x.npy', b'hello world')}"],
        "is not a .npy array",
    ),
    "float npy": lambda d: (
        ["data=npy_file", f"data.source.path={d / 'f.npy'}"],
        "holds float64, not integer token ids",
    ),
    "not a saved dataset": lambda d: (
        ["data=hf_dataset", f"data.source.path={d}"],
        "cannot be loaded",
    ),
    "untokenized dataset": lambda d: (
        ["data=hf_dataset", f"data.source.path={hf_dataset(d, 256)}", "data.source.column=text"],
        "column 'text' holds string, not lists of integer token ids: tokenize it first",
    ),
}


@pytest.mark.parametrize("make", BAD.values(), ids=BAD.keys())
def test_a_bad_file_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys, make):
    data = tmp_path / "data"
    data.mkdir()
    np.save(data / "f.npy", np.linspace(0, 1, 5000))
    overrides, expected = make(data)
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    with pytest.raises(SystemExit) as exit_:
        hyprun(["train", f"checkpoint.dir={work}/ckpt", *overrides])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert expected in err and "\n" not in err, err
    assert not list(work.iterdir()), "a refused job writes nothing"
