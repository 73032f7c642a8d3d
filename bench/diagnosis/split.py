"""`python -m bench.diagnosis.split`: the fault families on the kept split, triage-only.

    python -m bench.diagnosis.split [--set heldout healthy_heldout healthy tuning] [--only NAME ...]
                                    [--workdir DIR] [--out DIR]
    python -m bench.diagnosis.split --rediagnose --workdir DIR   # tables changed, same runs
    python -m bench.diagnosis.split --draw SEED                  # print a fresh held-out set

The held-out sets are frozen together with diag/ (bench/frozen.py): a draw records diag_sha256
(a top-level key of split.yaml, printed by --draw), and a run that includes `heldout` or
`healthy_heldout` is refused while diag/ differs from it, or when the draw recorded none.

Every entry of split.yaml is one seed of one job, run in this process one after another (a
process per job would pay torch's and DeepSpeed's start-up each time), then `diagnose`d as a
user would: where does the true cause rank among the findings, and which findings fire on
healthy runs. Results accumulate in DIR/split.json after each entry, so a rerun with the same
--workdir continues where it stopped.

Then, per fault with a fixing card, the strikes and tokens to the fix when cards are tried
  (a) in hyprun's order: the cards of the ranked findings, as `hyprun diagnose` shows them;
  (b) in random order: every card that changes the config, uniformly shuffled (the mean of
      2,000 shuffles with a fixed seed);
  (c) in the classic plateau report's order: the cards carrying its `claimed` effect, by the
      report's confidence, then the order the report lists them.
This part is a SIMULATION from the ranked findings, not measured verdicts: a card in the
family's `fix` list is taken to be confirmed and every other card rejected (a strike; three
escalate). The end-to-end benchmark (python -m bench.diagnosis) measures the verdicts
themselves on its fault scenarios.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from bench.diagnosis.families import (
    FIXED_OPTIMIZER,
    FIXED_SHAPE,
    MAGNITUDES,
    SGD_SHAPES,
    SHAPES,
    STATIC,
    STRUCTURAL,
    THROUGHPUT,
    instance_overrides,
    name_of,
    reference_key,
)
from bench.frozen import diag_sha256, refusal, scored_draw
from hyprun.diag.triage import cause_rank

ROOT = Path(__file__).resolve().parents[2]

SPLIT = Path(__file__).with_name("split.yaml")
SETS = ("heldout", "healthy_heldout", "healthy", "tuning")
HEALTHY_SETS = ("healthy_heldout", "healthy")
HELD_OUT = {"heldout", "healthy_heldout"}  # scored only with diag/ as the draw recorded it
EXPERIMENT = "bench-split"
STRIKES = 3
SEEDS_PER_TEST = 3  # `hyprun baseline --seeds 3`: what each tried card costs in tokens
HARM = 0.02
"""A planted fault counts as harmful at this budget when its held-out loss ends more than 2%
above the healthy run of the same shape and optimizer (or it diverged); a fault that does no
harm is listed but not scored: there is nothing to diagnose. Loader delay (time), duplicates
(seen in the data by L0) and MoE collapse (idle experts) are always scored."""
SHUFFLES = 2000
KEY = ("family", "m", "shape", "optim", "seed")
DRAW_PER_FAMILY = 3
HELDOUT_DRAW = 20261218
"""The seed split.yaml's held-out set was drawn with (`--draw HELDOUT_DRAW`); a test checks it.
Seeds are taken in date order; one whose draw misses a shape or an optimizer is skipped before
anything runs (20261205 drew no gpt_small entry, 20261210 no post4 one, 20261215 neither),
since the held-out set must cover them all."""
DRAW_SEEDS = range(62, 66)
"""Seeds of a fresh draw: 0-61 are the tuning set's, spent draws included (the second to
fifteenth draws, 2026-12-01 to 04, used 6-9, 10-13, 14-17, 18-21, 22-25, 26-29, 30-33, 34-37,
38-41, 42-45, 46-49, 50-53, 54-57 and 58-61)."""
CLASSIC_LISTING = [
    "lr_down_10x",
    "sched_cosine_warm_restarts",
    "adamw_betas",
    "adamw_weight_decay",
    "batch_up",
    "dedup",
    "trim_padding",
    "loader_workers",
    "prefetch",
    "fp16_loss_scale",
    "bf16",
    "grad_clip",
    "pre_norm",
    "rmsnorm",
    "swiglu",
    "rope",
    "activation_checkpointing",
    "zero_stage",
]
"""The order the classic report lists its recommendations (/work/shared/seeds/000_*.txt), the
tie-break among cards of equal claimed confidence."""


def load_split(path: Path = SPLIT) -> dict[str, Any]:
    return yaml.safe_load(Path(path).read_text())


def reference_of(item: dict[str, Any], healthy: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The healthy entry an entry's harm is judged against (families.reference_key): the same
    shape and optimizer with no overrides of its own, or the same depth for a family that sets
    its own."""
    wanted = reference_key(item)
    for entry in healthy:
        key = (entry.get("shape", "tiny2"), entry.get("optim", "adamw"), entry.get("overrides", []))
        if key == wanted:
            return entry
    return None


