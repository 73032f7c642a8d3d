"""What a `_target_` model is given: only the arguments its constructor takes.

The `model` config group carries the built-in GPT's switches (`d_ff`, `norm`, `placement`, ...).
A user's model named by `model._target_=my_pkg.MyModel` gets, of those, only the keys its
constructor accepts; the GPT switches it does not take are left out (they describe another
model). Its own arguments go in the config like any key (`+model.n_embd=128`), or all together
under `model.kwargs`, which is then passed as it is (plus `vocab_size` and `seq_len` when the
constructor takes them). A constructor with `**kwargs` gets everything, as before.

A mismatch is bad input, refused before anything runs: a required argument the config does not
give, or a key of the user's that the constructor does not take.
"""

from __future__ import annotations

import inspect
import pkgutil

from omegaconf import DictConfig, OmegaConf

from hyprun.runner.errors import BadInput

BUILT_IN = "hyprun.runner.job.models.GPT"
HYDRA_KEYS = ("_target_", "_partial_", "_convert_", "_recursive_", "_args_")
SHARED = ("vocab_size", "seq_len")
"""Keys every model may take from the job (the data's vocabulary, the sequence length)."""
KWARGS = "kwargs"


def model_node(node: DictConfig) -> DictConfig:
    """The `model` config reduced to what its `_target_` constructor accepts; BadInput (one
    line naming the keys and the fix) on a mismatch."""
    target = node.get("_target_")
    if target == BUILT_IN or not target:
        return node
    parameters = _parameters(target)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return node
    accepted = {
        name
        for name, p in parameters.items()
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }
    given = {k: v for k, v in node.items() if k not in HYDRA_KEYS}
    if KWARGS in given and KWARGS not in accepted:
        own = dict(given[KWARGS] or {})
        chosen = {**{k: given[k] for k in SHARED if k in accepted and k in given}, **own}
        _refuse_unknown(target, set(own) - accepted, accepted, "model.kwargs")
    else:
        built_in = set(_parameters(BUILT_IN))
        _refuse_unknown(target, set(given) - accepted - built_in, accepted, "model")
        chosen = {k: v for k, v in given.items() if k in accepted}
    required = [
        name
        for name, p in parameters.items()
        if name in accepted and p.default is inspect.Parameter.empty and name not in chosen
    ]
    if required:
        listed = ", ".join(required)
        raise BadInput(
            f"model: {target} needs {listed}, which the config does not give: add "
            + " ".join(f"+model.{name}=VALUE" for name in required)
        )
    kept = {k: node[k] for k in HYDRA_KEYS if k in node}
    return OmegaConf.create({**kept, **chosen})


def _refuse_unknown(target: str, unknown: set[str], accepted: set[str], where: str) -> None:
    if not unknown:
        return
    names = ", ".join(sorted(unknown))
    raise BadInput(
        f"model: {target} does not take {names} (its arguments: {', '.join(sorted(accepted))}): "
        f"remove them from {where}, or rename them to the constructor's arguments"
    )


def _parameters(target: str) -> dict[str, inspect.Parameter]:
    # pkgutil, not hydra.utils.get_object: Hydra's logs the failure through the logging
    # module, whose handlers (an app's, a test's) can print a second message or a traceback.
    try:
        built = pkgutil.resolve_name(target)
    except Exception as error:
        raise BadInput(
            f"model._target_={target} cannot be imported ({' '.join(str(error).split())[:200]}): "
            "check the module path and that the package is installed"
        ) from None
    try:
        return dict(inspect.signature(built).parameters)
    except (TypeError, ValueError):
        return {"kwargs": inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)}
