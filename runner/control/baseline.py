"""The baseline: k seeds of the user's config, their seed-to-seed noise and triage's top findings,
recorded as a new investigation; and the baseline seeds a test adds later, each recorded once
whoever runs it.

    hyprun baseline [overrides]          k seeds of the user's config + L0 checks + triage
"""

from __future__ import annotations

import json
import math
import uuid
from typing import Any

from omegaconf import DictConfig

from hyprun.hypotheses.schema import Card, load_cards, override_key
from hyprun.runner.compose import compose
from hyprun.runner.control.context import (
    app_of,
    code_version,
    controller_id,
    drift_key,
    job_config,
    process_gone,
    slurm_names,
)
from hyprun.runner.control.fixed import card_keys, finding_cards
from hyprun.runner.control.standing import settle
from hyprun.runner.errors import BadInput, JobsFailed
from hyprun.runner.job.result import JobResult
from hyprun.runner.job.validate import reachable, validate
from hyprun.runner.launch.app import HydraApp
from hyprun.runner.launch.launchers import Failed, InProcess, Job, Slurm, launcher_for, split
from hyprun.runner.store.investigation import ARM, State, Store, baseline_claim_key


def record_baseline(
    store: Store,
    name: str,
    overrides: list[str],
    seeds: int,
    why: str,
    app: HydraApp | None = None,
) -> State:
    """Run the baseline's seeds as children of a new investigation, then triage seed 0.
    `app`: a user's Hydra app instead of our own job."""
    from hyprun.runner.control.diagnose import diagnose

    if seeds < 1:
        raise BadInput(f"--seeds {seeds}: a baseline needs at least one seed (3 measure noise)")
    overrides, launcher_overrides = split(overrides)
    if app is not None:  # refuse bad input before the investigation exists
        app.check(overrides)
    else:
        cfg = compose(overrides)
        validate(cfg)  # the quick refusals first, before torch's import
        from hyprun.runner.job.train import preflight  # as its seed jobs will check it

        preflight(cfg, build_data=True)
    reachable(store.uri)
    launcher = launcher_for(launcher_overrides, *slurm_names(name, "baseline"))
    parent = store.create(name, f"Baseline: {' '.join(overrides) or 'defaults'}. {why}".strip())
    tags = {"hyprun.role": "baseline", "hyprun.investigation": name, ARM: "baseline"}
    jobs = [
        Job(job_config(store, overrides, seed, parent, f"baseline · seed {seed}", tags, app))
        for seed in range(seeds)
    ]
    try:
        results = run_jobs(store, parent, launcher, jobs)
    except JobsFailed as error:
        store.tag(parent, {"hyprun.baseline_error": str(error)[:4000]})
        store.finish(parent, "FAILED")
        raise
    baseline = {
        "overrides": overrides,
        "launcher": launcher_overrides,
        "seeds": seeds,
        "config_hash": drift_key(overrides, app),
        "git_sha": code_version(app),
        "seed_runs": [r.run_id for r in results],
        **({"app": app.record(), "source": app.source_digest()} if app is not None else {}),
    }
    store.tag(parent, {"hyprun.baseline": json.dumps(baseline), "hyprun.why": why})
    noisy = (*NOISE_METRICS, app.metric().metric) if app is not None else NOISE_METRICS
    store.metrics(parent, seed_noise(store, baseline["seed_runs"], noisy))
    _, document = diagnose(store.uri, results[0].run_id, store.experiment)
    store.text(parent, json.dumps(document, indent=2, default=str), "diagnosis.json")
    findings = top_findings(document, load_cards())
    store.tag(
        parent, {"hyprun.findings": json.dumps(findings), "hyprun.question": _question(document)}
    )
    return settle(store, store.find(name))  # recorded; tests still join it, the UI shows it done


def run_jobs(
    store: Store, owner: str, launcher: InProcess | Slurm, jobs: list[Job]
) -> list[JobResult]:
    """Run the jobs; their Slurm ids go on the `owner` run; any failure fails them all."""
    outcomes = launcher.run(jobs, lambda ids: store.tag(owner, {"slurm.jobs": ",".join(ids)}))
    failed = [o.reason for o in outcomes if isinstance(o, Failed)]
    if failed:
        raise JobsFailed("; ".join(failed))
    return [o for o in outcomes if isinstance(o, JobResult)]


NOISE_METRICS = ("eval/loss", "train/loss", "perf/tokens_per_s")


def seed_noise(
    store: Store, run_ids: list[str], metrics: tuple[str, ...] = NOISE_METRICS
) -> dict[str, float]:
    """Mean and seed-to-seed std of each headline metric's last value, for the parent run."""
    import statistics

    found = {}
    for metric in metrics:
        # A diverged seed (NaN/inf) has no spread to measure; the triage reports it instead.
        last = [
            h[-1][1] for r in run_ids if (h := store.history(r, metric)) if math.isfinite(h[-1][1])
        ]
        if len(last) >= 2:
            name = metric.replace("/", "_")
            found[f"baseline/{name}_mean"] = statistics.fmean(last)
            found[f"baseline/{name}_std"] = statistics.stdev(last)
    return found


TOP_FINDINGS = 3


def top_findings(document: dict[str, Any], cards: dict[str, Card]) -> list[dict[str, Any]]:
    """Triage's top findings as the investigation keeps them (a parent-run tag): what each
    says, and the cards and config keys that would test it."""
    found = []
    for finding in document.get("findings", [])[:TOP_FINDINGS]:
        testing = finding_cards(finding, cards)
        variables = card_keys(testing, cards)
        if "deltas" in finding:  # a user's app: the cards that apply to it, in its keys
            testing = finding["cards"]
            variables = sorted({override_key(o) for d in finding["deltas"].values() for o in d})
        found.append(
            {
                "id": finding["id"],
                "cause": str(finding.get("cause", ""))[:300],
                "first_action": str(finding.get("first_action", ""))[:300],
                "cards": testing,
                "variables": variables,
            }
        )
    return found


def _question(document: dict[str, Any]) -> str:
    return str(document.get("question") or "none")


def claim_baseline_seed(store: Store, state: State, seed: int) -> bool:
    """Take the job of recording baseline seed `seed` (True), unless another live controller
    holds it. A claim whose controller died on this host without recording the seed is taken
    over at the next attempt number; the job then resumes from that controller's checkpoint."""
    me = f"{controller_id()}:{uuid.uuid4().hex[:8]}"
    attempt = 0
    while True:
        key = baseline_claim_key(state.baseline["config_hash"], seed, attempt)
        if store.once(state.run_id, key, me):
            return True
        holder = store.run(state.run_id).data.params.get(key, "")
        if not process_gone(holder.rsplit(":", 1)[0]):
            return False
        attempt += 1


def baseline_seed_config(store: Store, state: State, seed: int) -> DictConfig:
    """A baseline seed added after `hyprun baseline`: the baseline's config, recorded below the
    investigation as its other seeds are (the same config whoever runs it, so a takeover
    resumes the same MLflow run from its checkpoint)."""
    tags = {"hyprun.role": "baseline", "hyprun.investigation": state.name}
    name = f"baseline · seed {seed}"
    overrides = state.baseline["overrides"]
    return job_config(store, overrides, seed, state.run_id, name, tags, app_of(state))
