"""The foreign-app benchmark's table and split (bench/apps): the table validates, each entry
plants exactly one variable of its app's own config (the family's setting aside) and every
override composes, the split is the seeded draw of the table as it stood and is frozen once
results exist, held-out magnitudes and data seeds are ones tuning never saw (and a later draw's
ones no draw saw), and the held-out set is scored once. Fast: composes configs, trains nothing."""

from __future__ import annotations

import json

import pytest
import yaml

from bench.apps.__main__ import RESULTS, ROOT, main
from bench.apps.run import entry_overrides
from bench.apps.schema import TABLE, load_repairs, load_table, plant, twin_of
from bench.apps.split import SETS, SPLIT, draw, load_split, redraw, taken_seeds
from bench.corpus.split import sha256

TABLE_NOW = load_table()
ENTRIES = [entry for name in SETS for entry in load_split()[name]]


def test_the_table_has_six_healthy_configs_and_the_families_in_every_form_with_keys():
    assert len(TABLE_NOW.healthy) >= 6
    assert {h.form for h in TABLE_NOW.healthy} == set(TABLE_NOW.forms)
    assert {f for family in TABLE_NOW.families.values() for f in family.forms} == {
        "hf",
        "lightning",
        "loop",
    }


def test_a_family_without_the_forms_key_is_refused_on_load():
    data = yaml.safe_load(TABLE.read_text())
    data["families"]["weight_decay_high"]["forms"].append("lightning")  # Lightning has no key
    with pytest.raises(ValueError, match="no key for"):
        type(TABLE_NOW).model_validate(data)


def leaves(config, prefix: str = "") -> dict[str, object]:
    if not isinstance(config, dict):
        return {prefix: config}
    return {k: v for key, sub in config.items() for k, v in leaves(sub, f"{prefix}{key}.").items()}


def test_each_fault_is_one_variable_of_its_twin_and_every_entry_composes():
    """Composed in the app (Hydra, as the baseline composes it): the fault's config differs
    from its clean twin's (same base, setting and data seed) in exactly one leaf."""
    from omegaconf import OmegaConf

    from hyprun.runner.launch.app import HydraApp

    apps = {name: HydraApp.load(form.app) for name, form in TABLE_NOW.forms.items()}

    def composed(form: str, overrides: list[str]) -> dict[str, object]:
        return leaves(OmegaConf.to_container(apps[form].compose(overrides), resolve=False))

    for entry in ENTRIES:
        fault = composed(entry.form, entry_overrides(TABLE_NOW, entry))
        if entry.family is None:
            continue
        seed = entry_overrides(TABLE_NOW, entry)[-1]
        twin = composed(entry.form, [*twin_of(TABLE_NOW, entry), seed])
        changed = {k for k in fault.keys() | twin.keys() if fault.get(k) != twin.get(k)}
        assert len(plant(TABLE_NOW, entry)) == 1 and len(changed) == 1, (entry.id, changed)


def test_the_split_is_the_seeded_draw_of_the_table_as_it_stands():
    frozen = yaml.safe_load(SPLIT.read_text())
    table = frozen["table_sha256"]
    for repair in load_repairs():
        assert repair.before == table, f"a repair of {repair.entries} does not follow the last"
        assert {h.id for h in TABLE_NOW.healthy} | set(TABLE_NOW.families) >= set(repair.entries)
        table = repair.after
    assert table == sha256(TABLE), "table.yaml changed after the split without a repair"
    assert draw(TABLE_NOW, frozen["seed"]) == {name: frozen[name] for name in SETS}


def test_a_draw_made_after_a_repair_holds_the_repaired_table():
    for repair in load_repairs():
        drawn = ROOT / repair.from_draw
        if drawn.exists():  # the repair is committed before the draw that first scores it
            assert yaml.safe_load(drawn.read_text())["table_sha256"] == repair.after


def test_held_out_magnitudes_and_seeds_are_ones_tuning_never_saw():
    split = load_split()
    tuning = {(e.form, e.family, e.m) for e in split["tuning"]}
    for entry in split["heldout"]:
        if entry.family and len(TABLE_NOW.families[entry.family].magnitudes) > 1:
            assert (entry.form, entry.family, entry.m) not in tuning, entry.id
    assert not {e.seed for e in split["tuning"]} & {e.seed for e in split["heldout"]}


def test_results_were_scored_on_this_split():
    for path in sorted(RESULTS.glob("*.json")):
        meta = json.loads(path.read_text()).get("meta", {})
        named = meta["draw"]["split"] if meta.get("draw") else meta.get("split")  # a later draw
        scored = ROOT / named if named else SPLIT
        assert meta.get("split_sha256") == sha256(scored), (
            f"{scored.name} changed after {path.name}"
        )


def test_a_later_draw_holds_magnitudes_the_table_lacks_on_data_seeds_never_used(tmp_path):
    table = load_table()
    taken = taken_seeds([SPLIT])
    entries = redraw(table, 5, taken)
    faults = [e for e in entries if e.get("family")]
    for entry in faults:
        family = table.families[entry["family"]]
        low, high = min(family.magnitudes), max(family.magnitudes)
        assert low <= entry["m"] <= high and (entry["m"] not in family.magnitudes or low == high)
    assert len({e["id"] for e in faults}) == len(faults)
    assert {e["id"] for e in entries if e.get("kind") == "healthy"} == {h.id for h in table.healthy}
    assert not {e["seed"] for e in entries} & taken
    assert redraw(table, 5, taken) == entries  # seeded: the same draw again


def test_the_held_out_set_is_scored_once(tmp_path, capsys):
    (tmp_path / "heldout.json").write_text("{}")
    assert main(["--set", "heldout", "--out", str(tmp_path)]) == 2
    assert "scored once" in capsys.readouterr().err


def test_a_draw_that_is_not_there_is_refused_in_one_line(tmp_path, capsys):
    from bench.apps import harm, verdicts

    missing = str(tmp_path / "draws" / "7.yaml")
    assert main(["--set", "heldout", "--out", str(tmp_path), "--draw", missing]) == 2
    for measure in (harm, verdicts):
        assert (
            measure.main(["--set", "heldout", "--workdir", str(tmp_path), "--draw", missing]) == 2
        )
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3 and all(line.startswith(f"no {missing}") for line in lines), lines
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_measured_strikes_count_rejections_only_and_name_the_confirmed_card():
    from bench.apps.verdicts import summary

    tests = [
        {"card": "lr_down_10x", "verdict": "inconclusive"},
        {"card": "weight_decay_up", "verdict": "refused", "reason": "changes nothing"},
        {"card": "batch_up", "verdict": "rejected"},
        {"card": "warmup", "verdict": "confirmed"},
    ]
    assert summary(tests) == {"confirmed": "warmup", "strikes": 1}
    assert summary([{"card": "x", "verdict": "rejected"}] * 4) == {"confirmed": None, "strikes": 3}
    assert summary([]) == {"confirmed": None, "strikes": 0}