def draw(seed: int, per_family: int, seeds: range, taken: set[tuple]) -> list[dict[str, Any]]:
    """A fresh held-out set: per family, `per_family` entries at magnitudes drawn in the
    family's range, on a drawn shape and optimizer, with a drawn seed, none repeating `taken`
    (family, m, shape, optim, seed) keys. Drawn by a seeded generator, not picked by hand, so
    the entries owe nothing to what the tables were tuned on."""
    rng = np.random.default_rng(seed)
    entries: list[dict[str, Any]] = []
    for family, (low, high, scale) in MAGNITUDES.items():
        while sum(e["family"] == family for e in entries) < per_family:
            entry = {"family": family, "m": _magnitude(rng, low, high, scale)}
            entry["optim"] = FIXED_OPTIMIZER.get(family) or str(rng.choice(["adamw", "sgd"]))
            shapes = SGD_SHAPES if entry["optim"] == "sgd" else tuple(SHAPES)
            entry["shape"] = FIXED_SHAPE.get(family) or str(rng.choice(shapes))
            entry["seed"] = int(rng.choice(seeds))
            key = tuple(entry[k] for k in KEY)
            if key not in taken:
                taken.add(key)
                entries.append(entry)
    return entries


def _magnitude(rng: np.random.Generator, low: float, high: float, scale: str) -> float:
    if scale == "integer":
        return int(rng.integers(int(low), int(high) + 1))
    if scale == "log":
        value = float(np.exp(rng.uniform(np.log(low), np.log(high))))
    else:
        value = float(rng.uniform(low, high))
    return float(f"{value:.2g}")


def run_entry(
    item: dict[str, Any], common: list[str], workdir: Path, context: dict
) -> dict[str, Any]:
    """One job of one entry, diagnosed; a plain result dict (errors are results too)."""
    from omegaconf import OmegaConf

    from hyprun.runner.compose import compose
    from hyprun.runner.job.train import run

    name = name_of(item)
    start = time.monotonic()
    overrides, plant = instance_overrides(item, context)
    uri = f"sqlite:///{workdir}/mlflow.db"
    out: dict[str, Any] = {"name": name, "item": item, "overrides": overrides, "error": None}
    if plant is not None:
        out.update(cause=plant.cause, fix=plant.fix)
    try:
        cfg = compose(
            [
                *common,
                f"tracking.uri={uri}",
                f"tracking.experiment={EXPERIMENT}",
                f"checkpoint.dir={workdir}/ckpt/{name.replace('/', '_')}",
                *overrides,
            ]
        )
        result = run(cfg)
        out.update(
            run_id=result.run_id,
            status=result.status,
            eval_loss=result.eval_loss,
            config=OmegaConf.to_container(cfg, resolve=True),
        )
        out.update(diagnosed(uri, result.run_id))
    except Exception as error:  # a broken entry is a result, not a crashed benchmark
        out["error"] = f"{type(error).__name__}: {error}"[:1000]
    out["seconds"] = round(time.monotonic() - start, 1)
    return out


