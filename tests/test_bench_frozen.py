"""A held-out draw is frozen together with diag/ (bench/frozen.py): diag_sha256 reads every file
under diag/, each benchmark's draw records it or is listed as legacy, held-out results were
scored with the diag/ their draw recorded, and the scoring commands refuse a draw whose diag/
has changed, writing nothing."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import yaml

import bench.apps.__main__ as apps_harness
import bench.apps.split as apps_split
import bench.corpus.__main__ as corpus_harness
import bench.corpus.split as corpus_split
import bench.diagnosis.split as diagnosis_split
from bench.diagnosis.families import MAGNITUDES
from bench.frozen import (
    DIAG,
    LEGACY,
    ROOT,
    diag_sha256,
    recorded,
    refusal,
    scored_draw,
    unfrozen,
)

OTHER = "0" * 64  # a diag_sha256 no diag/ has


def draws() -> list[tuple[Path, int]]:
    """Each benchmark's held-out draws: the split file or a later draw's, and its seed."""
    later = sorted(ROOT.glob("bench/*/draws/*.yaml"))
    return [
        (diagnosis_split.SPLIT, diagnosis_split.HELDOUT_DRAW),
        (apps_split.SPLIT, yaml.safe_load(apps_split.SPLIT.read_text())["seed"]),
        (corpus_split.SPLIT, corpus_split.load_split()["seed"]),
        *((path, yaml.safe_load(path.read_text())["seed"]) for path in later),
    ]


def split_recording(tmp_path: Path, source: Path, diag: str | None) -> Path:
    """A copy of a real split file whose draw recorded `diag` (None: recorded nothing)."""
    data = yaml.safe_load(source.read_text())
    data.pop("diag_sha256", None)
    if diag is not None:
        data["diag_sha256"] = diag
    path = tmp_path / "split.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_diag_sha256_reads_every_file_under_diag_and_skips_bytecode(tmp_path):
    copy = tmp_path / "diag"
    shutil.copytree(DIAG, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert diag_sha256(copy) == diag_sha256()
    before = diag_sha256(copy)
    (copy / "__pycache__").mkdir(exist_ok=True)
    (copy / "__pycache__" / "rules.cpython-311.pyc").write_bytes(b"\0cache")
    assert diag_sha256(copy) == before
    table = sorted((copy / "tables").glob("*.yaml"))[0]
    table.write_text(table.read_text() + "\n")  # one blank line in one table
    assert diag_sha256(copy) != before
    table.write_text(table.read_text()[:-1])
    assert diag_sha256(copy) == before
    table.rename(table.with_name("renamed.yaml"))  # same bytes, another name
    assert diag_sha256(copy) != before


def test_every_held_out_draw_records_diag_or_is_listed_as_legacy():
    for split, seed in draws():
        name = split.relative_to(ROOT).as_posix()
        assert recorded(split) is not None or (name, seed) in LEGACY, name
        if recorded(split) is None:
            assert LEGACY[(name, seed)] in refusal(split, seed)


def test_held_out_results_were_scored_with_the_diag_their_draw_recorded():
    current = {
        split.relative_to(ROOT).as_posix(): (seed, recorded(split)) for split, seed in draws()
    }
    for path in sorted(ROOT.glob("bench/*/results/*.json")):
        data = json.loads(path.read_text())
        meta = data.get("meta") if isinstance(data, dict) else None
        if not isinstance(meta, dict):
            continue
        assert unfrozen(meta) is None, f"{path.relative_to(ROOT)}: {unfrozen(meta)}"
        draw = meta.get("draw")
        if draw and current.get(draw["split"], (None,))[0] == draw["seed"]:
            assert draw["diag_sha256"] == current[draw["split"]][1], f"{path}: draw re-recorded"
    for bench in ("apps", "corpus"):  # their held-out results are of the split as it stands
        split, results = ROOT / f"bench/{bench}/split.yaml", ROOT / f"bench/{bench}/results"
        if recorded(split) is not None and (results / "heldout.json").exists():
            meta = json.loads((results / "heldout.json").read_text())["meta"]
            assert meta.get("draw"), f"bench/{bench}: held-out scored without its draw's diag/"


def test_a_results_file_scored_with_another_diag_is_caught(tmp_path):
    source = corpus_split.SPLIT
    for diag, caught in ((diag_sha256(), False), (OTHER, True), (None, True)):
        split = split_recording(tmp_path, source, diag)
        draw = scored_draw(split, 20261202)
        meta = corpus_split.scored_meta(split, "abc", False, time.monotonic(), tmp_path, draw)
        assert (unfrozen(meta) is not None) == caught, diag
    tuning = corpus_split.scored_meta(split, "abc", False, time.monotonic(), tmp_path)
    assert tuning["diag_sha256"] == diag_sha256() and unfrozen(tuning) is None


def test_a_draw_is_refused_once_diag_changed_and_allowed_while_it_has_not(tmp_path):
    now = split_recording(tmp_path, apps_split.SPLIT, diag_sha256())
    assert refusal(now, 7) is None
    changed = refusal(split_recording(tmp_path, apps_split.SPLIT, OTHER), 7)
    assert "diag/ changed since this draw" in changed and "draw a new held-out set" in changed
    legacy = refusal(split_recording(tmp_path, apps_split.SPLIT, None), 7)
    assert "predates the diag/ freeze" in legacy and "draw a new held-out set" in legacy


@pytest.mark.parametrize("bench", ["apps", "corpus", "diagnosis"])
def test_the_scoring_command_refuses_in_one_line_and_writes_nothing(
    bench, tmp_path, monkeypatch, capsys
):
    """Each harness on a draw whose diag/ has changed (a copy of its split recording another
    diag_sha256: the real split may be a fresh draw, and this test must never score it)."""
    module, args = {
        "apps": (apps_harness, ["--set", "heldout", "--no-early"]),
        "corpus": (corpus_harness, ["--set", "heldout"]),
        "diagnosis": (diagnosis_split, ["--set", "heldout", "--workdir", str(tmp_path / "w")]),
    }[bench]
    (tmp_path / "in").mkdir()
    split = split_recording(tmp_path / "in", module.SPLIT, OTHER)
    assert refusal(split, 1) is not None  # guard: never reach a real held-out run
    monkeypatch.setattr(module, "SPLIT", split)
    out = tmp_path / "out"
    assert module.main([*args, "--out", str(out)]) == 2
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and "diag/ changed since this draw" in said[0], said
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"]


@pytest.mark.parametrize("module", [apps_split, corpus_split])
def test_a_new_draw_records_diag_as_it_is(module, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(module, "SPLIT", tmp_path / "split.yaml")
    assert module.main(["--seed", "5"]) == 0
    assert recorded(tmp_path / "split.yaml") == diag_sha256()
    assert refusal(tmp_path / "split.yaml", 5) is None


def test_the_diagnosis_draw_prints_diag_with_its_entries(capsys):
    assert diagnosis_split.main(["--draw", "5"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["diag_sha256"] == diag_sha256()
    assert len(printed["heldout"]) == diagnosis_split.DRAW_PER_FAMILY * len(MAGNITUDES)
