"""`hyprun check` (L0, before anything runs) and `hyprun diagnose` (L0 + L1 of a recorded run).

Evidence comes from the config, a sample of the data and MLflow; conclusions come from `diag`.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from typing import Any

import numpy as np
from hydra.utils import instantiate
from rich.console import Console
from rich.table import Table

from hyprun.diag.evidence import Evidence
from hyprun.diag.features import KNOBS_TAG, why_unmeasured
from hyprun.diag.live_checks import read_l0_tags
from hyprun.diag.static import DataSample, DeviceInfo, device_info, run_checks
from hyprun.diag.triage import triage
from hyprun.hypotheses.applies import reversed_key, unchanged, unchanged_by
from hyprun.hypotheses.schema import Card, load_cards
from hyprun.runner.errors import BadInput
from hyprun.runner.launch.knobs import Knob, from_dicts, translate
from hyprun.runner.store.investigation import Store
from hyprun.runner.store.tracking import latest_run, read_run, record_diagnosis

SAMPLE_ROWS = 2048
"""Rows read from a source without a finite pool (token and text files: random windows)."""
MAX_POOL_ROWS = 1 << 18
"""A pool up to this size is read whole for the data checks (exact duplicates by hashing every
row, near ones by MinHash + LSH over every row: ~5 s for 65,536 rows of 64 tokens)."""
STATUS_STYLE = {"pass": "green", "warn": "yellow", "fail": "red", "skip": "dim"}


def data_sample(config: dict[str, Any], rows: int = SAMPLE_ROWS) -> DataSample:
    """The training data the job sees and its held-out set, as numpy arrays: the whole pool
    (its first epoch) when the source has a finite one, else the first `rows` sequences."""
    try:
        source = instantiate(config["data"]["source"])
    except Exception as error:
        raise BadInput(f"data.source cannot be built for the static checks: {error}") from None
    pool = getattr(source, "pool_size", None)
    whole = isinstance(pool, int) and 0 < pool <= MAX_POOL_ROWS
    x, y = source.train(0, pool if whole else rows, config["budget"]["data_seed"])
    heldout_x, _ = source.heldout(config["budget"]["eval_sequences"])
    return DataSample(
        train_x=x.numpy(), train_y=y.numpy(), heldout_x=heldout_x.numpy(), whole_pool=whole
    )


def this_device(world: int) -> DeviceInfo:
    """This machine's accelerator (or its RAM for a CPU job), looked up in the device table."""
    import torch  # here, not at the top: `hyprun check --help` and its refusals need no torch

    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        return device_info(props.name, world, memory_gb=props.total_memory / 1e9)
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    return device_info("cpu", world, memory_gb=memory)


def static_checks(config: dict[str, Any], device: DeviceInfo | None = None) -> list[dict]:
    checks = run_checks(config, data_sample(config), device or this_device(1))
    return [_plain(asdict(c)) for c in checks]


def default_run(uri: str, experiment: str, investigation: str | None = None) -> str:
    """The run `hyprun diagnose` reads when none is named: seed 0 of the baseline of the named
    (else the newest) investigation, where the evidence a user asks about lives; with no
    investigation at all, the newest finished run (e.g. a plain `hyprun train`)."""
    try:
        state = Store(uri, experiment).find(investigation)
    except BadInput:
        if investigation is not None:
            raise
        state = None
    if state is not None and state.baseline and state.baseline.get("seed_runs"):
        return state.baseline["seed_runs"][0]
    if state is not None:
        raise BadInput(
            f"investigation {state.name!r} has no recorded baseline yet: run 'hyprun baseline' "
            "first, or name a run with --run"
        )
    run_id = latest_run(uri, experiment)
    if run_id is None:
        raise BadInput(
            f"no finished run in experiment {experiment!r} at {uri}: "
            "run a job first (hyprun train), or name one with --run"
        )
    return run_id


def read_evidence(uri: str, run_id: str) -> tuple[Evidence, bool]:
    """A recorded run's evidence, and whether the run is our job's (its L0 checks read from its
    config and data) rather than an app's or a probed loop's (read from the live optimizer)."""
    try:
        config, series, tags = read_run(uri, run_id)
    except Exception as error:
        raise BadInput(f"cannot read run {run_id} from {uri}: {error}") from None
    world = int(tags.get("hyprun.world_size", "1"))
    # The L0 checks read our job's config and data; a user's app has its own (tag hyprun.app),
    # and a run the probe API recorded in someone's loop has none of ours.
    job = "hyprun.app" not in tags and is_job_config(config)
    static = static_checks(config, this_device(world)) if job else live_static(tags)
    return Evidence(config, series, tags, static), job


