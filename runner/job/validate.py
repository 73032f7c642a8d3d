"""Checks on a composed job config that must pass before anything is built or launched."""

from __future__ import annotations

import math

from omegaconf import DictConfig, OmegaConf

from hyprun.runner.errors import BadInput
from hyprun.runner.job import threads
from hyprun.runner.job.engine import PRECISIONS
from hyprun.runner.job.model_protocol import model_node

PROBE_SWITCHES = ("gradients", "parameters", "activations", "nan_check", "step_scan", "spikes")
"""The `probes` group's on/off keys: a string there ("maybe") would read as on."""


def validate(cfg: DictConfig) -> None:
    """Raise BadInput (one line: the problem and the fix) for a job that must not start."""
    _positive_int(cfg, "budget.tokens", "the number of tokens to train on")
    _positive_int(cfg, "budget.eval_every_tokens", "held-out evaluation interval in tokens")
    _positive_int(cfg, "budget.eval_sequences", "the size of the held-out set")
    _positive_int(cfg, "ds.micro_batch", "sequences per process per micro-step")
    _positive_int(cfg, "ds.grad_accum", "micro-steps per optimizer step")
    _positive_int(cfg, "tracking.log_every_steps", "the metric logging interval")
    _number(cfg, "optim.lr", lower=0.0, lower_open=True)
    _number(cfg, "ds.grad_clip", lower=0.0)
    _number(cfg, "checkpoint.every_tokens", lower=0.0)
    for switch in PROBE_SWITCHES:
        _switch(cfg, f"probes.{switch}")
    if cfg.ds.zero_stage not in (0, 1, 2, 3):
        raise BadInput(f"ds.zero_stage={cfg.ds.zero_stage} is not a ZeRO stage: use 0, 1, 2 or 3")
    if cfg.ds.precision not in PRECISIONS:
        raise BadInput(
            f"ds.precision={cfg.ds.precision} is unknown: use one of {', '.join(PRECISIONS)}"
        )
    if cfg.ds.precision == "fp16" and not _cuda_available():
        raise BadInput(
            "ds.precision=fp16 needs a GPU (no CUDA device here): use bf16 or fp32 on a CPU"
        )
    if cfg.checkpoint.resume not in ("auto", "never"):
        raise BadInput(f"checkpoint.resume={cfg.checkpoint.resume} is unknown: use auto or never")
    model_node(cfg.model)  # a user's model and the keys it is given (imports only a user's)
    threads.choose(OmegaConf.select(cfg, "threads"), env={})  # a count that is not one


def reachable(uri: str, timeout_s: float = 5.0) -> None:
    """BadInput, at once, when an http(s) tracking server does not accept connections (MLflow
    itself would retry for minutes before saying so)."""
    import socket
    from urllib.parse import urlsplit

    from hyprun.runner.store.outage import await_server

    parts = urlsplit(uri)
    if parts.scheme not in ("http", "https"):
        return
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        with socket.create_connection((parts.hostname or "", port), timeout=timeout_s):
            pass
    except OSError as error:  # BadInput, unless a server that answered is restarting
        await_server(uri, error.strerror or error)


def _cuda_available() -> bool:
    """Whether torch sees a GPU; torch is imported only for a config that asks for fp16, so the
    commands that refuse bad input answer before torch's 2-5 s import."""
    import torch

    return torch.cuda.is_available()


def _positive_int(cfg: DictConfig, key: str, what: str) -> None:
    value = _get(cfg, key)
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value != int(value) or value <= 0:
        raise BadInput(f"{key}={value!r} must be a positive whole number ({what})")


def _switch(cfg: DictConfig, key: str) -> None:
    value = _get(cfg, key)
    if not isinstance(value, bool):
        raise BadInput(f"{key}={value!r} must be true or false")


def _number(cfg: DictConfig, key: str, lower: float, lower_open: bool = False) -> None:
    value = _get(cfg, key)
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < lower or (lower_open and value == lower):
        bound = f"> {lower}" if lower_open else f">= {lower}"
        raise BadInput(f"{key}={value!r} must be a finite number {bound}")


def _get(cfg: DictConfig, key: str):
    node = cfg
    for part in key.split("."):
        if not isinstance(node, DictConfig) or part not in node:
            raise BadInput(f"{key} is missing from the config: the job needs it; set {key}=VALUE")
        node = node[part]
    return node
