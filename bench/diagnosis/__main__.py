"""`python -m bench.diagnosis`: every scenario through the method, then one table.

    python -m bench.diagnosis [--only NAME ...] [--seeds K] [--max-seeds K] [--jobs N]
                              [--out DIR] [--workdir DIR]

Scenarios run in parallel, one process each (`--jobs`, default: one per core, with one torch
thread each), each in its own folder with its own MLflow sqlite file (kept under --workdir for
`mlflow ui`). Scenarios marked `exclusive` (their verdict is a throughput) run afterwards, one
at a time with every core: a neighbour's load would otherwise swamp the effect.
The table goes to stdout and to DIR/latest.md and DIR/latest.json.

Verdicts are sequential (seeds in rounds up to the verdict table's cap) unless `--max-seeds`
caps them; a test never has fewer seeds than its baseline, so `--max-seeds 1` is the fixed-k
rule at each scenario's own seeds, for a side-by-side run.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from bench.diagnosis.run import DEFAULT_SEEDS, Scenario, load_scenarios, run_logged, worker_setup
from bench.diagnosis.table import render_markdown, summarize, write


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    common, scenarios = load_scenarios()
    if args.only:
        unknown = sorted(set(args.only) - {s.name for s in scenarios})
        if unknown:
            print(f"unknown scenario(s): {', '.join(unknown)}", file=sys.stderr)
            return 2
        scenarios = [s for s in scenarios if s.name in args.only]
    from hyprun.runner.provenance import git_state

    sha, dirty = git_state()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="hyprun-bench-")).resolve()
    cpus = os.cpu_count() or 1
    seeds = describe_seeds(scenarios, args.seeds)
    threads = max(1, cpus // args.jobs)
    shared = [s for s in scenarios if not s.exclusive]
    alone = [s for s in scenarios if s.exclusive]
    print(
        f"{len(shared)} scenarios {args.jobs} at a time ({threads} thread(s) each), then "
        f"{len(alone)} throughput scenarios alone; seeds {seeds}; logs and MLflow files "
        f"in {workdir}",
        file=sys.stderr,
    )
    start = time.monotonic()
    rule = (args.seeds, args.max_seeds)
    done = run_all(shared, common, rule, args.jobs, workdir, threads, sha)
    done += run_all(alone, common, rule, 1, workdir, cpus, sha)
    order = {s.name: i for i, s in enumerate(scenarios)}
    results = sorted(done, key=lambda r: order[r["name"]])
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "commit": sha,
        "dirty": dirty,
        "seeds": seeds,
        "rule": "fixed-k"
        if args.max_seeds == 1
        else f"sequential to {args.max_seeds or 'the cap'}",
        "jobs": args.jobs,
        "cpus": os.cpu_count(),
        "wall_seconds": round(time.monotonic() - start, 1),
        "common": common,
    }
    summary = summarize(results)
    print(render_markdown(results, summary, meta))
    write(Path(args.out), results, summary, meta)
    return 0


def describe_seeds(scenarios: list[Scenario], seeds: int | None) -> str:
    """ "2", or "2 (3: a, b)" when some scenarios run their own number of seeds."""
    if seeds is not None:
        return str(seeds)
    own = [f"{s.seeds}: {s.name}" for s in scenarios if s.seeds and s.seeds != DEFAULT_SEEDS]
    return f"{DEFAULT_SEEDS}" + (f" ({', '.join(own)})" if own else "")


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.diagnosis",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--only", nargs="+", metavar="NAME", help="run only these scenarios")
    parser.add_argument(
        "--seeds",
        type=int,
        help="seeds per baseline and test, for every "
        "scenario (default: the scenario's own, else 2)",
    )
    parser.add_argument(
        "--max-seeds",
        type=int,
        help="seeds per side a test may grow to (default: the verdict table's cap; "
        "1: fixed-k verdicts at the baseline's seeds)",
    )
    parser.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, help="scenarios run at once"
    )
    parser.add_argument(
        "--out",
        default=str(Path(__file__).with_name("results")),
        help="folder for latest.md and latest.json",
    )
    parser.add_argument("--workdir", help="folder for the scenarios' MLflow files and logs")
    args = parser.parse_args(argv)
    if any(n is not None and n < 1 for n in (args.seeds, args.max_seeds, args.jobs)):
        parser.error("--seeds, --max-seeds and --jobs must be >= 1")
    return args


def run_all(
    scenarios: list[Scenario],
    common: list[str],
    rule: tuple[int | None, int | None],
    jobs: int,
    workdir: Path,
    threads: int,
    sha: str,
) -> list[dict[str, Any]]:
    """Results in the scenarios' order; each scenario in a fresh worker process. `rule`: the
    seeds every scenario starts with (None: its own) and the cap a test may grow to."""
    seeds, max_seeds = rule
    context = multiprocessing.get_context("spawn")
    results: dict[str, dict[str, Any]] = {}
    with ProcessPoolExecutor(
        jobs,
        mp_context=context,
        initializer=worker_setup,
        initargs=(threads, sha),
        max_tasks_per_child=1,
    ) as pool:
        futures = {
            pool.submit(
                run_logged,
                s,
                workdir / s.name,
                seeds or s.seeds or DEFAULT_SEEDS,
                common,
                max_seeds,
            ): s
            for s in scenarios
        }
        for future in as_completed(futures):
            scenario = futures[future]
            result = future.result()
            results[scenario.name] = result
            print(
                f"{scenario.name}: rank {result['rank']}, "
                f"{' '.join(t['verdict'] for t in result['tests']) or 'no tests'}, "
                f"{result['seconds']:.0f} s"
                + (f" ERROR {result['error']}" if result["error"] else ""),
                file=sys.stderr,
            )
    return [results[s.name] for s in scenarios]


if __name__ == "__main__":
    raise SystemExit(main())
