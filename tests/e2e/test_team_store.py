"""A team's store: one MLflow server on PostgreSQL with MLflow's basic-auth, started by
slurm/local/store_up.sh, shared by users who each sign in with their own account.

Each test or baseline is attributed to who ran it; a user who may only read is refused in one
line before anything is written; no credential reaches a printed link, a report, a param, a
tag or a log line; `hyprun status` answers quickly; and users racing each other through a
server restart leave exact strikes, every run ended, nothing lost or doubled."""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.helpers import ROOT, free_port, python_env

UP, DOWN = ROOT / "slurm/local/store_up.sh", ROOT / "slurm/local/store_down.sh"
USERS = ("ana", "bo", "cy", "di")
"""The team: EDIT on experiment `hyprun`. `eve` has an account and reads only."""
TINY = [
    "budget.tokens=2048",
    "budget.eval_every_tokens=1024",
    "budget.eval_sequences=16",
    "tracking.system_metrics_every_s=0",
    "optim.lr=1e-5",  # too low: loss_flat, and tests that lower it further are rejected
]


@dataclass
class TeamStore:
    uri: str
    folder: Path
    env: dict[str, str]
    """The store script's settings: HYPRUN_STORE_DIR, ports."""

    def credentials(self, user: str) -> dict[str, str]:
        """MLFLOW_TRACKING_URI/USERNAME/PASSWORD as the user's file holds them."""
        name = "admin.env" if user == "admin" else f"users/{user}.env"
        lines = (self.folder / name).read_text().splitlines()
        found = dict(line.split("=", 1) for line in lines if "=" in line)
        return {"MLFLOW_TRACKING_URI": self.uri, **found}

    def secrets(self) -> list[str]:
        """Every password the store holds: the users', the admin's, PostgreSQL's, Flask's."""
        found = [self.credentials(u)["MLFLOW_TRACKING_PASSWORD"] for u in (*USERS, "eve")]
        found.append(self.credentials("admin")["MLFLOW_TRACKING_PASSWORD"])
        found += [(self.folder / f).read_text().strip() for f in ("pg.secret", "flask.secret")]
        return found

    def client(self, user: str = "admin") -> MlflowClient:
        """MLflow's client signed in as `user` (credentials set for this process)."""
        for key, value in self.credentials(user).items():
            os.environ[key] = value
        return MlflowClient(self.uri)

    def script(self, path: Path) -> subprocess.CompletedProcess:
        done = subprocess.run(
            ["bash", str(path)], env={**os.environ, **self.env}, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done


@pytest.fixture(scope="module")
def team_store():
    """The store in a fresh folder on free ports, its four users and a reader; stopped and
    removed afterwards. PostgreSQL runs as user postgres: only root starts it."""
    if os.geteuid() != 0:
        pytest.skip("store_up.sh starts PostgreSQL as user postgres: run as root")
    folder = Path(tempfile.mkdtemp(prefix="hyprun-store-"))  # /tmp: user postgres can enter
    port = free_port()
    env = {
        "HYPRUN_STORE_DIR": str(folder),
        "HYPRUN_STORE_PORT": str(port),
        "HYPRUN_STORE_PG_PORT": str(free_port()),
        "HYPRUN_STORE_PYTHON": sys.executable,
        "HYPRUN_STORE_USERS": " ".join(USERS),
    }
    store = TeamStore(f"http://127.0.0.1:{port}", folder, env)
    try:
        store.script(UP)
        admin = store.credentials("admin")
        reader = [sys.executable, "-m", "hyprun.runner.store.team", store.uri]
        subprocess.run(
            [*reader, str(folder / "users"), "--users", "eve", "--edit"],
            env=python_env(**admin),
            check=True,
            capture_output=True,
        )
        yield store
    finally:
        subprocess.run(["bash", str(DOWN)], env={**os.environ, **env}, capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)


def hyprun(store: TeamStore, user: str, *args: str, cwd: Path, uri: str | None = None):
    """`hyprun ARGS` as `user`, in its own process: (exit code, stdout + stderr)."""
    env = python_env(**store.credentials(user))
    if uri:
        env["MLFLOW_TRACKING_URI"] = uri
    done = subprocess.run(
        [sys.executable, "-m", "hyprun.runner.cli.main", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    return done.returncode, done.stdout + done.stderr


def baseline(store: TeamStore, user: str, name: str, cwd: Path, uri: str | None = None):
    """`hyprun baseline` of TINY, one seed, as `user`: (exit code, output)."""
    why = ["--why", "the loss is flat"]
    return hyprun(
        store,
        user,
        "baseline",
        "--investigation",
        name,
        "--seeds",
        "1",
        *why,
        *TINY,
        cwd=cwd,
        uri=uri,
    )


def all_runs(client: MlflowClient) -> list:
    experiments = [e.experiment_id for e in client.search_experiments()]
    return client.search_runs(experiments, max_results=5000)


def test_a_reader_is_refused_in_one_line_and_nothing_is_written(team_store, tmp_path):
    """eve reads experiment `hyprun` but may not edit it: a baseline into it is refused in one
    line naming her, the experiment and the fix; exit 2; no run, no tag. Wrong credentials are
    refused in one line too."""
    client = team_store.client()
    experiments = [e.name for e in client.search_experiments()]
    before = {r.info.run_id: r.data.tags for r in all_runs(client)}
    code, output = hyprun(
        team_store, "eve", "baseline", "--investigation", "eve-1", "--why", "x", *TINY, cwd=tmp_path
    )
    assert code == 2, output
    [line] = output.strip().splitlines()
    assert "'eve' may not write to experiment 'hyprun'" in line and "EDIT" in line
    assert "permission READ" in line
    after = {r.info.run_id: r.data.tags for r in all_runs(client)}
    assert after == before and [e.name for e in client.search_experiments()] == experiments

    env = python_env(**{**team_store.credentials("eve"), "MLFLOW_TRACKING_PASSWORD": "not-hers"})
    done = subprocess.run(
        [sys.executable, "-m", "hyprun.runner.cli.main", "status"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    [line] = done.stderr.strip().splitlines()
    assert "did not accept the credentials" in line and "not-hers" not in line


@pytest.fixture(scope="module")
def recorded(team_store, tmp_path_factory):
    """ana's baseline (1 seed), then bo's test of it with his credentials in the URI (a form
    MLflow's client accepts): every output kept for the leak checks."""
    folder = tmp_path_factory.mktemp("team")
    outputs = []
    code, output = baseline(team_store, "ana", "flat", folder)
    outputs.append(output)
    assert code == 0, output
    bo = team_store.credentials("bo")
    in_uri = team_store.uri.replace(
        "://", f"://{bo['MLFLOW_TRACKING_USERNAME']}:{bo['MLFLOW_TRACKING_PASSWORD']}@"
    )
    why = "I think the LR is too low because the loss is flat"
    code, output = hyprun(
        team_store,
        "bo",
        "test",
        "optim.lr=*0.1",
        "--why",
        why,
        "--investigation",
        "flat",
        "--max-seeds",
        "1",
        cwd=folder,
        uri=in_uri,
    )
    outputs.append(output)
    assert code == 0, output
    for command in (["status"], ["report", "--out", str(folder / "report")]):
        code, output = hyprun(team_store, "cy", *command, "--investigation", "flat", cwd=folder)
        outputs.append(output)
        assert code == 0, output
    return folder, outputs


def test_each_run_names_who_ran_it(team_store, recorded):
    """The investigation and its baseline seed are ana's, the test and its seed bo's (the
    accounts the server authenticated); status and the report say who ran each test."""
    folder, outputs = recorded
    client = team_store.client()
    runs = [r for r in all_runs(client) if r.data.tags.get("hyprun.investigation") == "flat"]
    users = {
        (r.data.tags.get("hyprun.role"), r.data.tags.get("hyprun.user"))
        for r in runs
        if "hyprun.role" in r.data.tags
    }
    expected = {("investigation", "ana"), ("baseline", "ana"), ("test", "bo"), ("test-seed", "bo")}
    assert users == expected
    status = outputs[2]
    assert "bo" in status.split("H1", 1)[1].splitlines()[0]
    report = (folder / "report" / "report.md").read_text()
    assert "**H1 (by bo)**" in report and "by ana" in report


def test_a_reader_cannot_test_on_a_colleagues_investigation(team_store, recorded, tmp_path):
    """eve may read ana's investigation (status answers her) but a test of hers on it is
    refused in one line, exit 2, before the claim: no test run, no number, no tag."""
    client = team_store.client()
    before = {r.info.run_id: (r.data.tags, r.data.params) for r in all_runs(client)}
    code, output = hyprun(team_store, "eve", "status", "--investigation", "flat", cwd=tmp_path)
    assert code == 0, output
    why = ["--why", "I think the LR is too low because the loss is flat"]
    args = ["test", "optim.lr=*10", *why, "--investigation", "flat", "--max-seeds", "1"]
    code, output = hyprun(team_store, "eve", *args, cwd=tmp_path)
    assert code == 2, output
    [line] = output.strip().splitlines()
    assert "'eve' may not write to experiment 'hyprun'" in line
    after = {r.info.run_id: (r.data.tags, r.data.params) for r in all_runs(client)}
    assert after == before


def test_no_credential_is_printed_logged_or_recorded(team_store, recorded):
    """No password of the store (users', admin's, PostgreSQL's, Flask's) in what the commands
    printed, in any run's name, params, tags or text artifacts, in the report, or in the
    server's and PostgreSQL's logs; bo's password was in his tracking URI."""
    folder, outputs = recorded
    client = team_store.client()
    recorded_text = list(outputs)
    for run in all_runs(client):
        recorded_text += [run.info.run_name or "", *run.data.params.values()]
        recorded_text += [*run.data.tags.values()]
        for artifact in client.list_artifacts(run.info.run_id):
            if artifact.path.endswith((".yaml", ".json", ".md", ".txt")):
                local = client.download_artifacts(run.info.run_id, artifact.path, str(folder))
                recorded_text.append(Path(local).read_text())
    for path in (folder / "report").iterdir():
        if path.suffix in (".md", ".html"):
            recorded_text.append(path.read_text())
    recorded_text += [(team_store.folder / "mlflow.log").read_text()]
    recorded_text += [(team_store.folder / "pg" / "postgres.log").read_text()]
    everything = "\n".join(recorded_text)
    assert "http://127.0.0.1" in everything  # links were printed: they were looked at
    for secret in team_store.secrets():
        assert secret not in everything


def test_status_answers_in_under_a_second(team_store, recorded, tmp_path):
    """`hyprun status` against the team's store, median of 3, beside the same command against
    a local sqlite store of the same shape (the machine's load moves both): the store's share,
    accounts and PostgreSQL included, is under a second (the whole: README's figures)."""
    folder, _ = recorded
    local = tmp_path / "mlflow.db"
    code, output = baseline(team_store, "ana", "flat", tmp_path, uri=f"sqlite:///{local}")
    assert code == 0, output

    def seconds(uri: str | None) -> float:
        start = time.perf_counter()
        code, output = hyprun(team_store, "cy", "status", cwd=folder, uri=uri)
        assert code == 0, output
        return time.perf_counter() - start

    team, alone = [], []
    for _ in range(3):  # interleaved: load swings hit both alike
        team.append(seconds(None))
        alone.append(seconds(f"sqlite:///{local}"))
    team_s, local_s = statistics.median(team), statistics.median(alone)
    print(f"hyprun status: team store {team_s:.2f} s, local sqlite {local_s:.2f} s")
    assert team_s - local_s < 1.0


RACE = [
    "budget.tokens=8192",
    "budget.eval_every_tokens=4096",
    "budget.eval_sequences=16",
    "data.source.loader_delay_ms=400",  # jobs long enough for the restart to land inside them
    "tracking.system_metrics_every_s=0",
    "optim.lr=1e-5",  # 100x too low: every cut below is rejected
]
TESTS = {"ana": "*0.1", "bo": "*0.01", "cy": "*0.001", "di": "*0.1"}
"""Each user's LR factor: ana, bo and cy on one investigation, di on her own."""


def start(store: TeamStore, user: str, *args: str, cwd: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "hyprun.runner.cli.main", *args],
        cwd=cwd,
        env=python_env(**store.credentials(user)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.slow  # two baselines, then four tests of two seeds at once through a restart
def test_four_users_at_once_through_a_server_restart(team_store, tmp_path):
    """ana and di record baselines at once; then ana, bo and cy test three LR cuts on ana's
    investigation while di tests one on hers, each in a process of their own with their own
    --why; PostgreSQL and the server restart while the seed jobs train. Every command ends
    with its verdict; the shared investigation has exactly 3 strikes (H1-H3, one each) and one
    escalation, di's exactly 1; every run has ended; each test has its 2 seeds, each seed every
    metric step once; each test is its user's."""
    client = team_store.client()
    names = {"ana": "shared", "bo": "shared", "cy": "shared", "di": "solo"}
    folders = {user: tmp_path / user for user in TESTS}
    for folder in folders.values():
        folder.mkdir()
    baselines = [
        start(
            team_store,
            user,
            "baseline",
            "--investigation",
            name,
            "--seeds",
            "2",
            "--why",
            f"{user}: the loss is flat",
            *RACE,
            cwd=folders[user],
        )
        for user, name in (("ana", "shared"), ("di", "solo"))
    ]
    for process in baselines:
        output = process.communicate(timeout=900)[0]
        assert process.returncode == 0, output
    tests = {
        user: start(
            team_store,
            user,
            "test",
            f"optim.lr={factor}",
            "--investigation",
            names[user],
            "--max-seeds",
            "2",
            "--why",
            f"I think ({user}) a lower LR helps because it might",
            cwd=folders[user],
        )
        for user, factor in TESTS.items()
    }
    try:
        deadline = time.monotonic() + 600
        # Restart once every test has claimed and a seed job logs, or as a first one ends.
        while not _training(client, len(TESTS)) and all(p.poll() is None for p in tests.values()):
            assert time.monotonic() < deadline
            time.sleep(0.5)
        running = [user for user, p in tests.items() if p.poll() is None]
        assert len(running) >= 2, _outputs(tests)  # the restart lands inside commands
        team_store.script(DOWN)
        time.sleep(5)
        team_store.script(UP)
        outputs = {user: p.communicate(timeout=900)[0] for user, p in tests.items()}
    finally:
        for process in tests.values():
            if process.poll() is None:
                process.kill()
    assert {user: p.returncode for user, p in tests.items()} == dict.fromkeys(TESTS, 0), outputs

    runs = all_runs(client)
    assert [r.info.run_id for r in runs if r.info.status == "RUNNING"] == []
    for name, users, strikes in (("shared", {"ana", "bo", "cy"}, 3), ("solo", {"di"}, 1)):
        mine = [r for r in runs if r.data.tags.get("hyprun.investigation") == name]
        [parent] = [r for r in mine if r.data.tags.get("hyprun.role") == "investigation"]
        tests_run = [r for r in mine if r.data.tags.get("hyprun.role") == "test"]
        assert sorted(r.data.tags["hyprun.number"] for r in tests_run) == [
            str(n) for n in range(1, len(users) + 1)
        ]
        assert {r.data.tags["hyprun.user"] for r in tests_run} == users
        assert [r.data.tags["hyprun.verdict"] for r in tests_run] == ["rejected"] * strikes
        numbers = [k for k in parent.data.params if k.startswith("test.H")]
        assert len(numbers) == len(users)
        escalations = [k for k in parent.data.params if k.startswith("escalation.")]
        assert len(escalations) == (1 if strikes == 3 else 0)
        for test in tests_run:
            seeds = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == test.info.run_id]
            numbered = sorted(r.data.tags["hyprun.seed"] for r in seeds)  # 1 if stopped early
            assert numbered in (["0"], ["0", "1"]), numbered
            for seed in seeds:
                steps = [m.step for m in client.get_metric_history(seed.info.run_id, "train/loss")]
                trained = int(float(seed.data.tags["hyprun.tokens"]))
                assert sorted(steps) == list(range(1024, trained + 1, 1024)), (steps, trained)
    for user in TESTS:
        assert "rejected" in outputs[user]


def _training(client: MlflowClient, tests: int) -> bool:
    """Whether `tests` tests have claimed their run and one of their seed jobs logged a loss."""
    runs = all_runs(client)
    claimed = {r.info.run_id for r in runs if r.data.tags.get("hyprun.role") == "test"}
    seeds = [r for r in runs if r.data.tags.get("mlflow.parentRunId") in claimed]
    return len(claimed) == tests and any("train/loss" in r.data.metrics for r in seeds)


def _outputs(processes: dict[str, subprocess.Popen]) -> str:
    ended = {u: p for u, p in processes.items() if p.poll() is not None}
    return "\n".join(f"{u}: exit {p.returncode}: {p.communicate()[0]}" for u, p in ended.items())