def diagnose(uri: str, run_id: str | None, experiment: str) -> tuple[str, dict[str, Any]]:
    """(run id, diagnosis document) of a recorded run (default: see `default_run`); the
    document is also logged on it."""
    run_id = run_id or default_run(uri, experiment)
    evidence, job = read_evidence(uri, run_id)
    config, tags = evidence.config, evidence.tags
    document = {"run_id": run_id, **triage(evidence).to_dict(), "static": evidence.static}
    document["why_unmeasured"] = why_unmeasured(tags, list(document["missing_evidence"]))
    if not job:
        document["static_skipped"] = (
            "L0 checks of the optimizer and model as the probe read them at the first steps; "
            "none of the data, memory or loader: the run has no hyprun job config (a user's "
            "app, or a run recorded by the probe API in your own loop)"
            if evidence.static
            else "no L0 checks: the run has no hyprun job config (data.source, budget) and no "
            "probe read its optimizer"
        )
    # A user's app: its cards in its own keys, through the knobs its seed run recorded.
    knobs = from_dicts(json.loads(tags.get(KNOBS_TAG, "{}"))) if "hyprun.app" in tags else None
    drop_noop_cards(document["findings"], config, knobs)
    drop_reversing_cards(document["findings"])
    record_diagnosis(uri, run_id, document)
    return run_id, document


def live_static(tags: dict[str, str]) -> list[dict]:
    """The L0 checks the probe made of a live optimizer and model (tags hyprun.l0_checks*)."""
    return read_l0_tags(tags)


def is_job_config(config: dict[str, Any]) -> bool:
    """Whether `config` is the built-in job's (the L0 checks read its data source and budget)."""
    data, budget = config.get("data"), config.get("budget")
    return isinstance(data, dict) and "source" in data and isinstance(budget, dict)


def drop_noop_cards(
    findings: list[dict[str, Any]], config: dict[str, Any], knobs: dict[str, Knob] | None = None
) -> None:
    """Remove from each finding the cards that would change nothing in this run's config (a
    rejected no-op still costs a strike); what was removed and why stays on the finding.
    `knobs`: a user's app's (runner/launch/knobs.py): each card kept is translated into the
    app's keys (`deltas`), one that does not translate is removed with why, and the knobs it
    needs are listed to declare (`knobs_to_declare`)."""
    cards = load_cards()
    for finding in findings:
        kept, dropped, deltas, missing = [], [], {}, []
        for card_id in finding["cards"]:
            card = cards.get(card_id)
            reason = unchanged_by(card, config) if card and knobs is None else None
            if card and knobs is not None:
                translated = translate(card, knobs, config)
                reason = translated.reason or translated.noop
                reason = reason or unchanged(translated.overrides, config)
                deltas[card_id] = list(translated.overrides)
                missing += [translated.missing] if translated.missing else []
            if reason:
                dropped.append({"card": card_id, "reason": reason})
            else:
                kept.append(card_id)
        finding["cards"] = kept
        if dropped:
            finding["cards_not_suggested"] = dropped
        if knobs is not None:
            finding["deltas"] = {card: deltas[card] for card in kept}
            finding["knobs_to_declare"] = sorted(set(missing))


def drop_reversing_cards(findings: list[dict[str, Any]]) -> None:
    """Remove from each symptom the cards that move a key the other way from a card of a cause
    ranked above it: the loss can sit flat because the LR is far too high as well as too low,
    and once a cause (the LR outside the L0 band) names the direction, testing the symptom's
    opposite card costs a strike whatever the first test says. Why stays on the finding."""
    cards = load_cards()
    causes: list[tuple[str, Card]] = []  # (finding id, card) of the causes ranked so far
    for finding in findings:
        mine = [cards[card] for card in finding["cards"] if card in cards]
        if not finding.get("symptom"):
            causes += [(finding["id"], card) for card in mine]
            continue
        for card in mine:
            undone = (
                (c, theirs, key) for c, theirs in causes if (key := reversed_key(card, theirs))
            )
            if (first := next(undone, None)) is None:
                continue
            cause, theirs, key = first
            finding["cards"].remove(card.id)
            finding.get("deltas", {}).pop(card.id, None)
            finding.setdefault("cards_not_suggested", []).append(
                {
                    "card": card.id,
                    "reason": f"moves {key} the other way from {theirs.id}, the card of {cause} "
                    "(a cause ranked above this symptom)",
                }
            )


def named_cards(finding: dict[str, Any]) -> str:
    """A finding's cards as a user runs them: in an app's keys where they were translated
    (`lr_up_10x (training.learning_rate=*10)`), or the knobs to declare when none applies."""
    deltas = finding.get("deltas", {})
    named = [
        f"{card} ({' '.join(deltas[card])})" if card in deltas else card
        for card in finding["cards"]
    ]
    if named:
        return ", ".join(named)
    if finding.get("knobs_to_declare"):
        return f"no card applies: {declare(finding['knobs_to_declare'])}"
    return "no card"


def declare(knobs: list[str]) -> str:
    """The hyprun.yaml entry that would make cards apply to an app."""
    entries = ", ".join(f"{knob}: <your key>" for knob in knobs)
    return f"declare knobs: {{{entries}}} in hyprun.yaml"


