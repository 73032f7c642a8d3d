"""The architecture as a test: imports run one way, and only the store talks to MLflow.

    cli -> control -> launch -> job -> store -> (errors, compose, provenance)
    everything -> diag; hypotheses -> diag; diag imports nothing of hyprun and no side-effect stack

Every import in every module counts, including those inside functions (a lazy import is still a
dependency). A new module lands in a room; this test says when it reached into the wrong one.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import python_env

ROOT = Path(__file__).resolve().parent.parent

# A room may import the rooms listed for it, and nothing else of hyprun's.
BASE = {
    "runner.errors",
    "runner.compose",
    "runner.provenance",
    "runner.markdown",
    "diag",
    "hypotheses",
}
ALLOWED = {
    "diag": {"diag"},
    "hypotheses": {"diag", "hypotheses"},
    "runner.errors": set(),
    "runner.compose": {"runner.errors"},
    "runner.provenance": set(),
    "runner.markdown": set(),
    "runner.store": BASE | {"runner.store"},
    "runner.job": BASE | {"runner.store", "runner.job"},
    "runner.launch": BASE | {"runner.store", "runner.job", "runner.launch"},
    "runner.control": BASE | {"runner.store", "runner.job", "runner.launch", "runner.control"},
    "runner.cli": BASE
    | {"runner.store", "runner.job", "runner.launch", "runner.control", "runner.cli"},
}
# Third-party stacks a room must not import: diag stays pure, only the store talks to MLflow.
FORBIDDEN = {
    "diag": {"mlflow", "hydra", "deepspeed", "submitit", "optuna"},
    "hypotheses": {"mlflow", "deepspeed", "torch"},
}
MLFLOW_ONLY_IN = "runner.store"
PACKAGES = ("runner", "diag", "hypotheses", "conf")  # installed as hyprun.runner, ...


def room_of(module: str) -> str:
    """The longest room name that `module` is, or is inside of."""
    rooms = [r for r in ALLOWED if module == r or module.startswith(r + ".")]
    return max(rooms, key=len) if rooms else ""


def modules() -> dict[str, Path]:
    found = {}
    for package in ("runner", "diag", "hypotheses"):
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def imports_of(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def violations(module: str, imported: set[str]) -> list[str]:
    """`module` is named by its folder (`runner.job.train`), as rooms are; ours are imported
    under the hyprun namespace, so that a user's own `runner` or `conf` never shadows them."""
    room = room_of(module)
    found = []
    for name in sorted(imported):
        if name.split(".")[0] in PACKAGES:
            found.append(f"{module} imports {name}: import it as hyprun.{name}")
            continue
        name = name.removeprefix("hyprun.")
        top = name.split(".")[0]
        if top in ("runner", "diag", "hypotheses"):
            target = room_of(name)
            if target and target not in ALLOWED[room]:
                found.append(f"{module} ({room}) imports {name} ({target})")
        if top in FORBIDDEN.get(room.split(".")[0], set()) or top in FORBIDDEN.get(room, set()):
            found.append(f"{module} ({room}) imports {top}")
        if top == "mlflow" and not room.startswith(MLFLOW_ONLY_IN):
            found.append(f"{module} ({room}) imports mlflow: go through runner.store")
    return found


def test_every_module_has_a_room():
    homeless = [m for m in modules() if not room_of(m) and m != "runner"]
    assert homeless == [], f"modules outside every room of tests/test_layers.py: {homeless}"


def test_imports_run_one_way():
    found = [v for m, path in modules().items() for v in violations(m, imports_of(path))]
    assert found == [], "\n".join(found)


