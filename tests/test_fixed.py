"""`hyprun verify` explains a finding that survives a confirmed fix: its numbers before and after,
whether the fix moved them toward healthy, whether the fix was tested for it, and the next step.

The documents are the demo's (`hyprun demo`, planted LR 1e-4, H1 lr_up_10x confirmed), cut to
the features the rows read; the rows and cards are the shipped ones."""

from __future__ import annotations

from hyprun.diag.fixed import finding_changes
from hyprun.diag.triage import load_tables
from hyprun.hypotheses.schema import load_cards
from hyprun.runner.control.fixed import fixed_lines
from hyprun.runner.control.verify import by_reading
from hyprun.runner.store.investigation import Test

SCAN = "held-out loss lowest at 8x the step taken (scanned 0/1/2/4/8x)"
LR_UP = Test("run", 1, ["optim.lr=0.001"], "optim.lr", "lr_up_10x", "confirmed", 0, {})


def document(findings: list[str], **values: float) -> dict:
    """A diagnosis document: the findings that fired, the features measured."""
    features = {
        name: {"value": value, "detail": f"{name} measured"} for name, value in values.items()
    }
    if "step_best_multiple" in features:
        features["step_best_multiple"]["detail"] = SCAN
    causes = {"noisy_labels": "noisy training labels", "loss_flat": "LR too low, or a wrong loss"}
    return {
        "findings": [
            {"id": f, "cause": causes.get(f, "LR too low"), "first_action": "check", "cards": []}
            for f in findings
        ],
        "features": features,
    }


def verified(before: dict, after: dict, promoted: bool = False) -> str:
    rows = {row.id: row for row in load_tables()}
    return "\n".join(
        fixed_lines(LR_UP, finding_changes(before, after, rows), load_cards(), promoted)
    )


DEMO_BEFORE = document(
    ["loss_flat", "steps_too_short"],
    loss_rel_drop=0.0344,
    update_ratio_median=0.000569,
    step_best_multiple=8.0,
    lr=1e-4,
)


def test_the_demos_surviving_finding_is_explained_with_its_numbers_and_the_next_card():
    after = document(
        ["steps_too_short"],
        loss_rel_drop=0.201,
        update_ratio_median=0.00374,
        step_best_multiple=8.0,
        lr=1e-3,
    )
    said = verified(DEMO_BEFORE, after)
    assert "gone: loss_flat, which H1 was tested for: loss_rel_drop 0.0344 → 0.201" in said
    assert "(fires when < 0.11; toward healthy)" in said
    assert "still firing: steps_too_short, which H1 was tested for too (not moved)" in said
    assert "step_best_multiple 8 → 8 (fires when >= 8.0; not moved); lr 0.0001 → 0.001" in said
    assert f"measured on the fix: {SCAN}" in said  # 8x is the largest multiple scanned
    assert "H1 did not move it: LR too low may still hold" in said
    assert "'hyprun verify H1 --promote', then 'hyprun test lr_up_10x --why ...'" in said
    promoted = verified(DEMO_BEFORE, after, promoted=True)
    assert "on the fixed config (now the baseline): 'hyprun test lr_up_10x --why ...'" in promoted


def test_a_reading_merged_into_a_finding_is_verified_on_its_own():
    """Triage writes the demo's baseline as one finding of one cause: steps_too_short, with the
    flat loss merged into it (`also`). Verify reads each row, so the flat loss is still gone."""
    merged = document(
        ["steps_too_short"], **{k: v["value"] for k, v in DEMO_BEFORE["features"].items()}
    )
    merged["findings"][0]["also"] = [{"id": "loss_flat", "evidence": "the loss barely moved"}]
    after = document(["steps_too_short"], loss_rel_drop=0.201, step_best_multiple=8.0)
    said = verified(by_reading(merged), by_reading(after))
    assert "gone: loss_flat, which H1 was tested for: loss_rel_drop 0.0344 → 0.201" in said
    assert "still firing: steps_too_short, which H1 was tested for too" in said
    assert "gone: loss_flat" not in verified(merged, after)  # by finding, the reading is lost


def test_a_finding_moved_toward_healthy_but_not_past_its_threshold():
    after = document(
        ["loss_flat", "steps_too_short"],
        loss_rel_drop=0.08,
        update_ratio_median=0.002,
        step_best_multiple=8.0,
    )
    said = verified(DEMO_BEFORE, after)
    assert "still firing: loss_flat, which H1 was tested for too (toward healthy)" in said
    assert "H1 moved it toward healthy, not past the threshold: LR too low, or a wrong loss" in said


def test_another_finding_and_a_new_one_are_told_apart_from_the_tested_one():
    before = document(["noisy_labels"], eval_gap_matched_nats=-0.4, loss_rel_drop=0.03)
    after = document(
        ["noisy_labels", "steps_too_short"], eval_gap_matched_nats=-0.5, step_best_multiple=8.0
    )
    said = verified(before, after)
    assert "still firing: noisy_labels, another finding: H1 did not test it (away from" in said
    assert "eval_gap_matched_nats -0.4 → -0.5 (fires when < -0.25; away from healthy)" in said
    assert "noisy training labels: check; no card tests it: a human checks" in said
    assert "new on the fix: steps_too_short: step_best_multiple unmeasured → 8" in said


def test_on_an_app_the_next_card_is_named_in_its_keys_and_only_cards_that_apply():
    def in_app_keys(doc: dict) -> dict:
        for finding in doc["findings"]:  # as diagnose words an app's findings (its knobs)
            finding["cards"] = ["lr_up_10x"]
            finding["deltas"] = {"lr_up_10x": ["training.learning_rate=*10"]}
        return doc

    after = in_app_keys(
        document(["steps_too_short"], loss_rel_drop=0.201, step_best_multiple=8.0, lr=1e-3)
    )
    said = verified(in_app_keys(DEMO_BEFORE), after)
    assert "'hyprun test lr_up_10x --why ...' (runs training.learning_rate=*10)" in said
    # a card the app cannot run (no knob) is not offered as the next step
    after["findings"][0].update(cards=[], deltas={})
    assert "no card tests it: a human checks" in verified(in_app_keys(DEMO_BEFORE), after)
