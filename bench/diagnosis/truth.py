"""Each fault scenario's label, measured apart from the benchmark (python -m bench.diagnosis.truth).

`scenarios.yaml` says which cards remove each planted fault, and the benchmark scores a verdict
right or wrong against that list. A label is only as good as the measurement behind it: one seed
of a chaotic config (post-norm at a high LR moves 8-14% between seeds) is not one. This trains
the planted config, and the planted config with each card's delta, on truth seeds the benchmark
never uses (100 and up; the benchmark's are 0 to its cap, 7), K per side (6, or as many as the
scenario was measured with before), and reports each card's effect on its primary metric with
the Mann-Whitney U test (scipy.stats.mannwhitneyu, one-sided) and the change of the median.

A rank test and the median, not Welch's t on the mean: a fault's outcomes are heavy-tailed.
Unclipped SGD left 11 of 12 seeds near 5.3 and blew one up to an eval loss of 2.4e7 without a
NaN; Welch's test read that seed as variance (p = 0.17) although clipping improved the median
26%. Post-norm runs are bimodal (some seeds never learn).

A card **removes** the fault when its median improves the primary by at least the card's
min_effect with p < 0.05, or when planted runs diverge and all the card's runs finish no worse
than the planted runs that did. The benchmark's labels are taken from this table, never from the
runs it scores.

    python -m bench.diagnosis.truth [--families] [--only NAME ...] [--cards ID ...] [--seeds K]
    python -m bench.diagnosis.truth [--families] --rescore   # the recorded rows, current rule

A partial run (--only, --cards) replaces its own rows in results/truth.json and keeps the rest.
With --families the same is done for the fault families' fix lists (bench/diagnosis/families.py),
which the family benchmark's card-order comparison takes as the truth: each family is planted as
its first tuning instance in split.yaml, and the results go to results/truth_families.*.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from scipy import stats

from bench.diagnosis.run import Scenario, load_scenarios
from hyprun.hypotheses.schema import load_cards

RESULTS = Path(__file__).with_name("results")
FIRST_TRUTH_SEED = 100
DEFAULT_SEEDS = 6
MIN_SEEDS = 4
"""One-sided Mann-Whitney on n a side bottoms out at p = 1 / C(2n, n): 0.05 at 3, 0.014 at 4."""
ALPHA = 0.05
LOADER_COMPUTE_S = 0.05
"""Compute seconds per step the loader-delay family sizes its sleep against here (the split
reads it from a healthy run; the truth of "more workers remove the wait" does not hinge on it)."""


def family_scenarios() -> tuple[list[str], list[Scenario]]:
    """Each fault family planted as its first tuning instance, as a scenario whose label is the
    family's fix list."""
    from bench.diagnosis.families import THROUGHPUT, instance_overrides, name_of
    from bench.diagnosis.split import load_split

    split = load_split()
    first: dict[str, dict] = {}
    for item in split["tuning"]:
        first.setdefault(item["family"], item)
    scenarios = []
    for family, item in first.items():
        overrides, plant = instance_overrides(item, {"compute_s": LOADER_COMPUTE_S})
        scenarios.append(
            Scenario(
                name=family,
                kind="fault",
                fault=name_of(item),
                base=(),
                plant=tuple(o for o in overrides if not o.startswith("budget.seed=")),
                cause=tuple(plant.cause),
                fix=tuple(plant.fix),
                exclusive=family in THROUGHPUT,
            )
        )
    return split["common"], scenarios


def train_once(overrides: list[str], seed: int, folder: Path, threads: int) -> dict[str, float]:
    """One `hyprun train` in its own folder (its own MLflow file); the run's summary numbers."""
    import mlflow

    folder.mkdir(parents=True, exist_ok=True)
    root = str(Path(__file__).resolve().parents[2])  # the faults' models import from bench/
    # A world and a store of its own, whatever this process inherited: the process group of a
    # job run in this process (its MASTER_PORT is taken) and MLflow's run id or server.
    own = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if k not in own and not k.startswith("MLFLOW_")}
    env.update(OMP_NUM_THREADS=str(threads), PYTHONPATH=root)
    store = f"sqlite:///{folder}/mlflow.db"
    command = [sys.executable, "-m", "hyprun.runner.cli.main", "train", *overrides]
    command += [f"budget.seed={seed}", f"tracking.uri={store}"]
    done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True)
    if done.returncode not in (0, 1):  # 1: the run diverged, still a measurement
        raise RuntimeError(f"{' '.join(overrides)} seed {seed}: {done.stderr.strip()[-400:]}")
    client = mlflow.MlflowClient(store)
    (run,) = client.search_runs(client.search_experiments()[0].experiment_id)
    speeds = [m.value for m in client.get_metric_history(run.info.run_id, "perf/tokens_per_s")]
    loss = run.data.metrics.get("eval/loss", math.nan)
    return {
        "eval/loss": loss if math.isfinite(loss) else math.inf,
        "perf/tokens_per_s": statistics.median(speeds[1:] or speeds) if speeds else 0.0,
    }