def diagnosed(uri: str, run_id: str) -> dict[str, Any]:
    """The findings of a recorded run as `hyprun diagnose` ranks them, and its features."""
    from hyprun.runner.control.diagnose import diagnose

    _, document = diagnose(uri, run_id, EXPERIMENT)
    features = document["features"]
    return {
        "findings": [
            {"id": f["id"], "severity": f["severity"], "cards": f["cards"], "also": f["also"]}
            for f in document["findings"]
        ],
        "compute_s": (features.get("compute_s_best") or {}).get("value"),
        "features": {  # what healthy runs show, for thresholds read against them
            k: f["value"] for k, f in features.items() if isinstance(f["value"], int | float)
        },
    }


def rediagnose(workdir: Path) -> dict[str, dict]:
    """Diagnose every recorded run in workdir again with the current tables (seconds, not a
    rerun of the jobs): how a tuning iteration reads a table change."""
    store = workdir / "split.json"
    results: dict[str, dict] = json.loads(store.read_text())
    uri = f"sqlite:///{workdir}/mlflow.db"
    for result in results.values():
        if result.get("run_id"):
            result.update(diagnosed(uri, result["run_id"]))
        if "family" in result["item"]:  # the families' cause lists may have changed too
            _, plant = instance_overrides(result["item"], {"compute_s": 1.0})  # sleep unused
            result.update(cause=plant.cause, fix=plant.fix)
    store.write_text(json.dumps(results, indent=1, default=str))
    return results


def run_sets(
    sets: list[str], only: list[str] | None, workdir: Path, extra: list[str] = ()
) -> dict[str, dict]:
    """Run the chosen sets (with the healthy references they need first); returns results by
    name, continuing from workdir/split.json. `extra` overrides go after the common ones (a
    test's smaller budget)."""
    split = load_split()
    split["common"] = [*split["common"], *extra]
    store = workdir / "split.json"
    results: dict[str, dict] = json.loads(store.read_text()) if store.exists() else {}
    healthy = split["healthy"]

    def ensure(item: dict[str, Any], context: dict) -> dict[str, Any]:
        name = name_of(item)
        if name not in results or results[name].get("error"):
            results[name] = run_entry(item, split["common"], workdir, context)
            store.write_text(json.dumps(results, indent=1, default=str))
            r = results[name]
            top = [f["id"] for f in r.get("findings", [])][:3]
            error = r["error"] or ""
            print(f"{name}: {r.get('status')} {top} {r['seconds']} s {error}", flush=True)
        return results[name]

    for set_name in sets:
        for item in split[set_name]:
            if only and name_of(item) not in only:
                continue
            context: dict[str, Any] = {}
            reference = reference_of(item, healthy) if set_name not in HEALTHY_SETS else None
            if reference is not None:
                ref = ensure(reference, {})
                context = {"compute_s": ref.get("compute_s") or 0.02}
            ensure(item, context)
    return results


# ---------------------------------------------------------------- scoring


def rank_of(result: dict[str, Any]) -> int | None:
    return cause_rank(result.get("findings", []), result.get("cause", []))


def harmful(result: dict[str, Any], reference: dict[str, Any] | None) -> bool:
    family = result["item"]["family"]
    always = THROUGHPUT | STATIC | STRUCTURAL
    if family in always or result.get("status") == "diverged":
        return True
    fault, healthy = result.get("eval_loss"), (reference or {}).get("eval_loss")
    if fault is None or healthy is None or not np.isfinite(fault):
        return True
    return fault > healthy * (1 + HARM)


def failing(findings: list[dict[str, Any]]) -> list[str]:
    """Findings on a healthy run that are alarms: every one, with a card or not (a wrong cause
    named without a card still sends a user down the wrong path)."""
    return [f["id"] for f in findings]


