"""A user's model by `_target_`: given only the arguments its constructor takes (or
`model.kwargs`); a mismatch is one line, exit 2, nothing written."""

from __future__ import annotations

import pytest

from hyprun.runner.cli.main import main as hyprun
from hyprun.runner.job.model_protocol import model_node
from hyprun.runner.job.train import run
from tests.helpers import job_config, metric_history

STRICT = "model._target_=tests.user_models.StrictLM"


def test_a_strict_model_trains_without_the_gpt_switches(workdir):
    cfg = job_config(workdir, STRICT, "+model.width=24")
    node = model_node(cfg.model)
    assert set(node) == {"_target_", "vocab_size", "seq_len", "width"}
    result = run(cfg)
    assert result.status == "completed"
    assert metric_history(cfg.tracking.uri, result.run_id, "grad/norm/blocks.1")


def test_model_kwargs_is_passed_as_it_is(workdir):
    cfg = job_config(workdir, STRICT, "+model.kwargs={width: 16, layers: 3}")
    node = model_node(cfg.model)
    assert dict(node) == {
        "_target_": "tests.user_models.StrictLM",
        "vocab_size": cfg.model.vocab_size,
        "seq_len": cfg.model.seq_len,
        "width": 16,
        "layers": 3,
    }


def test_the_built_in_gpt_and_kwargs_constructors_get_everything(workdir):
    cfg = job_config(workdir)
    assert model_node(cfg.model) is cfg.model
    faulty = job_config(workdir, "model._target_=tests.faults.GPTWithoutResiduals")
    assert model_node(faulty.model) is faulty.model


CASES = {
    "unknown key": (
        [STRICT, "+model.depth=3"],
        "model: tests.user_models.StrictLM does not take depth (its arguments: layers, seq_len,",
    ),
    "unknown key in kwargs": (
        [STRICT, "+model.kwargs={width: 16, heads: 2}"],
        "does not take heads",
    ),
    "required argument missing": (
        ["model._target_=tests.user_models.NeedsDepth"],
        "model: tests.user_models.NeedsDepth needs depth, which the config does not give: add "
        "+model.depth=VALUE",
    ),
    "target not importable": (["model._target_=no_such_pkg.Model"], "cannot be imported"),
}


@pytest.mark.parametrize(("overrides", "expected"), CASES.values(), ids=CASES.keys())
def test_a_mismatch_is_refused_in_one_line(workdir, capsys, overrides, expected):
    with pytest.raises(SystemExit) as exit_:
        hyprun(["train", f"checkpoint.dir={workdir}/ckpt", *overrides])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip()
    assert expected in err and "\n" not in err, err
    assert not (workdir / "mlflow.db").exists() and not (workdir / "ckpt").exists()