def effect(planted: list[float], fixed: list[float], direction: str, min_effect: float) -> dict:
    """The card's relative improvement of the median and whether it removes the fault (see the
    module docstring for why a rank test). A diverged run's loss is inf: where the planted runs
    diverge, the card removes the fault when all its runs finish no worse than the planted runs
    that did."""
    diverged = sum(math.isinf(v) for v in planted), sum(math.isinf(v) for v in fixed)
    counts = {"diverged": list(diverged)}
    if diverged[1]:
        return {"improvement": None, "p": None, "removes": False, **counts}
    if diverged[0]:
        finished = [v for v in planted if math.isfinite(v)]
        no_worse = not finished or statistics.fmean(fixed) <= statistics.fmean(finished)
        return {"improvement": None, "p": None, "removes": no_worse, **counts}
    sign = 1.0 if direction == "max" else -1.0
    before, after = statistics.median(planted), statistics.median(fixed)
    improvement = sign * (after - before) / abs(before)
    alternative = "greater" if direction == "max" else "less"
    p = float(stats.mannwhitneyu(fixed, planted, alternative=alternative).pvalue)
    removes = improvement >= min_effect and p < ALPHA
    return {"improvement": improvement, "p": p, "removes": removes, **counts}


def measure(
    scenario: Scenario, common: list[str], cards: list[str], seeds: int, workdir: Path
) -> dict:
    """The planted config and each card on the truth seeds; one row per card."""
    from omegaconf import OmegaConf

    from hyprun.runner.compose import compose
    from hyprun.runner.control.one_variable import resolve_relative

    known = load_cards()
    planted = OmegaConf.to_container(compose([*common, *scenario.overrides]), resolve=True)
    cpus = os.cpu_count() or 1
    # A throughput truth runs alone with every core, as the benchmark runs it.
    threads, jobs = (cpus, 1) if scenario.exclusive else (1, cpus)
    sides = {"planted": [*common, *scenario.overrides]}
    sides.update(
        {card: [*sides["planted"], *resolve_relative(planted, known[card].delta)] for card in cards}
    )
    tasks = [(side, seed) for seed in range(seeds) for side in sides]  # interleaved: fair load
    with ThreadPoolExecutor(jobs) as pool:
        runs = pool.map(
            lambda task: train_once(
                sides[task[0]],
                FIRST_TRUTH_SEED + task[1],
                workdir / scenario.name / task[0] / str(task[1]),
                threads,
            ),
            tasks,
        )
        measured = list(zip(tasks, runs, strict=True))
    rows = []
    for card in cards:
        primary = known[card].primary
        values = {
            side: [run[primary.metric] for (name, _), run in measured if name == side]
            for side in ("planted", card)
        }
        row = effect(values["planted"], values[card], primary.direction, primary.min_effect)
        rows.append({"card": card, "metric": primary.metric, "seeds": seeds, **row, **values})
    return {"scenario": scenario.name, "fault": scenario.fault, "seeds": seeds, "cards": rows}


def merge(old: list[dict], new: list[dict]) -> list[dict]:
    """`old` with `new`'s rows in place of those of the same scenario and card."""
    merged = {result["scenario"]: dict(result) for result in old}
    for result in new:
        kept = merged.get(result["scenario"], {"cards": []})["cards"]
        measured = {row["card"] for row in result["cards"]}
        cards = [row for row in kept if row["card"] not in measured] + result["cards"]
        merged[result["scenario"]] = {**result, "cards": cards}
    return list(merged.values())


def rescore(results: list[dict]) -> list[dict]:
    """Every row's verdict again from its stored values, so one rule decides them all."""
    known = load_cards()
    for result in results:
        for row in result["cards"]:
            primary = known[row["card"]].primary
            planted, fixed = row["planted"], row[row["card"]]
            row.update(effect(planted, fixed, primary.direction, primary.min_effect))
    return results


