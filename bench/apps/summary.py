"""`python -m bench.apps.summary [--pool-from N]`: every scored set of the app benchmark in one
table, read from results/ (nothing is run), and the held-out draws pooled.

Per set: top-1 over every planted fault; over the harmful ones (the plant's own harm, fault
against its clean twin, above bench.diagnosis.split.HARM; results/harm_SET.json), strict (the
first finding names the planted family's cause) and with two faults counted (where
results/setting_SET.json shows the setting costing more than the plant, the first finding may
name either: the setting's family is the one that plants it, e.g. lr_high for a high LR);
top-3 of the harmful, strict; healthy configs with no finding. Held-out draws are numbered in
the order they were drawn (the split's own held-out set is the 1st); pooled figures sum the
draws from --pool-from on.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path

from bench.apps.__main__ import RESULTS
from bench.apps.schema import Table, load_table
from bench.diagnosis.split import HARM


@dataclass
class Counts:
    """Hits over entries for one set (or a pool of sets)."""

    faults: int = 0
    top1: int = 0
    harmful: int = 0
    harmful_top1: int = 0
    harmful_top1_two: int = 0
    harmful_top3: int = 0
    two_faults: int = 0
    healthy: int = 0
    healthy_quiet: int = 0
    unmeasured: list[str] = field(default_factory=list)
    """Fault entries with no harm measured: left out of the harmful counts."""

    def add(self, other: Counts) -> None:
        for name, value in vars(other).items():
            setattr(self, name, getattr(self, name) + value)


def setting_causes(table: Table, family_name: str) -> set[str]:
    """The causes of the family that plants what `family_name` sets (empty without a setting)."""
    setting = table.families[family_name].setting
    return {
        cause
        for family in table.families.values()
        if setting and family.plants == setting
        for cause in family.cause
    }


def is_two_faults(plant_change: float, setting_change: float | None) -> bool:
    """The setting alone costs more than the plant adds to it, and is itself harmful."""
    return setting_change is not None and setting_change > max(plant_change, HARM)


def count(table: Table, results: list[dict], harm: dict, setting: dict) -> Counts:
    """Counts of one scored set; `harm` and `setting` map entry id -> change."""
    counts = Counts()
    for row in results:
        if row["kind"] == "healthy":
            counts.healthy += 1
            counts.healthy_quiet += not row["findings"]
            continue
        counts.faults += 1
        counts.top1 += row["rank"] == 1
        if row["id"] not in harm:
            counts.unmeasured.append(row["id"])
            continue
        if harm[row["id"]] <= HARM:
            continue
        counts.harmful += 1
        counts.harmful_top1 += row["rank"] == 1
        counts.harmful_top3 += row["rank"] is not None and row["rank"] <= 3
        two = is_two_faults(harm[row["id"]], setting.get(row["id"]))
        counts.two_faults += two
        first = row["findings"][0] if row["findings"] else None
        setting_first = two and first in setting_causes(table, row["family"])
        counts.harmful_top1_two += row["rank"] == 1 or setting_first
    return counts


def changes(path: Path) -> dict[str, float]:
    """Entry id -> change of a harm or setting file; empty when it is not there."""
    if not path.exists():
        return {}
    return {row["id"]: row["change"] for row in json.loads(path.read_text())["rows"]}


def scored_sets(results_dir: Path = RESULTS) -> list[tuple[str, str]]:
    """(label, set name) of every scored set: tuning, then held-out draws in drawing order."""
    names = [p.stem for p in results_dir.glob("heldout-*.json")]
    draws = ["heldout", *sorted(names)] if (results_dir / "heldout.json").exists() else []
    labelled = [(f"held-out draw {i}", name) for i, name in enumerate(draws, 1)]
    return ([("tuning", "tuning")] if (results_dir / "tuning.json").exists() else []) + labelled


def read_set(table: Table, name: str, results_dir: Path = RESULTS) -> tuple[Counts, dict]:
    document = json.loads((results_dir / f"{name}.json").read_text())
    harm = changes(results_dir / f"harm_{name}.json")
    setting = changes(results_dir / f"setting_{name}.json")
    return count(table, document["results"], harm, setting), document["meta"]


def ratio(hits: int, total: int) -> str:
    return f"{hits / total:.0%} ({hits}/{total})" if total else "n/a"


HEADER = (
    "| set | commit | top-1, all faults | harmful: top-1 | harmful: top-1, two faults counted "
    "(two-fault entries) | harmful: top-3 | healthy quiet |\n| --- | --- | --- | --- | --- | --- "
    "| --- |"
)


def line(label: str, commit: str, counts: Counts) -> str:
    harmful = counts.harmful
    return (
        f"| {label} | {commit} | {ratio(counts.top1, counts.faults)} | "
        f"{ratio(counts.harmful_top1, harmful)} | {ratio(counts.harmful_top1_two, harmful)} "
        f"({counts.two_faults}) | {ratio(counts.harmful_top3, harmful)} | "
        f"{ratio(counts.healthy_quiet, counts.healthy)} |"
    )


def render(results_dir: Path = RESULTS, pool_from: int = 1) -> str:
    table, lines, pool = load_table(), [HEADER], Counts()
    for label, name in scored_sets(results_dir):
        counts, meta = read_set(table, name, results_dir)
        lines.append(line(label, meta["commit"][:7], counts))
        number = int(label.rsplit(" ", 1)[1]) if label.startswith("held-out") else 0
        if number >= pool_from:
            pool.add(counts)
        if counts.unmeasured:
            lines.append(f"| (no harm measured: {', '.join(counts.unmeasured)}) | | | | | | |")
    lines.append(line(f"held-out draws {pool_from}+ pooled", "", pool))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.apps.summary", description=__doc__)
    parser.add_argument("--pool-from", type=int, default=1, help="first held-out draw pooled")
    args = parser.parse_args(argv)
    if args.pool_from < 1:
        print("--pool-from counts held-out draws from 1: give 1 or more")
        return 2
    print(render(pool_from=args.pool_from))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
