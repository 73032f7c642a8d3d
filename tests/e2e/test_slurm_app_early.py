"""Early rejection for a user's app on Slurm (issue 26 item 5): the HF Trainer app
(tests/apps/hf_gpt2) through the local cluster with `hydra/launcher=slurm_cpu`. The controller
polls the app's declared metric (`eval_loss`) from MLflow as the job array trains, and once a
clearly worse test's reject side fires it `scancel`s the test's jobs: the SIGTERM reaches the
app, whose callback ends the Trainer's loop at a step; the seeds are recorded as stopped, not as
errors, with the steps they trained and the share saved.
"""

from __future__ import annotations

import pytest

from hyprun.runner.store.investigation import Store
from tests.e2e.test_slurm_apps import hyprun

APP = "tests.apps.hf_gpt2.train:main"
BUDGET = [  # ~30 s a seed here: long enough for polls every 5 s to stop it midway
    "training.max_steps=200",
    "training.eval_steps=10",
    "training.logging_steps=10",
    "training.save_strategy=no",
    "probe_every=50",
]
NAME = "early-on-slurm"
pytestmark = [pytest.mark.usefixtures("slurm"), pytest.mark.slow]


def test_a_clearly_worse_app_test_on_slurm_is_cancelled_early(mlflow_server, tmp_path):
    store = Store(mlflow_server, "hyprun")
    where = ["hydra/launcher=slurm_cpu", "--investigation", NAME]
    done = hyprun(
        "baseline", "--app", APP, *BUDGET, *where, "--seeds", "3", cwd=tmp_path, uri=mlflow_server
    )
    assert done.returncode == 0, done.stdout + done.stderr
    why = "I think a lower LR is steadier because the loss is noisy"
    worse = ["training.learning_rate=3e-5", "--why", why]  # run where the baseline ran: Slurm
    done = hyprun("test", "--investigation", NAME, *worse, cwd=tmp_path, uri=mlflow_server)
    assert done.returncode == 0, done.stdout + done.stderr

    test = store.find(NAME).tests[0]
    assert test.verdict == "rejected" and test.tags["hyprun.early"] == "true", test.tags
    saved = store.run(test.run_id).data.metrics["tokens_saved_frac"]
    print(f"HF on Slurm: {test.tags['hyprun.spent']}; {test.tags['hyprun.reason']}")
    # How much the cancel saves here depends on timing, not on hyprun: the controller polls every
    # 5 s (Slurm.poll_s), the marks judged are those every seed reached, and on this 2-core
    # cluster the third seed waits for a core, so the first two may be done before it reaches a
    # mark (2026-12-02: 33-44% saved on a busy machine, 0% in a clean-clone CI run where all three
    # ~10 s seeds finished first). The saving is asserted where it does not hang on timing
    # (tests/test_app_early.py); here: the verdict, and every seed's end recorded, none an error.
    assert 0.0 <= saved < 1.0, saved
    trained = []
    for run in store.seed_runs(test.run_id):
        tags = run.data.tags
        ended = (tags["hyprun.outcome"], run.info.status, tags.get("hyprun.steps"))
        assert ended[0] in ("stopped", "completed") and ended[1] == "FINISHED", ended
        # A seed cancelled while it waited for a core stops at step 0 (2026-12-02, -n 2).
        low = 0 if ended[0] == "stopped" else 1
        assert low <= int(tags["hyprun.steps"]) <= 200, ended
        trained.append(int(tags["hyprun.steps"]))
    assert max(trained) > 0, trained  # the marks judged were read from seeds that trained
    # This investigation's runs all end (the session's server is shared: other tests' runs are
    # theirs to end). Not asserted: a run the app's own library opens after the stop (the HF
    # app's final trainer.evaluate() logged into a new, unnamed run left RUNNING in 1 of 3 runs
    # here, 2026-12-02): a known limit in README, open in issue 26.
    experiment = store.client.get_experiment_by_name("hyprun").experiment_id
    runs = store.client.search_runs([experiment])
    parent = {r.info.run_id: r.data.tags.get("mlflow.parentRunId") for r in runs}
    investigation = store.find(NAME).run_id

    def root(run_id: str) -> str:
        while parent.get(run_id):
            run_id = parent[run_id]
        return run_id

    running = [
        r.info.run_name
        for r in runs
        if r.info.status == "RUNNING" and root(r.info.run_id) == investigation
    ]
    assert running == []
