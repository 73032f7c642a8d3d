"""Compose the job config from overrides, turning Hydra's multi-line errors into one line."""

from __future__ import annotations

import os
from collections.abc import Sequence

from hydra import compose as hydra_compose
from hydra import initialize_config_dir, initialize_config_module
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import (
    ConfigCompositionException,
    HydraException,
    MissingConfigException,
    OverrideParseException,
)
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from hyprun.runner.errors import BadInput

CONFIG_MODULE = "hyprun.conf"
APP_OUTPUT_DIR = "(the run's output folder)"
"""What an app's `${hydra:runtime.output_dir}` reads while hyprun compares configs: the same for
every run, so folders never count as a change."""
CONFIG_NAME = "train"


def compose(
    overrides: Sequence[str] = (),
    config_name: str = CONFIG_NAME,
    return_hydra_config: bool = False,
    config_dir: str | None = None,
    version_base: str | None = "1.3",
    output_dir: str = APP_OUTPUT_DIR,
) -> DictConfig:
    """The resolved job config for `overrides`, or BadInput naming the bad override and the fix.
    `return_hydra_config` keeps Hydra's own node (`hydra.launcher` among it), unresolved.
    `config_dir`: a user's app's config folder instead of ours (`version_base` as its
    `@hydra.main` says; `output_dir` what its `${hydra:runtime.output_dir}` reads)."""
    overrides = list(overrides)
    kwargs = {"overrides": overrides, "return_hydra_config": return_hydra_config}
    try:
        if config_dir is not None:
            cfg = _compose_app(config_dir, config_name, overrides, version_base, output_dir)
        elif GlobalHydra.instance().is_initialized():  # inside a Hydra app: reuse its search path
            cfg = hydra_compose(config_name, **kwargs)
        else:
            with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
                cfg = hydra_compose(config_name, **kwargs)
        job = cfg
        if return_hydra_config:
            job = cfg.copy()
            with open_dict(job):
                del job["hydra"]  # its run-time values (hydra.job.num, ...) are unset here
        OmegaConf.to_container(job, resolve=True)  # surface interpolation errors now
        missing = sorted(OmegaConf.missing_keys(job))
        if missing:
            raise BadInput(f"{missing[0]} is required: add {missing[0]}=VALUE to the command")
    except MissingConfigException as e:
        raise BadInput(_missing_config(e)) from None
    except OverrideParseException as e:
        raise BadInput(f"cannot parse an override ({one_line(e)}): write key=value") from None
    except ConfigCompositionException as e:
        raise BadInput(_composition(e, config_dir)) from None
    except OmegaConfBaseException as e:
        raise BadInput(_omegaconf(e)) from None
    except ValueError as e:  # Hydra's own checks past its parser, e.g. a group override of 0.1
        raise BadInput(f"{one_line(e)}: check the overrides {' '.join(overrides)}") from None
    return cfg


def _compose_app(
    config_dir: str,
    config_name: str,
    overrides: list[str],
    version_base: str | None,
    output_dir: str,
) -> DictConfig:
    """A user's app's config, with what Hydra fills in only when it runs the app (the output
    folder, the working folder) set as a run sets it, so `${hydra:...}` interpolations resolve."""
    GlobalHydra.instance().clear()  # an app run in this process leaves its own behind
    with initialize_config_dir(config_dir=config_dir, version_base=version_base):
        cfg = hydra_compose(config_name, overrides=overrides, return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = output_dir
        cfg.hydra.runtime.cwd = os.getcwd()
        cfg.hydra.job.num = 0
    HydraConfig.instance().set_config(cfg)
    job = cfg.copy()
    with open_dict(job):
        del job["hydra"]
    return job


def check_overrides(overrides: Sequence[str]) -> None:
    """Refuse, one override at a time, what a user's list must not hold: text Hydra cannot
    parse, an empty key (`=0.1`), a package (`@pkg`), a sweep (`a=1,2`) where one value is
    meant, or a key given twice (which value is meant?). compose() itself takes a key twice:
    a test's delta is composed on top of its baseline's overrides and wins."""
    parser = OverridesParser.create()
    seen: dict[str, str] = {}
    for text in overrides:
        try:
            [override] = parser.parse_overrides([text])
        except HydraException as e:
            raise BadInput(
                f"cannot parse an override {text!r} ({one_line(e)}): write key=value"
            ) from None
        key = override.key_or_group
        if not key or override.package is not None:
            raise BadInput(f"{text!r} names no config key: write key=value, e.g. optim.lr=3e-4")
        if override.is_sweep_override():
            raise BadInput(
                f"{text} is a sweep over several values: give one value, "
                "or search them with 'hyprun sweep'"
            )
        if key in seen:
            raise BadInput(f"{key} is given twice ({seen[key]} and {text}): keep one")
        seen[key] = text


def one_line(error: BaseException) -> str:
    return " ".join(str(error).split())


def _missing_config(e: MissingConfigException) -> str:
    options = ", ".join(e.options or [])
    hint = f": choose one of {options}" if options else ""
    return f"no config {e.missing_cfg_file!r}{hint}"


def _composition(e: ConfigCompositionException, config_dir: str | None = None) -> str:
    text = str(e)
    if text.startswith("Could not override '"):
        key = text.split("'")[1]
        where = (
            f"the app's config in {config_dir}"
            if config_dir
            else ("`python -m hyprun.runner.job.train --cfg job`")
        )
        return (
            f"unknown config key {key!r}: check its spelling against {where}, "
            f"or add a new key with '+{key}=...'"
        )
    if text.startswith("Could not append to config"):
        return f"{one_line(e)}: drop the '+' to override an existing key"
    return one_line(e)


def _omegaconf(e: OmegaConfBaseException) -> str:
    key = getattr(e, "full_key", "") or ""
    return f"{key + ': ' if key else ''}{one_line(e).split(' full_key:')[0]}"