def card_orders(result: dict[str, Any], cards: dict, rng: np.random.Generator) -> dict[str, Any]:
    """Strikes and tests to the fix under the three orders (simulated, see the docstring)."""
    from hyprun.hypotheses.applies import unchanged_by

    config = result.get("config") or {}
    useful = [c for c in sorted(cards) if unchanged_by(cards[c], config) is None]
    fix = set(result["fix"])
    hyprun = list(dict.fromkeys(c for f in result.get("findings", []) for c in f["cards"]))
    classic = sorted(
        (c for c in useful if cards[c].claimed is not None),
        key=lambda c: (
            -float(str(cards[c].claimed.confidence or "0").rstrip("%") or 0),
            CLASSIC_LISTING.index(c) if c in CLASSIC_LISTING else len(CLASSIC_LISTING),
        ),
    )
    out = {"hyprun": _strikes(hyprun, fix), "classic": _strikes(classic, fix)}
    shuffled = [_strikes(list(rng.permutation(useful)), fix) for _ in range(SHUFFLES)]
    out["random"] = {
        "strikes": float(np.mean([s["strikes"] for s in shuffled])),
        "fixed": float(np.mean([s["fixed"] for s in shuffled])),
        "tests": float(np.mean([s["tests"] for s in shuffled])),
    }
    return out


def _strikes(order: list[str], fix: set[str]) -> dict[str, Any]:
    """Cards tried in `order` until a fix (confirmed) or the third rejection (escalated); an
    order that runs out of cards first also ends with a human, counted as escalated."""
    for tried, card in enumerate(order):
        if tried >= STRIKES:
            break
        if card in fix:
            return {"strikes": tried, "fixed": True, "tests": tried + 1}
    return {"strikes": STRIKES, "fixed": False, "tests": min(len(order), STRIKES)}


def summarize(results: dict[str, dict], sets: list[str]) -> dict[str, Any]:
    from hyprun.hypotheses.schema import load_cards

    split = load_split()
    cards = load_cards()
    rng = np.random.default_rng(15)
    summary: dict[str, Any] = {}
    for set_name in ("heldout", "tuning"):
        if set_name not in sets:
            continue
        rows = []
        for item in split[set_name]:
            r = results.get(name_of(item))
            if r is None:
                continue
            ref = reference_of(item, split["healthy"])
            ref_result = results.get(name_of(ref)) if ref else None
            row = {
                "name": r["name"],
                "rank": rank_of(r),
                "findings": [f["id"] for f in r.get("findings", [])],
                "harmful": harmful(r, ref_result),
                "eval_loss": r.get("eval_loss"),
                "healthy_eval_loss": (ref_result or {}).get("eval_loss"),
                "status": r.get("status"),
                "error": r.get("error"),
                "fix": r.get("fix", []),
            }
            if r.get("fix") and not r.get("error"):
                row["orders"] = card_orders(r, cards, rng)
            rows.append(row)
        scored = [row for row in rows if row["harmful"]]
        summary[set_name] = {
            "rows": rows,
            "scored": len(scored),
            "not_harmful": [row["name"] for row in rows if not row["harmful"]],
            "top1": _share(scored, lambda row: row["rank"] == 1),
            "top3": _share(scored, lambda row: row["rank"] is not None and row["rank"] <= 3),
            "top1_all": _share(rows, lambda row: row["rank"] == 1),
            "top3_all": _share(rows, lambda row: row["rank"] is not None and row["rank"] <= 3),
            "orders": _orders_summary([row for row in scored if "orders" in row]),
        }
    for set_name in HEALTHY_SETS:
        if set_name not in sets:
            continue
        rows = []
        for item in split[set_name]:
            r = results.get(name_of(item))
            if r is not None:
                findings = r.get("findings", [])
                rows.append(
                    {
                        "name": r["name"],
                        "findings": [f["id"] for f in findings],
                        "failing": failing(findings),
                        "eval_loss": r.get("eval_loss"),
                        "error": r.get("error"),
                    }
                )
        summary[set_name] = {
            "rows": rows,
            "clean": _share(rows, lambda row: not row["failing"] and not row["error"]),
        }
    return summary


