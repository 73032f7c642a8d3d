"""Bad input: one line naming the problem and the fix, exit code 2, nothing recorded or trained."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hyprun.runner.cli.main import main as hyprun
from tests.helpers import ROOT, python_env

CASES = {
    "unknown key": (["optim.lrr=1e-3"], "unknown config key 'optim.lrr'"),
    "unknown group option": (["model=gpt_huge"], "no config 'model/gpt_huge': choose one of"),
    "unparsable override": (["optim.lr=[1,"], "cannot parse an override"),
    "negative budget": (["budget.tokens=-5"], "budget.tokens=-5 must be a positive whole number"),
    "zero budget": (["budget.tokens=0"], "budget.tokens=0 must be a positive whole number"),
    "nan budget": (["budget.tokens=nan"], "budget.tokens=nan must be a positive whole number"),
    "string budget": (["budget.tokens=lots"], "budget.tokens='lots' must be a positive whole"),
    "fp16 on a CPU": (["ds.precision=fp16"], "ds.precision=fp16 needs a GPU"),
    "unknown precision": (["ds.precision=fp8"], "ds.precision=fp8 is unknown"),
    "bad ZeRO stage": (["ds.zero_stage=4"], "ds.zero_stage=4 is not a ZeRO stage"),
    "probe switch not on or off": (
        ["probes.step_scan=maybe"],
        "probes.step_scan='maybe' must be true or false",
    ),
    "zero learning rate": (["optim.lr=0"], "optim.lr=0 must be a finite number > 0.0"),
    "missing data path": (["data=token_file"], "data.source.path is required"),
    "missing data file": (["data=token_file", "data.source.path=/no/such.bin"], "not found"),
    "budget below one step": (["budget.tokens=100"], "less than one optimizer step"),
    "data sequences longer than the model's context": (
        ["data.source.seq_len=128"],
        "data.source.seq_len=128 is longer than the model's context",
    ),
    "threads not a whole number": (["threads=0"], "threads=0"),
    "bad model switch": (["model.norm=batchnorm"], "model:"),
    "bad synthetic knob": (["data.source.duplicate_frac=1.5"], "duplicate_frac"),
    "a DeepSpeed key it does not know": (
        ["+ds.extra.zero_optimization.stagee=1"],
        "ds.extra: DeepSpeed refuses the config",
    ),
}


@pytest.mark.parametrize(("overrides", "expected"), CASES.values(), ids=CASES.keys())
def test_hyprun_train_refuses(workdir, capsys, overrides, expected):
    with pytest.raises(SystemExit) as exit_:
        hyprun(["train", f"checkpoint.dir={workdir}/ckpt", *overrides])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert expected in err and "\n" not in err, err
    assert not (workdir / "mlflow.db").exists() and not (workdir / "ckpt").exists()


@pytest.mark.slow  # a fresh python importing torch per case
@pytest.mark.parametrize("case", ["unknown key", "missing data file", "fp16 on a CPU"])
def test_python_m_runner_train_refuses(tmp_path: Path, case: str):
    overrides, expected = CASES[case]
    done = subprocess.run(
        [sys.executable, "-m", "hyprun.runner.job.train", *overrides],
        cwd=tmp_path,
        env=python_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("hyprun:")]
    assert len(lines) == 1 and expected in lines[0], done.stderr
    assert "Traceback" not in done.stderr
    assert not list(tmp_path.iterdir()), "a refused job must write nothing"


@pytest.mark.slow  # builds and installs a wheel
def test_installed_wheel_finds_conf(tmp_path: Path):
    """conf/ ships in the wheel as hyprun.conf: an installed hyprun composes configs away from any
    checkout, beside a user's own conf/ and runner.py."""
    wheel_dir, target = tmp_path / "wheel", tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(wheel_dir),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = wheel_dir.glob("hyprun-*.whl")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "-q",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    # A user's own conf/ and runner.py where hyprun runs: ours are hyprun.conf, hyprun.runner.
    user = tmp_path / "user"
    (user / "conf").mkdir(parents=True)
    (user / "conf" / "__init__.py").write_text("raise ImportError('the user conf/ was imported')")
    (user / "runner.py").write_text("raise ImportError('the user runner.py was imported')")
    probe = (
        "import hyprun.runner; from hyprun.runner.compose import compose; "
        "print(hyprun.runner.__file__); print(compose(['model=gpt_1b']).model.n_layer)"
    )
    env = python_env(PYTHONPATH=f"{user}:{target}")
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=user,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    location, layers = done.stdout.split()
    assert location.startswith(str(target)) and layers == "18"


# --- The investigation commands: refused before anything is recorded or launched -------------