def render(results: list[dict], labels: dict[str, tuple[str, ...]]) -> str:
    """The table, beside each scenario's labels (`fix`) in scenarios.yaml."""
    lines = [
        f"Labels measured on truth seeds {FIRST_TRUTH_SEED}+ (never the benchmark's), "
        f"Mann-Whitney one-sided p < {ALPHA} and a median change of at least the card's "
        "min_effect.",
        "",
        "| scenario | card | labelled a fix | measured: improvement (p) | removes the fault |",
        "| --- | --- | --- | --- | --- |",
    ]
    for result in results:
        for row in result["cards"]:
            seeds = row.get("seeds", result["seeds"])
            if row["improvement"] is None:
                planted, fixed = row["diverged"]
                shown = f"diverged {planted}/{seeds} → {fixed}/{seeds}"
            else:
                shown = f"{row['improvement']:+.1%} (p={row['p']:.3f}, {seeds} seeds)"
            labelled = "yes" if row["card"] in labels.get(result["scenario"], ()) else "no"
            removes = "yes" if row["removes"] else "no"
            lines.append(
                f"| {result['scenario']} | {row['card']} | {labelled} | {shown} | {removes} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.diagnosis.truth")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="these scenarios only")
    parser.add_argument(
        "--cards", nargs="+", metavar="ID", help="measure these cards (default: each fix list)"
    )
    parser.add_argument(
        "--seeds",
        type=int,
        help=f"truth seeds per side (default: {DEFAULT_SEEDS}, or as many as a scenario had)",
    )
    parser.add_argument(
        "--out", default=str(RESULTS), help="folder for truth.{md,json} (or truth_families.*)"
    )
    parser.add_argument(
        "--families", action="store_true", help="the fault families' fix lists (split.yaml)"
    )
    parser.add_argument(
        "--rescore",
        action="store_true",
        help="no jobs: the recorded rows again under the current rule and labels",
    )
    args = parser.parse_args(argv)
    if args.rescore and (args.only or args.cards or args.seeds is not None):
        print(
            "--rescore re-reads every recorded row: drop --only, --cards and --seeds",
            file=sys.stderr,
        )
        return 2
    common, scenarios = family_scenarios() if args.families else load_scenarios()
    stem = "truth_families" if args.families else "truth"
    labels = {s.name: s.fix for s in scenarios}
    scenarios = [
        s for s in scenarios if s.kind == "fault" and (not args.only or s.name in args.only)
    ]
    if not scenarios:
        print(
            f"no fault {'family' if args.families else 'scenario'} named {args.only}: see "
            f"bench/diagnosis/{'families.py' if args.families else 'scenarios.yaml'}",
            file=sys.stderr,
        )
        return 2
    unknown = sorted(set(args.cards or []) - set(load_cards()))
    if unknown:
        print(f"no card {', '.join(unknown)}: see hypotheses/*.yaml", file=sys.stderr)
        return 2
    if args.seeds is not None and args.seeds < MIN_SEEDS:
        needs = f"at least {MIN_SEEDS} seeds a side: below that the rank test cannot reach p < 0.05"
        print(f"--seeds {args.seeds}: {needs}", file=sys.stderr)
        return 2
    out = Path(args.out)
    store = out / f"{stem}.json"
    recorded = json.loads(store.read_text()) if store.exists() else []
    if args.rescore:
        if not recorded:
            print(f"--rescore needs a recorded {store}", file=sys.stderr)
            return 2
        results = rescore(recorded)
        page = out / f"{stem}.md"
        lines = page.read_text().splitlines() if page.exists() else []
        runs = [line for line in lines if line.startswith("Last run")]
        stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        footer = "\n".join([*runs, f"Rescored {stamp} from the recorded rows (no jobs run)."])
        publish(out, stem, results, render(results, labels) + "\n" + footer + "\n")
        return 0
    # By default a scenario's fix list and every card measured for it before: a label that
    # was changed to "no card fixes it" keeps the measurements that said so.
    before = {r["scenario"]: [row["card"] for row in r["cards"]] for r in recorded}
    had = {r["scenario"]: max(row.get("seeds", r["seeds"]) for row in r["cards"]) for r in recorded}
    workdir = Path(tempfile.mkdtemp(prefix="hyprun-truth-"))
    start = time.monotonic()
    results = []
    for scenario in sorted(scenarios, key=lambda s: s.exclusive):
        cards = args.cards or list(dict.fromkeys([*scenario.fix, *before.get(scenario.name, [])]))
        if cards:
            seeds = args.seeds or max(DEFAULT_SEEDS, had.get(scenario.name, 0))
            results.append(measure(scenario, common, cards, seeds, workdir))
            print(
                "\n".join(render(results[-1:], labels).splitlines()[-len(cards) :]), file=sys.stderr
            )
    results = rescore(merge(recorded, results))  # a partial run replaces only its own rows
    from hyprun.runner.provenance import git_state

    sha, dirty = git_state()
    minutes = (time.monotonic() - start) / 60
    stamp = f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {sha[:10]}"
    text = render(results, labels) + f"\nLast run {stamp}{' (dirty)' if dirty else ''}, "
    text += f"{minutes:.1f} min; its jobs' MLflow files in {workdir}\n"
    publish(out, stem, results, text)
    return 0


def publish(out: Path, stem: str, results: list[dict], text: str) -> None:
    """The table as out/STEM.md and the rows as out/STEM.json, and the table on stdout."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.md").write_text(text)
    (out / f"{stem}.json").write_text(json.dumps(results, indent=1))
    print(text)


if __name__ == "__main__":
    sys.exit(main())