def _share(rows: list[dict], hit) -> dict[str, Any]:
    n = sum(bool(hit(row)) for row in rows)
    return {"hits": n, "of": len(rows), "share": n / len(rows) if rows else None}


def _orders_summary(rows: list[dict]) -> dict[str, Any]:
    out = {}
    for order in ("hyprun", "random", "classic"):
        strikes = [row["orders"][order]["strikes"] for row in rows]
        fixed = [row["orders"][order]["fixed"] for row in rows]
        tests = [row["orders"][order]["tests"] for row in rows]
        out[order] = {
            "mean_strikes": float(np.mean(strikes)) if rows else None,
            "fixed": float(np.mean(fixed)) if rows else None,
            "mean_tests": float(np.mean(tests)) if rows else None,
        }
    return out


def render(summary: dict[str, Any], meta: dict[str, Any]) -> str:
    """The Markdown report: held-out first, then tuning (in-sample), then healthy runs (those
    that set nothing first)."""
    tokens = meta["budget_tokens"] * SEEDS_PER_TEST
    lines = [
        f"# Fault families on the kept split ({meta['date']}, commit {meta['commit'][:7]}, "
        f"{meta['wall_seconds'] / 60:.1f} min)",
        "",
        *(
            [f"Re-diagnosed from the runs recorded in {meta['workdir']} (no job rerun).", ""]
            if meta.get("rediagnosed")
            else []
        ),
        "One seed per entry, triage only; card orders simulated (a card in the fix list "
        "confirms, every other is a strike; 3 strikes escalate; each test "
        f"{SEEDS_PER_TEST} seeds x {meta['budget_tokens']} tokens).",
        "",
    ]
    for set_name, title in (("heldout", "Held-out"), ("tuning", "Tuning (in-sample)")):
        if set_name not in summary:
            continue
        s = summary[set_name]
        lines += [
            f"## {title}",
            "",
            f"- top-1: {_pct(s['top1'])}, top-3: {_pct(s['top3'])} of {s['scored']} harmful "
            f"faults (all {len(s['rows'])} entries: top-1 {_pct(s['top1_all'])}, "
            f"top-3 {_pct(s['top3_all'])})",
            f"- no measurable harm at this budget (listed, not scored): "
            f"{', '.join(s['not_harmful']) or 'none'}",
            "",
            "| order | mean strikes to the fix | fixed within 3 strikes | mean tests | tokens |",
            "| --- | --- | --- | --- | --- |",
        ]
        for order, o in s["orders"].items():
            if o["mean_strikes"] is None:
                continue
            lines.append(
                f"| {order} | {o['mean_strikes']:.2f} | {o['fixed']:.0%} | "
                f"{o['mean_tests']:.2f} | {o['mean_tests'] * tokens / 1e3:.0f}k |"
            )
        lines += ["", "| entry | rank | findings (ranked) | eval vs healthy | strikes h/r/c |"]
        lines += ["| --- | --- | --- | --- | --- |"]
        for row in s["rows"]:
            orders = row.get("orders")
            strikes = (
                f"{orders['hyprun']['strikes']}/{orders['random']['strikes']:.1f}/"
                f"{orders['classic']['strikes']}"
                if orders
                else "no fix card"
            )
            lines.append(
                f"| {row['name']}{'' if row['harmful'] else ' (no harm)'} | "
                f"{row['rank'] or '-'} | {', '.join(row['findings'][:4]) or 'none'}"
                f"{' ERROR ' + row['error'][:80] if row['error'] else ''} | "
                f"{_num(row['eval_loss'])} vs {_num(row['healthy_eval_loss'])} | {strikes} |"
            )
        lines.append("")
    titles = {
        "healthy_heldout": "Healthy runs that set nothing (held out)",
        "healthy": "Healthy runs (thresholds are read against them: in-sample)",
    }
    for set_name, title in titles.items():
        if set_name not in summary:
            continue
        s = summary[set_name]
        lines += [
            f"## {title}",
            "",
            f"- no finding at all: {_pct(s['clean'])}",
            "",
            "| config | every finding | eval loss |",
            "| --- | --- | --- |",
        ]
        for row in s["rows"]:
            lines.append(
                f"| {row['name']} | {', '.join(row['findings']) or 'none'}"
                f"{' ERROR ' + row['error'][:80] if row['error'] else ''} | "
                f"{_num(row['eval_loss'])} |"
            )
        lines.append("")
    return "\n".join(lines) + "\n"