def next_step(document: dict[str, Any]) -> str:
    """What to run next: the top finding's first card (in an app's keys), else the knobs to
    declare so that a card applies."""
    for finding in document.get("findings", []):
        if finding["cards"]:
            card = finding["cards"][0]
            delta = finding.get("deltas", {}).get(card)
            runs = f"  (runs {' '.join(delta)})" if delta else ""
            return f"next: hyprun test {card} --why ...{runs}"
    for finding in document.get("findings", []):
        if finding.get("knobs_to_declare"):
            knobs = declare(finding["knobs_to_declare"])
            return f"next: {knobs}, so the cards of {finding['id']} apply"
    return "next: hyprun test CARD --why ...  (the top finding's cards first)"


def render_checks(console: Console, checks: list[dict]) -> None:
    if not checks:
        return
    table = Table(title="L0 static checks", title_justify="left")
    for column in ("check", "status", "value", "threshold", "why"):
        table.add_column(column, overflow="fold")
    for c in checks:
        style = STATUS_STYLE.get(c["status"], "")
        table.add_row(
            c["id"], f"[{style}]{c['status']}[/]", _fmt(c["value"]), c["threshold"], c["why"]
        )
    console.print(table)


def render_diagnosis(console: Console, document: dict[str, Any]) -> None:
    console.print(
        f"[bold]Run {document['run_id']}[/]  core question: [bold]{document['question']}[/]"
    )
    obvious = Table(title="Check the obvious first", title_justify="left")
    for column in ("check", "status", "details"):
        obvious.add_column(column, overflow="fold")
    for item in document["obvious"]:
        style = STATUS_STYLE.get(item["status"], "")
        obvious.add_row(
            item["check"], f"[{style}]{item['status']}[/]", "; ".join(item.get("details", []))
        )
    console.print(obvious)
    findings = document["findings"]
    if not findings:
        console.print("[green]No pattern fired: no finding to test.[/]")
    else:
        render_findings(console, findings)
        console.print(next_step(document), markup=False)
    render_missing(console, document)


def render_missing(console: Console, document: dict[str, Any]) -> None:
    """What the run did not record, and which table rows were therefore not judged."""
    if document.get("static_skipped"):
        console.print(f"[dim]{document['static_skipped']}[/]")
    missing = document.get("missing_evidence") or {}
    if not missing:
        return
    table = Table(
        title="Not judged: evidence this run lacks (skipped, not guessed)", title_justify="left"
    )
    why = document.get("why_unmeasured") or {}
    table.add_column("missing evidence", overflow="fold")
    table.add_column("patterns it would decide", overflow="fold")
    if why:
        table.add_column("why this run cannot record it", overflow="fold")
    for need, rows in missing.items():
        table.add_row(need, ", ".join(rows), *([why.get(need, "")] if why else []))
    console.print(table)


def render_findings(console: Console, findings: list[dict[str, Any]]) -> None:
    table = Table(title="Findings, most likely first", title_justify="left")
    for column in ("#", "group", "evidence (measured)", "likely cause", "first action", "cards"):
        table.add_column(column, overflow="fold")
    for rank, f in enumerate(findings, 1):
        measured = "; ".join(f["details"]) or ", ".join(
            f"{k}={_fmt(v)}" for k, v in f["numbers"].items()
        )
        table.add_row(
            str(rank),
            f"{f['group']} ({f['question']})",
            f"{f['evidence']}: {measured} [dim](severity {_fmt(f['severity'])})[/]"
            + "".join(f"\nalso ({also['id']}): {also['evidence']}" for also in f.get("also", [])),
            f["cause"],
            f["first_action"],
            named_cards(f)
            + "".join(
                f"\n[dim]not suggested: {left['card']}: {left['reason']}[/]"
                for left in f.get("cards_not_suggested", [])
            ),
        )
    console.print(table)


def render_top(console: Console, document: dict[str, Any], top: int = 3) -> None:
    """The core question and the top findings with their cards, in a few lines (what
    `hyprun baseline` ends with; `hyprun diagnose` shows the full tables)."""
    console.print(f"core question: [bold]{document['question']}[/]")
    findings = document["findings"]
    if not findings:
        console.print("[green]No pattern fired: no finding to test.[/]")
    for rank, f in enumerate(findings[:top], 1):
        also = f" (+{len(f['also'])} more reading(s) of this cause)" if f.get("also") else ""
        console.print(
            f"  {rank}. {f['id']}: {f['evidence']}{also} -> {named_cards(f)}", markup=False
        )
    if len(findings) > top:
        console.print(f"  ... {len(findings) - top} more: hyprun diagnose", markup=False)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return "" if value is None else str(value)


def _plain(tree: Any) -> Any:
    """numpy scalars and arrays as plain Python, for JSON and MLflow."""
    if isinstance(tree, dict):
        return {k: _plain(v) for k, v in tree.items()}
    if isinstance(tree, list | tuple):
        return [_plain(v) for v in tree]
    if isinstance(tree, np.generic):
        return tree.item()
    return tree
