"""`hyprun demo`: the method end to end on a CPU, in a few minutes, against local MLflow.

1. A planted fault (the LR 10x too low): record a baseline, diagnose it, test the cards the
   findings point to, one at a time, until one is confirmed; then verify which findings the fix
   removed, and why any that still fires does (its numbers before and after, the next card).
2. A planted data problem (60% of the labels are noise) attacked with the classic plateau
   report's recipe tweaks: each is rejected, and the third rejection escalates to a human.
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.rule import Rule

from hyprun.hypotheses.schema import cards_for, load_cards
from hyprun.runner.cli.where import where_to_look
from hyprun.runner.control import controller, verify
from hyprun.runner.control.baseline import record_baseline
from hyprun.runner.control.diagnose import diagnose
from hyprun.runner.control.standing import headline
from hyprun.runner.store.investigation import Store, findings_lines

COMMON = [
    "budget.tokens=65536",
    "budget.eval_every_tokens=16384",
    "probes.every_steps=4",
    "checkpoint.resume=never",
]
FAULT = ["optim.lr=1e-4"]
DATA_PROBLEM = ["data.source.label_noise=0.6"]
REPORT_TWEAKS = ["lr_down_10x", "batch_up", "micro_batch_up"]
console = Console(highlight=False, soft_wrap=True)  # commands and links stay whole lines


def run_demo(store: Store, seeds: int = 3) -> dict[str, str]:
    """Both investigations; returns their names."""
    stamp = time.strftime("%H%M%S")
    fixed = planted_fault(store, f"demo-low-lr-{stamp}", seeds)
    escalated = data_problem(store, f"demo-noisy-labels-{stamp}", seeds)
    console.print(Rule("Compare the runs"))
    for name in (fixed, escalated):
        state = store.find(name)
        console.print(f"{name}: {headline(state)}", markup=False)
        for line in where_to_look(store, state):
            console.print(f"  {line}", markup=False)
    return {"fixed": fixed, "escalated": escalated}


def show_findings(state) -> None:
    for line in findings_lines(state):
        console.print(line, markup=False)


def planted_fault(store: Store, name: str, seeds: int) -> str:
    console.print(Rule(f"Investigation {name}: loss barely moves"))
    state = record_baseline(store, name, [*COMMON, *FAULT], seeds, "loss is flat")
    _, diagnosis = diagnose(store.uri, state.baseline["seed_runs"][0], store.experiment)
    findings = [f["id"] for f in diagnosis["findings"]]
    console.print(f"diagnosis: question {diagnosis['question']}")
    show_findings(state)
    for card in cards_for(findings, load_cards()):
        if not _changes_something(state, card.delta):
            continue
        outcome = controller.test(store, name, [card.id], card.statement)
        if outcome.exit_code == controller.EXIT_ESCALATED or outcome.verdict is None:
            break
        if outcome.verdict["status"] == "confirmed":
            verify.verify(store, name, outcome.test)
            break
    return name


def data_problem(store: Store, name: str, seeds: int) -> str:
    console.print(Rule(f"Investigation {name}: the loss plateaus high"))
    state = record_baseline(store, name, [*COMMON, *DATA_PROBLEM], seeds, "plateau")
    show_findings(state)
    console.print("the classic plateau report's recipe tweaks, one at a time:")
    cards = load_cards()
    for card_id in REPORT_TWEAKS:
        outcome = controller.test(store, name, [card_id], cards[card_id].statement)
        if outcome.exit_code == controller.EXIT_ESCALATED:
            break
    # One more, to show that an escalated investigation refuses further tests.
    refused = controller.test(store, name, ["rmsnorm"], cards["rmsnorm"].statement)
    console.print(f"a fourth test after escalation: exit code {refused.exit_code}")
    show_findings(store.find(name))  # the lesson: the evidence pointed elsewhere
    return name


def _changes_something(state, delta: tuple[str, ...]) -> bool:
    from hyprun.runner.control.one_variable import measure
    from hyprun.runner.errors import BadInput

    try:
        measure(state.baseline["overrides"], list(delta))
    except BadInput:
        return False
    return True
