"""L1 diagnostics inside the job: when to probe, and the gathering that sharding requires.

The statistics themselves are `hyprun.diag.probes`; this module owns what touches DeepSpeed: full
gradients and fp32 parameters are assembled with DeepSpeed's `safe_get_full_*` (collectives
under ZeRO, so every rank probes the same steps), which is what makes the global gradient norm
equal an unsharded run's at any ZeRO stage.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import platform
import resource
import time
import warnings
from contextlib import ExitStack, contextmanager
from pathlib import Path

import torch
from omegaconf import DictConfig

from hyprun.diag import probes
from hyprun.diag.efficiency import device_peak, mfu
from hyprun.diag.spikes import SpikeDetector


def full_grad(param: torch.nn.Parameter) -> torch.Tensor | None:
    from deepspeed.utils import safe_get_full_grad

    return safe_get_full_grad(param)


def full_param(param: torch.nn.Parameter) -> torch.Tensor:
    from deepspeed.utils import safe_get_full_fp32_param

    found = safe_get_full_fp32_param(param)
    return param.data if found is None else found


class Instruments:
    """The L1 probes of one job, configured by the `probes` group."""

    def __init__(
        self, cfg: DictConfig, engine, precision: str, world: int, seq_len: int | None = None
    ):
        self.cfg, self.engine, self.world = cfg, engine, world
        self.model = engine.module
        self.named = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        self.flops_per_token = _flops_per_token(self.model, seq_len)
        self.peak = PeakFlops(engine.device, precision, cfg.peak_flops)
        self.loss_spikes = SpikeDetector()
        self.grad_spikes = SpikeDetector()
        self.initial = self._params_on_cpu() if cfg.every_steps and cfg.parameters else None
        self.initial_norm = probes.grouped_norms(self.initial.items())[0] if self.initial else 0.0
        self._before: dict[str, torch.Tensor] = {}
        self.scan = probes.StepScan()
        self.schedule = probes.ProbeSchedule(
            cfg.every_steps, cfg.get("max_overhead", 0.0), cfg.get("free_probes", 0)
        )

    def probing(self, step: int) -> bool:
        """Probe the first step and every `every_steps` after it, within the overhead cap
        (hyprun.diag.probes.ProbeSchedule); call once per step."""
        return self.schedule.due(step)

    @contextmanager
    def forward(self, active: bool):
        """Around one forward pass: block and attention capture when `active`."""
        if not active or not self.cfg.activations:
            yield None
            return
        with ExitStack() as stack:
            blocks = stack.enter_context(probes.block_probe(self.model))
            heads = stack.enter_context(
                probes.attention_capture(self.model, self.cfg.attention_heads)
            )
            found: dict[str, float] = {}
            yield found
        found.update({f"act/rms/{k}": v for k, v in blocks.rms.items()})
        found.update({f"act/write_ratio/{k}": v for k, v in blocks.write_ratio.items()})
        found.update({f"attn/entropy/{k}": v for k, v in heads.items()})
        found.update(probes.moe_stats(self.model))

    def gradients(self) -> dict[str, float]:
        """After the last backward of a step, before clipping: gradient norms and NaN/Inf.
        Also remembers the parameters, for the update ratio after the step."""
        start = time.perf_counter()
        metrics: dict[str, float] = {}
        if self.cfg.gradients:
            grads = [(n, g) for n, p in self.named if (g := full_grad(p)) is not None]
            total, per_group = probes.grouped_norms(grads)
            metrics["grad/norm"] = total
            metrics.update({f"grad/norm/{k}": v for k, v in per_group.items()})
            metrics["grad/nonfinite"] = float(not math.isfinite(total))
            if self.cfg.spikes and math.isfinite(total):
                metrics["anomaly/grad_spike"] = float(self.grad_spikes.update(total))
        if self.cfg.parameters:
            self._before = {n: full_param(p).detach().float().clone() for n, p in self.named}
        self.schedule.spent(time.perf_counter() - start)
        return metrics

    def parameters(self, scan: tuple[torch.Tensor, torch.Tensor] | None = None) -> dict[str, float]:
        """After the step: parameter norm, update/parameter ratio, distance from init, and the
        step scan on the held-out batch `scan` when one is given."""
        if not self.cfg.parameters or not self._before:
            return {}
        start = time.perf_counter()
        names = [n for n, _ in self.named]
        now = [full_param(p).detach().float() for _, p in self.named]
        device = now[0].device
        delta = torch._foreach_sub(now, [self._before[n] for n in names])
        moved = torch._foreach_sub(now, [self.initial[n].to(device) for n in names])
        norm, _ = probes.grouped_norms(zip(names, now, strict=True))
        step, _ = probes.grouped_norms(zip(names, delta, strict=True))
        drift, _ = probes.grouped_norms(zip(names, moved, strict=True))
        metrics = {
            "param/norm": norm,
            "param/update_ratio": step / max(norm, 1e-12),
            "param/dist_from_init": drift / max(self.initial_norm, 1e-12),
        }
        embedding = next(
            (t for n, t in zip(names, now, strict=True) if n.startswith("tok_emb")), None
        )
        if embedding is not None:
            metrics["param/embedding_rms"] = float(embedding.pow(2).mean().sqrt())
        if scan is not None and self.cfg.step_scan:
            metrics.update(self.step_scan(delta, scan))
        self._before = {}
        self.schedule.spent(time.perf_counter() - start)
        return metrics

    def step_scan(
        self, delta: list[torch.Tensor], batch: tuple[torch.Tensor, torch.Tensor]
    ) -> dict[str, float]:
        """The held-out loss along the step just taken (hyprun.diag.probes.StepScan)."""
        params = [p for _, p in self.named]
        if any(hasattr(p, "ds_tensor") for p in params):
            return {}  # ZeRO-3 holds a shard per rank: no full weights to move
        data = [p.data for p in params]
        return self.scan(self.model, data, delta, lambda: self.model(*batch))

    def loss(self, value: float) -> dict[str, float]:
        """Per logged loss: spike flags (6 sigma over the last 128, or 10x the moving average)."""
        if not self.cfg.spikes or not math.isfinite(value):
            return {}
        spike = self.loss_spikes.update(value)
        return {"anomaly/loss_spike": float(spike), "anomaly/spike_score": self.loss_spikes.score}

    def efficiency(self, tokens_per_s: float) -> dict[str, float]:
        """MFU against the device peak (all processes together), and peak memory."""
        metrics = {"perf/flops_per_s": tokens_per_s * self.flops_per_token}
        metrics.update(self.peak.mfu(tokens_per_s, self.flops_per_token, self.world))
        metrics["perf/peak_mem_gb"] = _peak_memory_gb(self.engine.device)
        if self.engine.wall_clock_breakdown():
            metrics.update(self._comm_share())
        return metrics

    def locate_nan(self, x: torch.Tensor, y: torch.Tensor) -> str | None:
        """Replay the batch whose loss was NaN/Inf and name the first module that produced one."""
        return probes.first_nonfinite_module(self.model, lambda: self.model(x, y))

    def _params_on_cpu(self) -> dict[str, torch.Tensor]:
        return {n: full_param(p).detach().float().cpu().clone() for n, p in self.named}

    def _comm_share(self) -> dict[str, float]:
        """Gradient all-reduce time over forward + backward + step, from DeepSpeed's timers."""
        from deepspeed.runtime.engine import (
            BACKWARD_GLOBAL_TIMER,
            BACKWARD_REDUCE_GLOBAL_TIMER,
            FORWARD_GLOBAL_TIMER,
            STEP_GLOBAL_TIMER,
        )

        timers = self.engine.timers
        names = (FORWARD_GLOBAL_TIMER, BACKWARD_GLOBAL_TIMER, STEP_GLOBAL_TIMER)
        total = sum(timers(n).elapsed(reset=True) for n in names)
        reduce = timers(BACKWARD_REDUCE_GLOBAL_TIMER).elapsed(reset=True)
        return {"perf/comm_frac": reduce / total} if total > 0 else {}


