"""`hyprun`: the command line.

Exit codes: 0 ok, 1 jobs failed (a test's verdict: error, not a strike), 2 refused or bad
input, 3 escalated, 75 interrupted (rerun to resume).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from rich.console import Console

from hyprun.runner.errors import BadInput, JobsFailed, TrackingOffline

console = Console(stderr=True, highlight=False, soft_wrap=True)


def cmd_train(args: argparse.Namespace) -> int:
    """One controlled job in this process, configured by Hydra overrides."""
    from hyprun.runner.compose import compose
    from hyprun.runner.job.validate import validate

    cfg = compose(args.overrides)
    validate(cfg)  # bad input is refused before torch's import, which takes seconds

    from hyprun.runner.job.train import EXIT_INTERRUPTED, run

    if cfg.tracking.run_name is None:
        cfg.tracking.run_name = " ".join(args.overrides) or "job"
    result = run(cfg)
    return EXIT_INTERRUPTED if result.status == "interrupted" else 0


def cmd_demo(args: argparse.Namespace) -> int:
    """The CPU demo: a planted fault diagnosed, tested and fixed; a data problem that escalates."""
    from hyprun.runner.cli.demo import run_demo

    run_demo(_store([*args.overrides, "tracking.experiment=hyprun-demo"]), seeds=args.seeds)
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    """L0 static checks of a config and a sample of its data, before anything runs."""
    from omegaconf import OmegaConf

    from hyprun.runner.compose import compose

    config = OmegaConf.to_container(compose(args.overrides), resolve=True)

    from hyprun.diag.static import device_info
    from hyprun.runner.control.diagnose import render_checks, static_checks, this_device

    device = this_device(args.world)
    if args.device:
        device = device_info(args.device, args.world, args.link_gbps, args.memory_gb)
    checks = static_checks(config, device)
    if args.json:
        print(json.dumps(checks, indent=2, default=str))
    else:
        render_checks(Console(highlight=False), checks)
    return 0


def cmd_diagnose(args: argparse.Namespace) -> int:
    """Triage a recorded run: the core question, the obvious checks, ranked findings."""
    from omegaconf import OmegaConf

    from hyprun.runner.compose import compose
    from hyprun.runner.control.diagnose import (
        default_run,
        diagnose,
        render_checks,
        render_diagnosis,
    )

    tracking = compose([]).tracking
    uri = args.uri or OmegaConf.select(tracking, "uri")
    experiment = args.experiment or tracking.experiment
    run_id = args.run or default_run(uri, experiment, args.investigation)
    run_id, document = diagnose(uri, run_id, experiment)
    if args.json:
        print(json.dumps(document, indent=2, default=str))
    else:
        out = Console(highlight=False)
        render_checks(out, [c for c in document["static"] if c["status"] != "pass"])
        render_diagnosis(out, document)
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    """Per-layer forward/backward time of a few steps of the configured model and data."""
    from rich.table import Table

    from hyprun.runner.compose import compose
    from hyprun.runner.job.profile import profile_layers

    found = profile_layers(compose(args.overrides), steps=args.steps)
    if args.json:
        print(json.dumps(found, indent=2))
        return 0
    table = Table(title=f"Per-layer time, mean of {args.steps} steps", title_justify="left")
    for column in ("module", "forward ms", "backward ms", "share"):
        table.add_column(column, justify="left" if column == "module" else "right")
    for name, row in sorted(found.items(), key=lambda item: -item[1]["share"]):
        table.add_row(
            name, f"{row['forward_ms']:.2f}", f"{row['backward_ms']:.2f}", f"{row['share']:.0%}"
        )
    Console(highlight=False).print(table)
    return 0


def _store(overrides: list[str] | None = None, experiment: str | None = None):
    """The investigations' MLflow store: the config's tracking URI and experiment. Commands find
    investigations in any experiment of the store unless `--experiment` names one."""
    from hyprun.runner.compose import compose
    from hyprun.runner.store.investigation import Store

    tracking = compose(overrides or []).tracking
    return Store(tracking.uri, experiment or tracking.experiment, pinned=experiment is not None)


def cmd_baseline(args: argparse.Namespace) -> int:
    """Record a baseline: k seeds of the config as controlled jobs, L0 checks, triage."""
    from hyprun.runner.cli.where import where_to_look
    from hyprun.runner.control.baseline import record_baseline
    from hyprun.runner.launch.app import HydraApp
    from hyprun.runner.launch.launchers import split

    name = args.investigation or time.strftime("inv-%Y%m%d-%H%M%S")
    app = HydraApp.load(args.app)  # a user's app (--app, or hyprun.yaml here), else ours
    if app is not None:  # refused before the store is touched (its own preflight too)
        app.admit(split(args.overrides)[0])
    store = _store([] if app else split(args.overrides)[0], args.experiment)
    state = record_baseline(store, name, args.overrides, args.seeds, args.why, app)
    console.print(
        f"baseline of investigation {state.name!r} recorded ({args.seeds} seeds, "
        f"parent run {state.run_id})"
    )
    document = store.json_artifact(state.run_id, "diagnosis.json") or {}
    from hyprun.runner.control.diagnose import next_step, render_top

    if document:
        render_top(Console(highlight=False, soft_wrap=True), document)
    for line in where_to_look(store, state, commands=False):
        console.print(line, markup=False)
    console.print(next_step(document), markup=False)  # a card in an app's own keys
    return 0


def cmd_test(args: argparse.Namespace) -> int:
    """Test one hypothesis (a card id or overrides changing one variable) against the baseline."""
    from hyprun.runner.control.controller import test

    store = _store(experiment=args.experiment)
    return test(
        store, args.investigation, args.hypothesis, args.why, args.max_seeds, args.max_tokens
    ).exit_code


def cmd_sweep(args: argparse.Namespace) -> int:
    """Search one variable with Optuna (Hydra sweep grammar); one verdict, one strike at most."""
    from hyprun.runner.control.sweep import sweep

    store = _store(experiment=args.experiment)
    return sweep(
        store, args.investigation, args.sweep, args.trials, args.why, args.parallel
    ).exit_code


def cmd_status(args: argparse.Namespace) -> int:
    """Where an investigation stands: baseline, tests, verdicts, strikes, Slurm jobs."""
    from rich.markup import escape
    from rich.table import Table

    from hyprun.runner.cli.where import where_to_look
    from hyprun.runner.launch.launchers import slurm_states
    from hyprun.runner.store.investigation import findings_lines

    store = _store(experiment=args.experiment)
    state = store.find(args.investigation)
    jobs = slurm_states({t.run_id: t.tags.get("slurm.jobs", "") for t in state.tests})
    rows = [
        {
            "test": f"H{t.number}",
            "delta": " ".join(t.delta),
            "compound": t.compound,
            "card": t.card,
            "verdict": t.verdict,
            "effect": t.tags.get("hyprun.effect", ""),
            "seeds": t.seeds_shown,
            "spent": t.tags.get("hyprun.spent", ""),
            "stopped": t.tags.get("hyprun.stopped", "")
            or (f"round {t.tags['hyprun.round']}" if "hyprun.round" in t.tags else ""),
            "reason": t.tags.get("hyprun.reason", ""),
            "by": t.user,
            "run_id": t.run_id,
            "slurm": jobs.get(t.run_id, {}),
        }
        for t in state.tests
    ]
    document = {
        "investigation": state.name,
        "experiment": store.experiment,
        "run_id": state.run_id,
        "baseline": state.baseline,
        "strikes": state.strikes,
        "escalated": state.escalated,
        "tests": rows,
    }
    if args.json:
        print(json.dumps(document, indent=2))
        return 0
    title = f"{state.name}: {state.strikes} strike(s)" + (" — escalated" if state.escalated else "")
    title = escape(title)  # names and deltas are the user's text, not rich markup
    table = Table(title=title, title_justify="left")
    columns = ["test", "delta", "verdict", "effect", "seeds", "spent", "stopped", "reason"]
    columns += ["by"] if any(row["by"] for row in rows) else []  # who ran it (a team's store)
    columns += ["slurm"] if jobs else []
    for column in columns:
        table.add_column(column, overflow="fold")
    for row in rows:
        slurm = " ".join(f"{job}:{state}" for job, state in row["slurm"].items())
        if row["compound"]:
            row = {**row, "delta": f"{row['delta']} (compound: {', '.join(row['compound'])})"}
        cells = [row[column] for column in columns if column != "slurm"]
        table.add_row(*(escape(str(cell)) for cell in cells), *([slurm] if jobs else []))
    out = Console(highlight=False, soft_wrap=True)
    out.print(table)
    for line in [*findings_lines(state), *where_to_look(store, state, commands=False)]:
        out.print(line, markup=False)
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    """After a confirmed test: the findings its fix removed, and why any still fires."""
    from hyprun.runner.control.verify import verify

    store = _store(experiment=args.experiment)
    result = verify(store, args.investigation, args.test, args.promote)
    if args.promote:
        console.print("the fixed config is now the investigation's baseline")
    return 0 if result["resolved"] or not result["still"] else 1


def cmd_report(args: argparse.Namespace) -> int:
    """Markdown and HTML with plots for an investigation, logged on its parent run."""
    from pathlib import Path

    from hyprun.runner.cli.report import write_report
    from hyprun.runner.cli.where import where_to_look

    store = _store(experiment=args.experiment)
    state = store.find(args.investigation)
    out = Path(args.out or f".hyprun/reports/{state.name}")
    markdown, page = write_report(store, state, out)
    console.print(f"report: {markdown} and {page} (also on MLflow run {state.run_id}, report/)")
    for line in where_to_look(store, state, commands=False):
        console.print(line, markup=False)
    return 0


def cmd_upload(args: argparse.Namespace) -> int:
    """Deliver the evidence a job kept on disk while its tracking server was away."""
    from hyprun.runner.store.spool import upload

    uri = args.uri or _store().uri
    count = upload(args.spool, uri)
    console.print(f"delivered {count} batches from {args.spool} to {uri}")
    return 0


def cmd_reset(args: argparse.Namespace) -> int:
    """Record a human decision on an escalated investigation and reopen it."""
    from hyprun.runner.control.escalation import reset

    state = reset(_store(experiment=args.experiment), args.investigation, args.by, args.reason)
    console.print(f"investigation {state.name!r} reopened by {args.by}: {args.reason}")
    return 0


NEWEST = "name (default: the newest one, open or escalated)"
"""Which investigation a command reads when none is named: one rule (`Store.find`)."""


class OneLineParser(argparse.ArgumentParser):
    """argparse whose refusal is one line, exit 2, like every other refusal (its own is the
    usage text plus the error; `hyprun test -x` is an option argparse does not know)."""

    def error(self, message: str) -> None:
        text = " ".join(f"{self.prog}: {message}".split())
        self.exit(2, f"hyprun: {text} (see '{self.prog} --help')\n")


def parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="hyprun", description="Diagnose ML training problems by evidence, not guesswork."
    )
    sub = p.add_subparsers(dest="command", required=True)
    commands = {}
    handlers = (
        ("train", cmd_train),
        ("demo", cmd_demo),
        ("check", cmd_check),
        ("diagnose", cmd_diagnose),
        ("profile", cmd_profile),
        ("baseline", cmd_baseline),
        ("test", cmd_test),
        ("sweep", cmd_sweep),
        ("status", cmd_status),
        ("reset", cmd_reset),
        ("verify", cmd_verify),
        ("report", cmd_report),
        ("upload", cmd_upload),
    )
    for name, fn in handlers:
        commands[name] = sub.add_parser(
            name, help=fn.__doc__.splitlines()[0], description=fn.__doc__
        )
        commands[name].set_defaults(fn=fn)
    commands["profile"].add_argument("--steps", type=int, default=5, help="steps to time")
    commands["reset"].add_argument("--by", required=True, help="who decided")
    commands["reset"].add_argument("--reason", required=True, help="what was decided and why")
    commands["verify"].add_argument("test", nargs="?", help="H<n> (default: the last confirmed)")
    commands["verify"].add_argument("--promote", action="store_true", help="fix -> new baseline")
    commands["report"].add_argument("--out", help="folder (default .hyprun/reports/NAME)")
    commands["upload"].add_argument("spool", help="the spool.jsonl a job named")
    commands["upload"].add_argument("--uri", help="MLflow tracking URI (default: the config's)")
    commands["baseline"].add_argument(
        "--investigation", help="the new one's name (default: inv-YYYYmmdd-HHMMSS)"
    )
    for name in ("test", "sweep", "status", "reset", "verify", "report"):
        commands[name].add_argument("--investigation", help=NEWEST)
    for name in ("baseline", "test", "sweep", "status", "reset", "verify", "report"):
        commands[name].add_argument(
            "--experiment", help="MLflow experiment (default: the config's)"
        )
    commands["baseline"].add_argument("--seeds", type=int, default=3, help="seeds (noise)")
    commands["demo"].add_argument("--seeds", type=int, default=3, help="seeds per baseline/test")
    commands["baseline"].add_argument("--why", default="", help="what prompted the investigation")
    commands["baseline"].add_argument(
        "--app", help="your Hydra app as package.module:function (declared in hyprun.yaml)"
    )
    commands["test"].add_argument("hypothesis", nargs="+", help="a card id, or overrides")
    commands["test"].add_argument("--why", required=True, help="I think [cause] because [evidence]")
    commands["test"].add_argument(
        "--max-seeds",
        type=int,
        help="seeds per side an undecided test may grow to, in rounds (default: verdict.yaml "
        "sequential.max_seeds; the baseline's count: one look, the fixed-k rule)",
    )
    commands["test"].add_argument(
        "--max-tokens",
        type=int,
        default=0,
        help="training tokens the test may spend on its seeds and added baseline seeds (an "
        "app whose metric step counts steps: steps) (default 0: no cap)",
    )
    sweep = commands["sweep"]
    sweep.add_argument(
        "sweep",
        nargs="+",
        help="KEY=SWEEP, e.g. 'optim.lr=tag(log, interval(1e-5, 1e-3))', plus launcher overrides",
    )
    sweep.add_argument("--trials", type=int, default=8, help="how many values to try")
    sweep.add_argument("--parallel", type=int, help="trials per job array on Slurm (default all)")
    sweep.add_argument("--why", required=True, help="I think [cause] because [evidence]")
    commands["status"].add_argument("--json", action="store_true", help="machine-readable output")
    for name in ("train", "demo", "check", "profile", "baseline"):
        commands[name].add_argument(
            "overrides", nargs="*", help="Hydra overrides, e.g. optim.lr=3e-4"
        )
    check = commands["check"]
    check.add_argument("--device", help="target device name, e.g. A100-40GB (default: this one)")
    check.add_argument("--memory-gb", type=float, help="target device memory in GB")
    check.add_argument("--link-gbps", type=float, help="all-reduce link bandwidth in Gbit/s")
    check.add_argument("--world", type=int, default=1, help="number of processes (GPUs)")
    diagnose = commands["diagnose"]
    diagnose.add_argument(
        "--run",
        help="MLflow run id (default: seed 0 of the investigation's baseline; with no "
        "investigation, the newest finished run)",
    )
    diagnose.add_argument("--investigation", help=NEWEST)
    diagnose.add_argument("--experiment", help="MLflow experiment (default: the config's)")
    diagnose.add_argument("--uri", help="MLflow tracking URI (default: the config's)")
    for name in ("check", "diagnose", "profile"):
        commands[name].add_argument("--json", action="store_true", help="machine-readable output")
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    try:
        code = args.fn(args)
    except (BadInput, JobsFailed, TrackingOffline) as error:
        console.print(f"hyprun: {' '.join(str(error).split())}", markup=False)  # one line
        code = error.exit_code
    sys.exit(code)


if __name__ == "__main__":
    main()
