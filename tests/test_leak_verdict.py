"""A test that removes a leak is its fix (runner/control/verdicts.py, leak_fixed): the corpus
loop with its causal mask missing reads a loss far better than the model is; switching the mask
back on reads worse, and the controller confirms it because the leak's invariant
(causal_mask_missing, static.yaml flatters_loss) failed in every baseline seed and holds in every
seed of the test. A test that leaves the leak in place is judged by its metric alone. So too a
table row marked flatters_loss: the eval loss divided by the batch count inside the batch loop
reads far below the model's loss (eval_loss_wrong_normaliser), and dividing once after it reads
worse, confirmed because the row fired in every baseline seed and in no seed of the test."""

from __future__ import annotations

from bench.corpus.run import run_row
from bench.corpus.schema import all_rows
from hyprun.runner.control import controller
from hyprun.runner.control.verdicts import leak_fixed
from hyprun.runner.store.investigation import Store


def test_a_verdict_is_changed_only_by_a_removed_leak():
    rejected = {"status": "rejected", "reason": "eval_loss +60%"}
    assert leak_fixed(rejected, []) == rejected
    fixed = leak_fixed(rejected, ["causal_mask_missing"])
    assert fixed["status"] == "confirmed" and fixed["leaks_removed"] == ["causal_mask_missing"]
    assert "eval_loss +60%" in fixed["reason"]


def test_the_code_fix_of_a_leak_is_confirmed_though_the_loss_reads_worse(workdir):
    row = next(r for r in all_rows() if r.id == "causal_mask_missing")
    result = run_row(row, workdir)
    assert result["error"] is None and result["rank"] == 1
    assert result["confirmed"] == f"{row.switch}=false"
    store = Store(f"sqlite:///{workdir.resolve()}/mlflow.db", "bench-corpus")
    fix = controller.test(store, row.id, ["optim.lr=*0.5"], "a change that keeps the leak")
    assert "leaks_removed" not in fix.verdict
    (code_fix,) = [t for t in store.find(row.id).tests if t.number == 1]
    assert code_fix.tags["hyprun.verdict"] == "confirmed"
    assert "removes a leak: causal_mask_missing" in code_fix.tags["hyprun.reason"]
    assert code_fix.tags["hyprun.strike"] == "false"


def test_the_code_fix_of_a_wrong_eval_normaliser_is_confirmed_by_the_row_going_quiet(workdir):
    row = next(r for r in all_rows() if r.id == "eval_loss_divided_in_loop")
    result = run_row(row, workdir)
    assert result["error"] is None and result["rank"] == 1
    assert result["confirmed"] == f"{row.switch}=false"
    store = Store(f"sqlite:///{workdir.resolve()}/mlflow.db", "bench-corpus")
    (code_fix,) = [t for t in store.find(row.id).tests if t.number == 1]
    assert "removes a leak: eval_loss_wrong_normaliser" in code_fix.tags["hyprun.reason"]
    assert code_fix.tags["hyprun.strike"] == "false"
