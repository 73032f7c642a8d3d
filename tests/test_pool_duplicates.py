"""Duplicate rates are the whole pool's, with the denominator named, and near-duplicates are
reported beside exact ones (issue 15: a 2,048-row sample read 10% near-duplicates as 0.2%)."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from hyprun.diag.evidence import Evidence
from hyprun.diag.triage import triage
from hyprun.runner.compose import compose
from hyprun.runner.control.diagnose import static_checks


def checks_of(*overrides: str) -> dict[str, dict]:
    config = OmegaConf.to_container(compose(list(overrides)), resolve=True)
    return {c["id"]: c for c in static_checks(config)}


def test_exact_and_near_rates_over_the_whole_pool():
    checks = checks_of(
        "data.source.n_train=16384",
        "data.source.duplicate_frac=0.4",
        "data.source.near_duplicate_frac=0.1",
    )
    exact, near = checks["duplicates"], checks["near_duplicates"]
    assert exact["value"] == pytest.approx(0.36, abs=0.03)  # 40% planted, 10% overwritten
    assert near["value"] == pytest.approx(0.10, abs=0.01)
    assert "of all 16384 rows of the training pool" in exact["threshold"]
    assert "of all 16384 rows of the training pool" in near["threshold"]
    findings = triage(Evidence({}, {}, {}, list(checks.values()))).findings
    # one cause, both readings: one dedup pass removes both
    assert [(f.id, [also["id"] for also in f.also]) for f in findings] == [
        ("duplicates", ["near_duplicates"])
    ]


def test_dedup_leaves_no_duplicate_finding():
    checks = checks_of(
        "data.source.duplicate_frac=0.4",
        "data.source.near_duplicate_frac=0.1",
        "data.source.dedup=true",
    )
    assert checks["duplicates"]["status"] == checks["near_duplicates"]["status"] == "pass"