def _flops_per_token(model: torch.nn.Module, seq_len: int | None = None) -> float:
    """The model's own count when it has one (its attention term at the `seq_len` trained,
    when it takes one), else 6N (matmuls only)."""
    count = getattr(model, "flops_per_token", None)
    if count is None:
        return 6.0 * sum(p.numel() for p in model.parameters())
    if seq_len is not None and "seq_len" in inspect.signature(count).parameters:
        return float(count(seq_len=seq_len))
    return float(count())


class PeakFlops:
    """The MFU denominator of one process: the device table's peak for a GPU, a measured matmul
    peak for a CPU, or the config's `probes.peak_flops`.

    An MFU above 1 is never a measurement: on a CPU it means the peak was measured while the
    machine was busy, so it is measured again; if the MFU still exceeds 1 it is not logged as
    `perf/mfu` but as `perf/mfu_above_peak`, with a warning (issue 17 once read 4.25)."""

    def __init__(self, device: torch.device, precision: str, given: float | None = None):
        self.measured = not given and device.type != "cuda"
        self.value = given or _device_peak(device, precision)

    def mfu(self, tokens_per_s: float, flops_per_token: float, world: int) -> dict[str, float]:
        if not self.value:
            return {}
        value = mfu(tokens_per_s, flops_per_token, self.value * world)
        if value > 1 and self.measured:
            self.value = max(self.value, cpu_peak(refresh=True))
            value = mfu(tokens_per_s, flops_per_token, self.value * world)
        if value <= 1:
            return {"perf/mfu": value}
        warnings.warn(
            f"MFU {value:.2f} > 1: the peak of {self.value / 1e9:.1f} GFLOP/s per device is "
            "below what the job achieved; logged as perf/mfu_above_peak, not perf/mfu (set "
            "probes.peak_flops to this device's peak)",
            RuntimeWarning,
            stacklevel=2,
        )
        return {"perf/mfu_above_peak": value}


