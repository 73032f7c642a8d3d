"""Helpers for tests: short job configs, MLflow reads, subprocess environments."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from mlflow.tracking import MlflowClient

from hyprun.runner.compose import compose

ROOT = Path(__file__).resolve().parent.parent


def job_config(workdir: Path, *overrides: str, uri: str | None = None):
    """A short tiny-GPT job writing to `uri` (default: a sqlite file in `workdir`)."""
    uri = uri or f"sqlite:///{workdir}/mlflow.db"
    return compose(
        [
            "budget.tokens=4096",
            "budget.eval_every_tokens=2048",
            "budget.eval_sequences=32",
            f"tracking.uri={uri}",
            f"checkpoint.dir={workdir}/ckpt",
            *overrides,
        ]
    )


def metric_history(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    history = MlflowClient(tracking_uri=uri).get_metric_history(run_id, key)
    return sorted((m.step, m.value) for m in history)


def probe_checks(run_id: str) -> dict[str, dict]:
    """The L0 checks a closed probe recorded in the active MLflow store, by id."""
    from mlflow.tracking import MlflowClient

    from hyprun.diag.live_checks import read_l0_tags

    tags = MlflowClient(os.environ["MLFLOW_TRACKING_URI"]).get_run(run_id).data.tags
    return {check["id"]: check for check in read_l0_tags(tags)}


def probed_run(model, optimizer, loss_of, batches, heldout, after_step=None, **options) -> str:
    """A plain loop over `batches` with the probe attached (a step scan every 2 steps on
    `heldout`; `after_step(step)` run after each optimizer step; `options`: more of Probe's
    arguments): the id of the run it recorded."""
    from hyprun.runner.job.probe import Probe

    probe = Probe(
        model,
        optimizer,
        step_unit="steps",
        every_steps=2,
        heldout=heldout,
        loss_fn=loss_of,
        **options,
    )
    for step, batch in enumerate(batches):
        loss = loss_of(model, batch)
        loss.backward()
        probe.after_backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        if after_step is not None:
            after_step(step)
    probe.close()
    return probe.run_id


def probed_checks(model, optimizer, loss_of, batches, heldout, **options) -> dict[str, dict]:
    """The L0 checks `probed_run` recorded, by id."""
    return probe_checks(probed_run(model, optimizer, loss_of, batches, heldout, **options))


def probed_check(model, loss_of, batch_of, check: str) -> dict:
    """`check` as the probe recorded it on a plain AdamW loop over `batch_of(0..3)`, its
    held-out batch `batch_of(99)` (probed_checks)."""
    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batches = [batch_of(seed) for seed in range(4)]
    return probed_checks(model, optimizer, loss_of, batches, batch_of(99))[check]


def finding_ids(facts) -> list[str]:
    """The ids of the findings triage reads from the live checks of `facts`, ranked."""
    from hyprun.diag.evidence import Evidence
    from hyprun.diag.live_checks import live_checks
    from hyprun.diag.triage import triage

    checks = [check.__dict__ for check in live_checks(facts)]
    return [finding.id for finding in triage(Evidence(static=checks)).findings]


def python_env(**extra: str) -> dict[str, str]:
    # The test process's own process group (world of one) must not leak into its children.
    dist_vars = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if k not in dist_vars}
    env.pop("MLFLOW_TRACKING_URI", None)
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def after_importing_runner(name: str, given: str | None) -> str:
    """Environment variable `name` after `import runner`, in a fresh process whose environment
    sets it to `given` (None: leaves it unset)."""
    env = python_env()
    env.pop(name, None)
    if given is not None:
        env[name] = given
    read = f"import os, runner; print(os.environ[{name!r}])"
    done = subprocess.run(
        [sys.executable, "-c", read], env=env, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_mlflow_server(folder: Path, port: int, host: str = "127.0.0.1") -> subprocess.Popen:
    """A real `mlflow server` on `host`:`port` with its store in `folder`, once it accepts
    connections (the same folder and port again: the same server, restarted)."""
    env = python_env(MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    with open(folder / "server.log", "a") as log:  # the server writes to its own copy
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "mlflow",
                "server",
                "--host",
                host,
                "--port",
                str(port),
                "--workers",
                "1",
                "--backend-store-uri",
                f"sqlite:///{folder}/server.db",
                "--artifacts-destination",
                str(folder / "artifacts"),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=folder,
        )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=1):
                return server
        except OSError:
            if server.poll() is not None:
                log_text = (folder / "server.log").read_text()
                raise RuntimeError(f"mlflow server exited: {log_text}") from None
            time.sleep(0.5)
    server.kill()
    raise RuntimeError("mlflow server did not start within 120 s")