def test_the_controllers_steps_import_one_way():
    """controller.py (the `test` command) imports the steps it runs (baseline, rounds, verdicts,
    escalation, ...); none of them imports it back (sweep.py, a command on its claims and
    refusals, does), and runner/control has no import cycle."""
    control = {m: p for m, p in modules().items() if m.startswith("runner.control.")}
    steps = {
        m: {n.removeprefix("hyprun.") for n in imports_of(p)} & control.keys()
        for m, p in control.items()
    }
    back = [m for m, found in steps.items() if "runner.control.controller" in found]
    assert back == ["runner.control.sweep"], f"modules importing controller.py: {back}"

    def reaches(start: str, target: str, seen: set[str]) -> bool:
        return any(
            n == target or (n not in seen and reaches(n, target, seen | {n})) for n in steps[start]
        )

    cycles = [m for m in steps if reaches(m, m, {m})]
    assert cycles == [], f"runner/control modules in an import cycle: {cycles}"


@pytest.mark.parametrize(
    "module, imported",
    [
        ("runner.job.train", {"hyprun.runner.control.controller"}),
        ("runner.store.tracking", {"hyprun.runner.job.result"}),
        ("runner.control.controller", {"mlflow.tracking"}),
        ("diag.triage", {"hyprun.runner.errors"}),
        ("diag.verdict", {"mlflow"}),
        ("runner.cli.main", {"runner.control.controller"}),  # a bare name a user's could shadow
        ("runner.job.train", {"conf"}),
    ],
)
def test_a_wrong_way_import_is_caught(module, imported):
    assert violations(module, imported), f"{module} importing {imported} was let through"


def test_commands_that_read_the_store_do_not_import_torch():
    """The controller reads job results as JobResult: importing it must not start torch."""
    code = (
        "import sys, hyprun.runner.store.investigation, hyprun.runner.job.result\n"
        "import hyprun.runner.cli.report\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'deepspeed'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# The stacks that take seconds to import (issue 17: `hyprun status` took 11-16 s).
HEAVY = {"torch", "deepspeed", "mlflow", "sqlalchemy", "optuna", "matplotlib", "pandas"}
# What a user waits on without training anything: each answers without importing HEAVY.
WAITED_ON = {
    "help": ["--help"],
    "check help": ["check", "--help"],
    "status": ["status"],
    "status json": ["status", "--json"],
    "status of nothing": ["status", "--investigation", "nope"],
    "train unknown key": ["train", "optim.lrr=1e-3"],
    "train negative budget": ["train", "budget.tokens=-5"],
    "check unknown key": ["check", "optim.lrr=1e-3"],
    "baseline unknown key": ["baseline", "optim.lrr=1e-3"],
    "test two variables": ["test", "optim.lr=3e-3", "model.n_layer=4", "--why", "x because y"],
    "test unknown card": ["test", "no_such_card", "--why", "x because y"],
}
REPORT_MODULES = (
    "import json, sys\n"
    "from hyprun.runner.cli.main import main\n"
    "try:\n"
    "    main(sys.argv[1:])\n"
    "except SystemExit as done:\n"
    "    heavy = sorted({m.split('.')[0] for m in sys.modules} & set(json.loads(HEAVY)))\n"
    "    print('RESULT', json.dumps({'exit': done.code, 'heavy': heavy}), file=sys.stderr)\n"
)


@pytest.fixture(scope="module")
def sqlite_investigation(tmp_path_factory) -> str:
    """A store with a recorded investigation and one test, written the way the controller does."""
    from bench.commands import seed_investigation

    uri = f"sqlite:///{tmp_path_factory.mktemp('store')}/mlflow.db"
    seed_investigation(uri)
    return uri


@pytest.mark.parametrize("args", WAITED_ON.values(), ids=WAITED_ON.keys())
def test_commands_that_do_not_train_import_no_heavy_stack(sqlite_investigation, args, tmp_path):
    """`status`, `--help` and every refusal answer in a blink: no torch, DeepSpeed or MLflow."""
    import json

    code = REPORT_MODULES.replace("HEAVY", repr(json.dumps(sorted(HEAVY))))
    env = {**python_env(), "MLFLOW_TRACKING_URI": sqlite_investigation}
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    result = json.loads(done.stderr.rsplit("RESULT", 1)[-1])
    assert result["exit"] in (0, 2, None), done.stderr
    assert result["heavy"] == [], f"hyprun {' '.join(args)} imported {result['heavy']}"
    assert list(tmp_path.iterdir()) == [], "a command that trains nothing wrote a file"
