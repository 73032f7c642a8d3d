"""A held-out draw is frozen together with diag/ (issue 27 item 4).

The held-out sets of bench/diagnosis, bench/apps and bench/corpus say how hyprun's diagnosis
does on cases nobody tuned it on. That holds only for the diagnosis code and tables as they
stood when the set was drawn: a row added or a cut moved after the draw may have been read off
the draw's own cases. So:

- a draw records `diag_sha256` (a top-level key of its split.yaml): diag/ when it was drawn;
- the scoring commands refuse a held-out set whose draw recorded another diag/ than today's,
  or none (`refusal`), and write nothing;
- a held-out results file records the draw it scored and the diag/ it was scored with
  (`scored_draw`, and `diag_sha256` in its meta); tests/test_bench_frozen.py fails when the two
  differ (`unfrozen`), e.g. diag/ changed while a run was under way.

Draws made before this rule recorded no diag_sha256; they are listed in LEGACY with what is
known of them and are not scored again.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
DIAG = ROOT / "diag"

LEGACY: dict[tuple[str, int], str] = {
    ("bench/diagnosis/split.yaml", 20261211): (
        "the tenth draw (--draw 20261211), committed at 44fcb46 and scored there and at "
        "5bc99af, clean trees; diag/ did not change between them by git, but no hash was "
        "recorded, and diag/ has changed since"
    ),
    ("bench/apps/split.yaml", 20261202): (
        "drawn at 99141e9 and scored at bb56445 on a clean tree; diag/ did not change between "
        "them by git, but no hash was recorded, and diag/ has changed since"
    ),
    ("bench/corpus/split.yaml", 20261202): (
        "drawn at 2f551fb and scored at e7e1c5d on a dirty tree (uncommitted edits of the "
        "time, diag/ possibly among them); no hash was recorded, and diag/ has changed since"
    ),
}
"""Held-out draws that predate the rule, by (split file, draw seed), with the reason they are
legacy. Each was scored once (its results stay as they are); none is scored again. The spent
draws of bench/diagnosis (first to ninth) are in its tuning set and are never scored as
held-out again either; the second and third were scored after diag/ had changed since they
were drawn."""


def diag_sha256(root: Path = DIAG) -> str:
    """SHA-256 of the diagnosis code and tables: every file under `root`, in sorted order of its
    path, as the path and then its bytes (bytecode caches skipped: they follow the sources)."""
    digest = hashlib.sha256()
    files = (p for p in Path(root).rglob("*") if p.is_file())
    paths = sorted(p.relative_to(root).as_posix() for p in files)
    for name in paths:
        if "__pycache__" in name.split("/"):
            continue
        data = (Path(root) / name).read_bytes()
        digest.update(f"{name}\0{len(data)}\0".encode())  # lengths: no two files read as one
        digest.update(data)
    return digest.hexdigest()


def _name(split: Path) -> str:
    """A split file as LEGACY names it: its path in the repository."""
    path = Path(split).resolve()
    return path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)


def recorded(split: Path) -> str | None:
    """The diag_sha256 a split file recorded when its held-out set was drawn (None: none)."""
    return (yaml.safe_load(Path(split).read_text()) or {}).get("diag_sha256")


def refusal(split: Path, seed: int) -> str | None:
    """Why the held-out set of `split` (drawn with `seed`) may not be scored now, in one line;
    None when it may: its draw recorded diag/ as it is now."""
    drawn = recorded(split)
    if drawn is None:
        why = LEGACY.get((_name(split), seed), "it records no diag_sha256")
        return (
            f"{_name(split)}: held-out draw {seed} predates the diag/ freeze and is not scored "
            f"again ({why}); draw a new held-out set"
        )
    now = diag_sha256()
    if drawn != now:
        return (
            f"{_name(split)}: diag/ changed since this draw (diag_sha256 {drawn[:12]} drawn, "
            f"{now[:12]} now); draw a new held-out set"
        )
    return None


def scored_draw(split: Path, seed: int) -> dict:
    """What a held-out results file records of the draw it scored: the split file, the draw's
    seed and the diag_sha256 the draw recorded."""
    return {"split": _name(split), "seed": seed, "diag_sha256": recorded(split)}


def unfrozen(meta: dict) -> str | None:
    """Why a results file's held-out scores do not stand for its draw (None: they do, or it
    scored no held-out draw under this rule): diag/ at scoring was not diag/ at the draw."""
    draw = meta.get("draw")
    if draw is None:
        return None
    if draw.get("diag_sha256") is None:
        return f"legacy draw {draw.get('seed')} of {draw.get('split')} was scored again"
    if meta.get("diag_sha256") != draw["diag_sha256"]:
        return (
            f"draw {draw.get('seed')} of {draw.get('split')} was scored with diag_sha256 "
            f"{str(meta.get('diag_sha256'))[:12]}, drawn with {draw['diag_sha256'][:12]}"
        )
    return None