WHY = ["--why", "I think the LR is off because the loss is flat"]
INV = ["--investigation", "inv"]
COMMAND_CASES = {
    "two variables": (
        ["test", "optim.lr=3e-3", "optim.weight_decay=0.2", *WHY, *INV],
        "changes 2 variables",
    ),
    "zero variables": (["test", "optim.lr=0.001", *WHY, *INV], "changes nothing"),
    "controlled budget": (["test", "budget.tokens=8192", *WHY, *INV], "controlled variable"),
    "controlled seed": (["test", "budget.seed=7", *WHY, *INV], "controlled variable"),
    "unknown card": (["test", "no_such_card", *WHY, *INV], "no hypothesis card 'no_such_card'"),
    "empty why": (["test", "optim.lr=3e-3", "--why", " ", *INV], "--why is empty"),
    "unknown key in a test": (["test", "optim.lrr=3e-3", *WHY, *INV], "unknown config key"),
    "unparsable test": (["test", "optim.lr=[1,", *WHY, *INV], "cannot parse an override"),
    "no such investigation": (
        ["test", "optim.lr=3e-3", *WHY, "--investigation", "nope"],
        "no investigation 'nope'",
    ),
    "test on other hardware": (
        ["test", "optim.lr=3e-3", "hydra/launcher=slurm_cpu", *WHY, *INV],
        "other hardware",
    ),
    "launcher key, no launcher": (
        ["test", "optim.lr=3e-3", "hydra.launcher.qos=x", *WHY, *INV],
        "needs a launcher",
    ),
    "sweep of two variables": (
        ["sweep", "optim.lr=interval(1e-4,1e-2)", "optim.weight_decay=interval(0,0.1)", *WHY, *INV],
        "2 variables",
    ),
    "sweep of one value": (["sweep", "optim.lr=3e-3", *WHY, *INV], "not a sweep"),
    "unparsable sweep": (["sweep", "optim.lr=interval(1e-4", *WHY, *INV], "cannot parse"),
    "sweep of a controlled variable": (
        ["sweep", "budget.tokens=choice(4096,8192)", *WHY, *INV],
        "controlled variable",
    ),
    "sweep to a negative LR": (
        ["sweep", "optim.lr=interval(-1,1e-2)", *WHY, *INV],
        "optim.lr",
    ),
    "sweep to zero layers": (
        ["sweep", "model.n_layer=range(0,4)", *WHY, *INV],
        "n_layer",
    ),
    "DeepSpeed key misspelled in ds.extra": (
        ["test", "+ds.extra.zero_optimization.stagee=1", *WHY, *INV],
        "ds.extra: DeepSpeed refuses the config",
    ),
    "sweep of one trial": (
        ["sweep", "optim.lr=interval(1e-4,1e-2)", "--trials", "1", *WHY, *INV],
        "--trials 1",
    ),
    "a baseline DeepSpeed refuses": (
        ["baseline", "+ds.extra.bf16.enabled=maybe", "--investigation", "b6"],
        "ds.extra: DeepSpeed refuses the config",
    ),
    "a baseline whose optimizer refuses its LR": (
        ["baseline", "optim.lr=-1", "--investigation", "b7"],
        "optim",
    ),
    "no seeds": (["baseline", "--seeds", "0", "--investigation", "b0"], "at least one seed"),
    "investigation exists": (["baseline", *INV], "exists already"),
    "unknown launcher": (
        ["baseline", "hydra/launcher=nope", "--investigation", "b1"],
        "no config 'hydra/launcher/nope'",
    ),
    "local launcher": (
        ["baseline", "hydra/launcher=submitit_local", "--investigation", "b2"],
        "Slurm only",
    ),
    "$() in a partition": (
        [
            "baseline",
            "hydra/launcher=slurm_cpu",
            "hydra.launcher.partition='gpu$(touch x)'",
            "--investigation",
            "b3",
        ],
        "contains '$()'",
    ),
    "; in an account": (
        [
            "baseline",
            "hydra/launcher=slurm_cpu",
            "hydra.launcher.account='a;id'",
            "--investigation",
            "b4",
        ],
        "contains ';'",
    ),
    "backquotes in a QoS": (
        [
            "baseline",
            "hydra/launcher=slurm_cpu",
            "hydra.launcher.qos='`id`'",
            "--investigation",
            "b5",
        ],
        "contains '`'",
    ),
    "quotes and | in a comment": (
        [
            "baseline",
            "hydra/launcher=slurm_cpu",
            "hydra.launcher.comment='\"a\" | b'",
            "--investigation",
            "b6",
        ],
        "contains",
    ),
    "line break in a constraint": (
        [
            "baseline",
            "hydra/launcher=slurm_cpu",
            "hydra.launcher.constraint='a\nb'",
            "--investigation",
            "b7",
        ],
        "line break",
    ),
    "unreachable tracking server": (
        ["baseline", "tracking.uri=http://127.0.0.1:9", "--investigation", "b8"],
        "does not answer",
    ),
    "verify without a confirmed test": (["verify", *INV], "no confirmed hypothesis"),
    "reset by nobody": (["reset", "--by", " ", "--reason", "x", *INV], "reset needs --by"),
    "upload of nothing": (["upload", "/no/such/spool.jsonl"], "no spool file"),
    "status of nothing": (["status", "--investigation", "nope"], "no investigation 'nope'"),
}


