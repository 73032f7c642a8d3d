"""`hyprun`: the command line. Exit codes: 0 ok, 2 refused or bad input, 75 interrupted."""

from __future__ import annotations

import argparse
import sys

from rich.console import Console

from runner.errors import BadInput

console = Console(stderr=True, highlight=False, soft_wrap=True)


def cmd_train(args: argparse.Namespace) -> int:
    """One controlled job in this process, configured by Hydra overrides."""
    from runner.compose import compose
    from runner.train import EXIT_INTERRUPTED, run

    cfg = compose(args.overrides)
    if cfg.tracking.run_name is None:
        cfg.tracking.run_name = " ".join(args.overrides) or "job"
    result = run(cfg)
    return EXIT_INTERRUPTED if result.status == "interrupted" else 0


def cmd_demo(args: argparse.Namespace) -> int:
    """The CPU demo: a controlled baseline job of the tiny GPT on synthetic data, in MLflow."""
    from runner.compose import compose
    from runner.train import run

    cfg = compose(["budget=short", "checkpoint.resume=never", *args.overrides])
    cfg.tracking.run_name = "demo baseline"
    result = run(cfg)
    console.print(
        f"\nEvidence recorded in MLflow run {result.run_id} ({cfg.tracking.uri}).\n"
        f"Look at it:  mlflow ui --backend-store-uri {cfg.tracking.uri}"
    )
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hyprun", description="Diagnose ML training problems by evidence, not guesswork."
    )
    sub = p.add_subparsers(dest="command", required=True)
    for name, fn in (("train", cmd_train), ("demo", cmd_demo)):
        cmd = sub.add_parser(name, help=fn.__doc__.splitlines()[0], description=fn.__doc__)
        cmd.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. optim.lr=3e-4")
        cmd.set_defaults(fn=fn)
    return p


def main(argv: list[str] | None = None) -> None:
    args = parser().parse_args(argv)
    try:
        code = args.fn(args)
    except BadInput as error:
        console.print(f"hyprun: {error}", markup=False)
        code = BadInput.exit_code
    sys.exit(code)


if __name__ == "__main__":
    main()
