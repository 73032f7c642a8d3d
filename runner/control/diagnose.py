"""`hyprun check` (L0, before anything runs) and `hyprun diagnose` (L0 + L1 of a recorded run).

Evidence comes from the config, a sample of the data and MLflow; conclusions come from `diag`.
"""

from __future__ import annotations

import os
from dataclasses import asdict
from typing import Any

import numpy as np
from hydra.utils import instantiate
from rich.console import Console
from rich.table import Table

from hyprun.diag.evidence import Evidence
from hyprun.diag.static import DataSample, DeviceInfo, device_info, run_checks
from hyprun.diag.triage import triage
from hyprun.hypotheses.applies import unchanged_by
from hyprun.hypotheses.schema import load_cards
from hyprun.runner.errors import BadInput
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


def diagnose(uri: str, run_id: str | None, experiment: str) -> tuple[str, dict[str, Any]]:
    """(run id, diagnosis document) of a recorded run (default: see `default_run`); the
    document is also logged on it."""
    run_id = run_id or default_run(uri, experiment)
    try:
        config, series, tags = read_run(uri, run_id)
    except Exception as error:
        raise BadInput(f"cannot read run {run_id} from {uri}: {error}") from None
    world = int(tags.get("hyprun.world_size", "1"))
    # The L0 checks read our job's config and data; a user's app has its own (tag hyprun.app),
    # and a run the probe API recorded in someone's loop has none of ours.
    job = "hyprun.app" not in tags and is_job_config(config)
    static = static_checks(config, this_device(world)) if job else []
    evidence = Evidence(config, series, tags, static)
    document = {"run_id": run_id, **triage(evidence).to_dict(), "static": evidence.static}
    if not job:
        document["static_skipped"] = (
            "no L0 checks: the run has no hyprun job config (data.source, budget): a user's app, "
            "or a run recorded by the probe API in your own loop"
        )
    drop_noop_cards(document["findings"], config)
    record_diagnosis(uri, run_id, document)
    return run_id, document


def is_job_config(config: dict[str, Any]) -> bool:
    """Whether `config` is the built-in job's (the L0 checks read its data source and budget)."""
    data, budget = config.get("data"), config.get("budget")
    return isinstance(data, dict) and "source" in data and isinstance(budget, dict)


def drop_noop_cards(findings: list[dict[str, Any]], config: dict[str, Any]) -> None:
    """Remove from each finding the cards that would change nothing in this run's config (a
    rejected no-op still costs a strike); what was removed and why stays on the finding."""
    cards = load_cards()
    for finding in findings:
        kept, dropped = [], []
        for card_id in finding["cards"]:
            reason = unchanged_by(cards[card_id], config) if card_id in cards else None
            if reason:
                dropped.append({"card": card_id, "reason": reason})
            else:
                kept.append(card_id)
        finding["cards"] = kept
        if dropped:
            finding["cards_not_suggested"] = dropped


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
        _render_findings(console, findings)
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
    table.add_column("missing evidence", overflow="fold")
    table.add_column("patterns it would decide", overflow="fold")
    for need, rows in missing.items():
        table.add_row(need, ", ".join(rows))
    console.print(table)


def _render_findings(console: Console, findings: list[dict[str, Any]]) -> None:
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
            f"{f['evidence']}: {measured} [dim](severity {_fmt(f['severity'])})[/]",
            f["cause"],
            f["first_action"],
            ", ".join(f["cards"]),
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
        cards = ", ".join(f["cards"]) or "no card"
        console.print(f"  {rank}. {f['id']}: {f['evidence']} -> {cards}", markup=False)
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