def _device_peak(device: torch.device, precision: str) -> float | None:
    if device.type == "cuda":
        return device_peak(torch.cuda.get_device_name(device), precision)
    return cpu_peak()


CPU_PEAK_CACHE = Path.home() / ".cache" / "hyprun" / "cpu_peak.json"
_cpu_peak_seen: dict[str, float] = {}


def cpu_peak(cache: Path | None = None, refresh: bool = False) -> float:
    """A CPU has no datasheet peak: the best fp32 matmul rate this machine has shown, per CPU
    model, thread count and torch version. A peak is a best case (a busy machine only lowers
    a measurement), so each measurement is the best of several trials, and the answer is the
    best of it and every earlier one on this machine (kept in `cache`). Measured once per
    process unless `refresh`."""
    cache = cache or CPU_PEAK_CACHE
    key = _cpu_key()
    if key in _cpu_peak_seen and not refresh:
        return _cpu_peak_seen[key]
    best = measured_cpu_peak()
    try:
        known = json.loads(cache.read_text())
    except (OSError, ValueError):
        known = {}
    best = max(best, float(known.get(key, 0.0)))
    if best > float(known.get(key, 0.0)):
        _remember(cache, {**known, key: best})
    _cpu_peak_seen[key] = best
    return best


def measured_cpu_peak(size: int = 512, trials: int = 5, seconds: float = 0.05) -> float:
    """The best of `trials` timings of fp32 `size`-square matmuls, in FLOP/s. Its inputs come
    from a generator of its own: the job's random stream is the same whether or not it runs."""
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=generator)
    b = torch.randn(size, size, generator=generator)
    a @ b  # warm-up
    rates = []
    for _ in range(trials):
        count, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds:
            a @ b
            count += 1
        rates.append(2.0 * size**3 * count / elapsed)
    return max(rates)


def _cpu_key() -> str:
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            names = [line.split(":", 1)[1].strip() for line in info if "model name" in line]
        model = names[0] if names else model
    except OSError:
        pass
    return f"{model} | {torch.get_num_threads()} threads | torch {torch.__version__}"


def _remember(cache: Path, peaks: dict[str, float]) -> None:
    """Write the cache whole or not at all (jobs on one machine may write it together)."""
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        partial = cache.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps(peaks, indent=1))
        partial.replace(cache)
    except OSError:
        pass  # a read-only home: the peak is still this process's best


def _peak_memory_gb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