def _pct(share: dict[str, Any]) -> str:
    if share["share"] is None:
        return "n/a"
    return f"{share['share']:.0%} ({share['hits']}/{share['of']})"


def _num(x: Any) -> str:
    return f"{x:.3f}" if isinstance(x, int | float) else "-"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.diagnosis.split", description=__doc__)
    parser.add_argument("--set", nargs="+", choices=SETS, default=list(SETS), dest="sets")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="only these entries")
    parser.add_argument("--workdir", help="MLflow file, checkpoints and split.json (resumable)")
    parser.add_argument("--out", default=str(Path(__file__).with_name("results")))
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument(
        "--rediagnose",
        action="store_true",
        help="diagnose the runs already in --workdir again with the current tables (no jobs)",
    )
    parser.add_argument(
        "--draw", type=int, metavar="SEED", help="print a fresh held-out set drawn with SEED"
    )
    args = parser.parse_args(argv)
    if args.rediagnose and not (args.workdir and Path(args.workdir, "split.json").exists()):
        needs = "--rediagnose needs --workdir DIR holding an earlier run's split.json"
        print(needs, file=sys.stderr)
        return 2
    if args.draw is not None:
        split = load_split()
        taken = {tuple(e.get(k) for k in KEY) for e in split["tuning"]}
        print(f"diag_sha256: {diag_sha256()}  # diag/ as drawn (bench/frozen.py)")
        print("heldout:")
        for entry in draw(args.draw, DRAW_PER_FAMILY, DRAW_SEEDS, taken):
            # yaml writes 3e-05 as 3.0e-05: YAML 1.1 reads a float without a dot as a string
            flow = yaml.safe_dump(entry, default_flow_style=True, sort_keys=False, width=200)
            print("  - " + flow.strip())
        return 0
    held_out = HELD_OUT & set(args.sets)
    if held_out and (why := refusal(SPLIT, HELDOUT_DRAW)):
        print(f"{why} (or score --set tuning healthy)", file=sys.stderr)
        return 2
    if str(ROOT) not in sys.path:  # the planted models are imported by name, from any cwd
        sys.path.insert(0, str(ROOT))
    import torch

    from hyprun.runner.provenance import git_state

    torch.set_num_threads(args.threads)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="hyprun-split-")).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    sha, dirty = git_state()
    start = time.monotonic()
    os.chdir(workdir)  # MLflow's default artifact root is relative to the cwd
    results = rediagnose(workdir) if args.rediagnose else run_sets(args.sets, args.only, workdir)
    summary = summarize(results, args.sets)
    common = load_split()["common"]
    budget = next(int(o.split("=")[1]) for o in common if o.startswith("budget.tokens="))
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "commit": sha,
        "dirty": dirty,
        "wall_seconds": round(time.monotonic() - start, 1),
        "budget_tokens": budget,
        "sets": args.sets,
        "workdir": str(workdir),
        "rediagnosed": args.rediagnose,
        "diag_sha256": diag_sha256(),  # as the scores are written
        "draw": scored_draw(SPLIT, HELDOUT_DRAW) if held_out else None,
    }
    text = render(summary, meta)
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "split" if set(args.sets) == set(SETS) else "split-" + "-".join(sorted(args.sets))
    (out / f"{stem}.md").write_text(text)
    (out / f"{stem}.json").write_text(json.dumps({"meta": meta, "summary": summary}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
