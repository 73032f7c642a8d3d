"""Knobs (issue 26 item 2): the cards in a user's app's own keys.

The vocabulary is the cards' keys and the presets' defaults are the libraries' own (real
transformers and lightning, read at test time); a card's delta translates key by key, a card
that does not translate names the knob to declare; diagnose's findings carry their cards in the
app's keys and the next step; a wrong `knobs:`/`preflight:` in hyprun.yaml is one line, exit 2,
nothing written. End to end on the HF Trainer app (slow): its baseline names
`lr_up_10x (training.learning_rate=*10)` and `hyprun test lr_up_10x` runs exactly that.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from pathlib import Path

import pytest
import yaml

from hyprun.hypotheses.schema import load_cards
from hyprun.runner.cli.main import main as hyprun
from hyprun.runner.control.diagnose import drop_noop_cards, named_cards, next_step
from hyprun.runner.launch.app_preflight import fields_in_source, unread
from hyprun.runner.launch.knobs import from_dicts, load_knobs, resolve, translate, value_problem
from hyprun.runner.store.investigation import Store

ROOT = Path(__file__).parents[1]
TOY = ROOT / "tests" / "apps" / "toy"
CARDS = load_cards()
HF = resolve({"preset": "hf", "prefix": "training"})
LIGHTNING = resolve({"preset": "lightning", "prefix": "trainer", "optim.lr": "optim.lr"})
HF_BASELINE = {"training": {"learning_rate": 1e-4, "warmup_steps": 0, "max_steps": 40}}


def run_cli(*args: str) -> int:
    with pytest.raises(SystemExit) as exit_:
        hyprun(list(args))
    return exit_.value.code


def test_the_vocabulary_is_the_cards_keys_and_the_declared_settings_diagnosis_reads():
    """Every card's variable is a knob; a knob no card changes is a setting whose declared
    value a finding holds against what the run applied (diag/features.py `declared`)."""
    vocabulary, variables = set(load_knobs().vocabulary), {c.variable for c in CARDS.values()}
    assert variables <= vocabulary
    features = (ROOT / "diag" / "features.py").read_text()
    for name in vocabulary - variables:
        assert f'"{name}"' in features, name  # declared(ev, name) by its name


def test_each_presets_defaults_are_the_librarys_own():
    from lightning.pytorch import Trainer
    from transformers import TrainingArguments

    fields = {f.name: f.default for f in dataclasses.fields(TrainingArguments)}
    parameters = {n: p.default for n, p in inspect.signature(Trainer.__init__).parameters.items()}
    for name, library in (("hf", fields), ("lightning", parameters)):
        for knob, field in load_knobs().presets[name].knobs.items():
            assert field.key in library, (name, knob, field.key)
            assert library[field.key] == field.default, (name, knob, library[field.key])


def test_the_fields_read_from_a_librarys_source_are_its_classes_own():
    """A new key under a preset's prefix is judged without importing the library (torch):
    the fields read from its source are those the imported class has."""
    from lightning.pytorch import Trainer
    from transformers import TrainingArguments

    parameters = set(inspect.signature(Trainer.__init__).parameters) - {"self"}
    for name, imported in (
        ("hf", {f.name for f in dataclasses.fields(TrainingArguments)}),
        ("lightning", parameters),
    ):
        reads = load_knobs().presets[name].reads
        assert fields_in_source(*reads.split(":")) == imported, name


def translated(card: str, knobs=HF, baseline=HF_BASELINE):
    return translate(CARDS[card], knobs, baseline)


def test_a_card_translates_key_by_key_into_the_apps_keys():
    assert translated("lr_up_10x").overrides == ("training.learning_rate=*10",)
    assert translated("warmup").overrides == ("training.warmup_steps=0.05",)
    # a key the app leaves to the library: added, from the preset's default
    assert translated("micro_batch_down").overrides == ("+training.per_device_train_batch_size=4",)
    assert translated("bf16").overrides == ("+training.bf16=true",)  # the library's own values
    assert translated("bf16", LIGHTNING).overrides == ("+trainer.precision=bf16-mixed",)
    assert translated("lr_down_10x", LIGHTNING, {"optim": {"lr": 3e-3}}).overrides == (
        "optim.lr=*0.1",
    )
    # explicit entries win over the preset's
    mine = resolve({"preset": "hf", "prefix": "training", "optim.lr": "lr"})
    assert translated("lr_up_10x", mine, {"lr": 0.1, **HF_BASELINE}).overrides == ("lr=*10",)
    assert translated("grad_accum_up", LIGHTNING, {}).overrides == (
        "+trainer.accumulate_grad_batches=4",  # the Trainer's default 1, x 4
    )


def test_a_card_that_would_change_nothing_or_cannot_translate_says_why():
    clip = translated("grad_clip")
    assert clip.noop == "training.max_grad_norm is already 1.0, the default of preset hf"
    assert translated("weight_decay_up").overrides == ("+training.weight_decay=0.0",)  # 0 x 3
    betas = translated("adamw_betas")
    assert betas.missing == "optim.betas" and not betas.overrides
    assert betas.reason == (
        "needs the knob optim.betas: declare knobs: {optim.betas: <your key>} in hyprun.yaml"
    )
    assert translated("lr_up_10x", resolve({"optim.lr": "lr"}), {}).reason == (
        "lr is not in your config and its default is None: '*10' has nothing to scale; "
        "set it in your config"
    )
    assert translated("lr_up_10x", resolve({"preset": "lightning", "prefix": "t"})).missing == (
        "optim.lr"  # Lightning's Trainer has no LR: the module's config does
    )
    assert translated("fp32", LIGHTNING).overrides == ("+trainer.precision=32-true",)
    schedule = resolve({"sched": "scheduler"})  # a choice passes as the card writes it
    assert translated(
        "sched_cosine_warm_restarts", schedule, {"scheduler": "cosine"}
    ).overrides == ("scheduler=cosine_warm_restarts",)


def test_a_card_value_the_library_has_no_word_for_does_not_apply():
    fp16 = CARDS["bf16"].model_copy(update={"id": "fp16", "delta": ("ds.precision=fp16",)})
    assert translate(fp16, HF, HF_BASELINE).reason == (
        "ds.precision=fp16 has no counterpart in preset hf's training.bf16 (it maps bf16, fp32)"
    )
    assert translate(fp16, LIGHTNING, {}).overrides == ("+trainer.precision=16-mixed",)


def test_a_knobs_range_holds_where_the_apps_key_means_the_knob():
    assert value_problem(HF["optim.lr"], -1) == "the learning rate (optim.lr) must be > 0"
    assert value_problem(HF["ds.micro_batch"], 4.5) == (
        "the micro-batch size per device (ds.micro_batch) is a whole number"
    )
    assert value_problem(HF["sched.warmup_frac"], 30) is None  # HF's warmup_steps: steps too
    fraction = resolve({"sched.warmup_frac": "warmup"})["sched.warmup_frac"]
    assert value_problem(fraction, 30) == (
        "the warmup's fraction of the budget (sched.warmup_frac) must be < 1"
    )


def test_a_new_key_is_read_only_when_a_knob_or_the_presets_class_reads_it():
    declared = {"preset": "lightning", "prefix": "trainer"}
    assert unread("trainer.gradient_clip_val", LIGHTNING, declared) is None  # a knob's key
    assert unread("trainer.max_epochs", LIGHTNING, declared) is None  # a Trainer argument
    assert unread("trainer.gradient_clip_vall", LIGHTNING, declared) == (
        "lightning.pytorch.trainer.trainer:Trainer has no field 'gradient_clip_vall': nothing "
        "would read it; "
        "fix the spelling"
    )
    assert "not in the app's config" in unread("optim.momentum", LIGHTNING, declared)


def test_diagnose_names_an_apps_cards_in_its_keys_and_the_knob_to_declare():
    findings = [
        {"id": "loss_flat", "cards": ["lr_up_10x", "grad_clip"]},
        {"id": "drift_from_init", "cards": ["adamw_betas"]},
    ]
    knobs = from_dicts(json.loads(json.dumps({k: v.as_dict() for k, v in HF.items()})))
    drop_noop_cards(findings, HF_BASELINE, knobs)
    flat, drift = findings
    assert flat["cards"] == ["lr_up_10x"] and flat["deltas"] == {
        "lr_up_10x": ["training.learning_rate=*10"]
    }
    assert flat["cards_not_suggested"][0]["card"] == "grad_clip"  # 1.0 is the default already
    assert named_cards(flat) == "lr_up_10x (training.learning_rate=*10)"
    assert drift["cards"] == [] and drift["knobs_to_declare"] == ["optim.betas"]
    assert named_cards(drift) == (
        "no card applies: declare knobs: {optim.betas: <your key>} in hyprun.yaml"
    )
    assert next_step({"findings": findings}) == (
        "next: hyprun test lr_up_10x --why ...  (runs training.learning_rate=*10)"
    )
    assert next_step({"findings": [drift]}) == (
        "next: declare knobs: {optim.betas: <your key>} in hyprun.yaml, so the cards of "
        "drift_from_init apply"
    )


@pytest.fixture
def here(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{workdir}/mlflow.db")
    return workdir  # the apps run in this process, which imports tests.apps


DECLARED = {
    "a preset that does not exist": (
        {"knobs": {"preset": "keras", "prefix": "fit"}},
        "knobs.preset: no preset 'keras': choose one of hf, lightning",
    ),
    "a preset without its prefix": (
        {"knobs": {"preset": "hf"}},
        "knobs: preset and prefix go together",
    ),
    "a knob the cards do not use": (
        {"knobs": {"optim.learning_rate": "opt.lr"}},
        "knobs.optim.learning_rate is not a knob the cards use: choose among",
    ),
    "a knob's key the config lacks": (
        {"knobs": {"optim.lr": "opt.learning_rate"}},
        "knobs.optim.lr names 'opt.learning_rate', which is not a key of the app's config",
    ),
    "a preflight that is not module:function": (
        {"preflight": "checks"},
        "preflight: String should match pattern",
    ),
    "a preflight that does not import": (
        {"preflight": "tests.apps.toy.nothing:check"},
        "preflight tests.apps.toy.nothing:check cannot be imported",
    ),
}


@pytest.mark.parametrize(("changes", "expected"), DECLARED.values(), ids=DECLARED.keys())
def test_a_wrong_knobs_or_preflight_entry_is_refused_before_the_baseline(
    here, capsys, changes, expected
):
    declared = {**yaml.safe_load((TOY / "hyprun.yaml").read_text()), **changes}
    (here / "hyprun.yaml").write_text(yaml.safe_dump(declared))
    assert run_cli("baseline", "--seeds", "1") == 2
    err = capsys.readouterr().err
    assert expected in err and err.count("\n") == 1, err
    assert not (here / "mlflow.db").exists() and not (here / ".hyprun").exists()


@pytest.mark.slow  # 4 seeds of the HF Trainer app (~1 min on 2 busy cores)
def test_hf_app_baseline_suggests_lr_up_10x_in_its_keys_and_the_card_runs_them(
    here, capsys, one_torch_thread
):
    app = "tests.apps.hf_gpt2.train:main"
    low = "training.learning_rate=1e-4"
    assert run_cli("baseline", "--app", app, low, "--seeds", "2", "--investigation", "hf") == 0
    err = capsys.readouterr().err
    assert "next: hyprun test lr_up_10x --why ...  (runs training.learning_rate=*10)" in err, err
    findings = Store(f"sqlite:///{here}/mlflow.db", "hyprun").find("hf").findings
    assert findings and {"lr_up_10x"} <= set(findings[0]["cards"]), findings  # kept for status
    assert findings[0]["variables"] == ["training.learning_rate"], findings
    assert (
        run_cli("test", "lr_up_10x", "--why", "I think the LR is too low because it is flat") == 0
    )
    [test] = Store(f"sqlite:///{here}/mlflow.db", "hyprun").find("hf").tests
    assert test.card == "lr_up_10x" and test.delta == ["training.learning_rate=0.001"], test.tags
    assert test.verdict == "confirmed", test.tags.get("hyprun.reason")
