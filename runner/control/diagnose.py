"""`hyprun check` (L0, before anything runs) and `hyprun diagnose` (L0 + L1 of a recorded run).

Evidence comes from the config, a sample of the data and MLflow; conclusions come from `diag`.
"""

from __future__ import annotations

import os
from dataclasses import asdict
from typing import Any

import numpy as np
import torch
from hydra.utils import instantiate
from rich.console import Console
from rich.table import Table

from diag.evidence import Evidence
from diag.static import DataSample, DeviceInfo, device_info, run_checks
from diag.triage import triage
from runner.errors import BadInput
from runner.store.tracking import latest_run, read_run, record_diagnosis

SAMPLE_ROWS = 2048
STATUS_STYLE = {"pass": "green", "warn": "yellow", "fail": "red", "skip": "dim"}


def data_sample(config: dict[str, Any], rows: int = SAMPLE_ROWS) -> DataSample:
    """The first training sequences the job sees and its held-out set, as numpy arrays."""
    try:
        source = instantiate(config["data"]["source"])
    except Exception as error:
        raise BadInput(f"data.source cannot be built for the static checks: {error}") from None
    x, y = source.train(0, rows, config["budget"]["data_seed"])
    heldout_x, _ = source.heldout(config["budget"]["eval_sequences"])
    return DataSample(train_x=x.numpy(), train_y=y.numpy(), heldout_x=heldout_x.numpy())


def this_device(world: int) -> DeviceInfo:
    """This machine's accelerator (or its RAM for a CPU job), looked up in the device table."""
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        return device_info(props.name, world, memory_gb=props.total_memory / 1e9)
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    return device_info("cpu", world, memory_gb=memory)


def static_checks(config: dict[str, Any], device: DeviceInfo | None = None) -> list[dict]:
    checks = run_checks(config, data_sample(config), device or this_device(1))
    return [_plain(asdict(c)) for c in checks]


def diagnose(uri: str, run_id: str | None, experiment: str) -> tuple[str, dict[str, Any]]:
    """(run id, diagnosis document) of a recorded run; the document is also logged on it."""
    run_id = run_id or latest_run(uri, experiment)
    if run_id is None:
        raise BadInput(
            f"no finished run in experiment {experiment!r} at {uri}: "
            "run a job first (hyprun train), or name one with --run"
        )
    try:
        config, series, tags = read_run(uri, run_id)
    except Exception as error:
        raise BadInput(f"cannot read run {run_id} from {uri}: {error}") from None
    world = int(tags.get("hyprun.world_size", "1"))
    evidence = Evidence(config, series, tags, static_checks(config, this_device(world)))
    document = {"run_id": run_id, **triage(evidence).to_dict(), "static": evidence.static}
    record_diagnosis(uri, run_id, document)
    return run_id, document


def render_checks(console: Console, checks: list[dict]) -> None:
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
        return
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