@pytest.fixture
def recorded(workdir, monkeypatch):
    """An investigation 'inv' with a recorded baseline (no jobs needed to refuse a test), and
    two whose baseline drifted: 'config-drift' and 'code-drift'."""
    import json

    from hyprun.runner import provenance
    from hyprun.runner.control.context import drift_key
    from hyprun.runner.store.investigation import Store

    uri = f"sqlite:///{workdir}/mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    store = Store(uri, "hyprun")
    sha, _ = provenance.git_state()
    overrides = ["budget.tokens=4096"]
    for name, drift in (
        ("inv", {}),
        ("config-drift", {"config_hash": "0" * 16}),
        ("code-drift", {"git_sha": "0" * 40}),
    ):
        baseline = {
            "overrides": overrides,
            "launcher": [],
            "seeds": 2,
            "seed_runs": [],
            "config_hash": drift_key(overrides),
            "git_sha": sha,
            **drift,
        }
        store.tag(
            store.create(name, "a recorded baseline"), {"hyprun.baseline": json.dumps(baseline)}
        )
    return store


def _runs(store) -> int:
    experiments = [e.experiment_id for e in store.client.search_experiments()]
    return len(store.client.search_runs(experiments, max_results=5000))


@pytest.mark.parametrize(("args", "expected"), COMMAND_CASES.values(), ids=COMMAND_CASES.keys())
def test_investigation_commands_refuse(recorded, capsys, args, expected):
    before = _runs(recorded)
    with pytest.raises(SystemExit) as exit_:
        hyprun(args)
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2, err
    assert expected in err and "\n" not in err and err.startswith("hyprun: "), err
    assert _runs(recorded) == before, "a refused command records nothing"


@pytest.mark.parametrize(
    ("name", "expected"), [("config-drift", "configs changed"), ("code-drift", "code changed")]
)
def test_a_drifted_baseline_is_not_compared_against(recorded, capsys, name, expected):
    before = _runs(recorded)
    with pytest.raises(SystemExit) as exit_:
        hyprun(["test", "optim.lr=3e-3", *WHY, "--investigation", name])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and expected in err and "\n" not in err, err
    assert _runs(recorded) == before


@pytest.mark.parametrize("damage", ["run.json", "checkpoint"])
def test_a_corrupt_checkpoint_is_refused(workdir, capsys, damage):
    """A checkpoint folder left broken (a torn write, a disk fault): one line saying how to start
    over, and nothing recorded."""
    from hyprun.runner.compose import compose
    from hyprun.runner.job.checkpoint import config_hash

    overrides = [f"checkpoint.dir={workdir}/ckpt", "budget.tokens=4096"]
    cfg = compose(overrides)
    cfg.tracking.run_name = " ".join(overrides)  # as `hyprun train` names its run
    folder = workdir / "ckpt" / (config_hash(cfg) + "-w1")
    folder.mkdir(parents=True)
    if damage == "run.json":
        (folder / "run.json").write_text("{not json")
    else:
        (folder / "run.json").write_text('{"run_id": "0123456789abcdef"}')
        (folder / "latest").write_text("step000000004")
        (folder / "step000000004").mkdir()
        (folder / "step000000004" / "mp_rank_00_model_states.pt").write_bytes(b"\x00torn")
    with pytest.raises(SystemExit) as exit_:
        hyprun(["train", *overrides])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and "cannot be resumed" in err and "\n" not in err, err
    assert "checkpoint.resume=never" in err
    assert not (workdir / "mlflow.db").exists()


def test_train_refuses_an_unreachable_tracking_server(workdir, capsys):
    with pytest.raises(SystemExit) as exit_:
        hyprun(["train", "tracking.uri=http://127.0.0.1:9", f"checkpoint.dir={workdir}/ckpt"])
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and "does not answer" in err and "\n" not in err, err


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--outage-s", "-5"], "--outage-s -5.0: give a number of seconds >= 0"),
        (["--json", "/nonexistent/rows.json"], "its folder does not exist"),
    ],
)
def test_bench_faults_refuses_before_any_work(args, expected):
    command = [sys.executable, "-m", "bench.faults", *args]
    done = subprocess.run(
        command, cwd=ROOT, env=python_env(), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2 and expected in done.stderr.strip().splitlines()[-1]
    assert done.stdout == ""  # no scenario ran
