"""The controlled training job: `python -m hyprun.runner.job.train [overrides]`, a Hydra app.

Build model, data, optimizer and schedule by instantiation, wrap them in a DeepSpeed engine, train
to a token budget, evaluate on a fixed held-out set at fixed token marks, and record everything in
one MLflow run (resumed, not duplicated, when the job is rerun after an interruption).

Exit codes: 0 the job ran to its end (completed, or diverged: a recorded result), 2 bad input
(nothing started), 75 interrupted by SIGTERM/SIGUSR1/SIGUSR2 after a checkpoint (rerun to resume).
"""

from __future__ import annotations

import math
import signal
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.progress import Progress, TextColumn

from hyprun.diag.evidence import NAN_MODULE_TAG, NAN_UPDATES_TAG
from hyprun.runner import provenance
from hyprun.runner.compose import compose, one_line
from hyprun.runner.errors import BadInput
from hyprun.runner.job import dist as distributed
from hyprun.runner.job import threads
from hyprun.runner.job.checkpoint import Checkpointer, StopSignals, config_hash
from hyprun.runner.job.data.loader import build_loader, heldout_batches
from hyprun.runner.job.engine import build_engine, check_extra
from hyprun.runner.job.instrument import Instruments
from hyprun.runner.job.model_protocol import model_node
from hyprun.runner.job.optim import build_optimizer
from hyprun.runner.job.result import JobResult
from hyprun.runner.job.validate import reachable, validate
from hyprun.runner.store.tracking import Tracker, TrackingOffline, flatten

EXIT_INTERRUPTED = 75
console = Console(stderr=True, highlight=False, soft_wrap=True)


@dataclass(frozen=True)
class Plan:
    """The token budget turned into steps for this batch geometry.

    A token is a position of a sequence the data source draws: the data's sequence length,
    which may be shorter than the model's context (data.source.seq_len=8 on a seq_len-64 model
    trains 8 tokens a sequence; counting 64 put every count and the MLflow step axis 8x off)."""

    tokens_per_step: int
    total_steps: int
    eval_every_steps: int
    ckpt_every_steps: int  # 0: only on a stop signal
    seq_len: int  # of the sequences trained on

    @classmethod
    def of(cls, cfg: DictConfig, world: int, seq_len: int | None = None) -> Plan:
        """`seq_len`: of the sequences the source draws (default: as the config says)."""
        seq_len = seq_len or configured_seq_len(cfg)
        context = OmegaConf.select(cfg, "model.seq_len")
        if isinstance(context, int) and seq_len > context:
            raise BadInput(
                f"data.source.seq_len={seq_len} is longer than the model's context "
                f"(model.seq_len={context}): set data.source.seq_len <= {context} or raise "
                "model.seq_len"
            )
        tokens_per_step = cfg.ds.micro_batch * cfg.ds.grad_accum * world * seq_len
        if cfg.budget.tokens < tokens_per_step:
            raise BadInput(
                f"budget.tokens={cfg.budget.tokens} is less than one optimizer step "
                f"({tokens_per_step} tokens): raise the budget or shrink ds.micro_batch"
            )

        def steps(tokens: float) -> int:
            return max(1, round(tokens / tokens_per_step)) if tokens > 0 else 0

        return cls(
            tokens_per_step=tokens_per_step,
            total_steps=math.ceil(cfg.budget.tokens / tokens_per_step),
            eval_every_steps=steps(cfg.budget.eval_every_tokens),
            ckpt_every_steps=steps(cfg.checkpoint.every_tokens),
            seq_len=seq_len,
        )

    @staticmethod
    def due(every: int, done: int) -> bool:
        """Whether an `every`-steps event (0 = never) falls after step `done`."""
        return bool(every) and done % every == 0


def configured_seq_len(cfg: DictConfig) -> int:
    """The data's sequence length as the config gives it, else the model's context."""
    given = OmegaConf.select(cfg, "data.source.seq_len")
    return int(given if given is not None else cfg.model.seq_len)


def drawn_seq_len(source, seed: int) -> int:
    """The length of the sequences `source` actually draws: training sequence 0's."""
    x, _ = source.train(0, 1, seed)
    return int(x.shape[-1])


def run(cfg: DictConfig, on_eval: Callable[[int, float], bool] | None = None) -> JobResult:
    """Run one job to its end or to a stop signal; BadInput before training on bad input.

    `on_eval(tokens, eval_loss)` is called at every held-out evaluation (every rank gets the
    same numbers); returning True stops the job there as `stopped` (early rejection)."""
    validate(cfg)
    chosen = threads.choose(OmegaConf.select(cfg, "threads"))
    with threads.limited(chosen.count):
        return _run(cfg, on_eval, chosen)


def _run(cfg: DictConfig, on_eval, chosen: threads.Choice) -> JobResult:
    check_extra(cfg.ds)
    reachable(cfg.tracking.uri)
    source = _build("data.source", cfg.data.source)  # a missing file fails before DeepSpeed loads
    dist = distributed.init()
    plan = Plan.of(cfg, dist.world, drawn_seq_len(source, cfg.budget.data_seed))
    torch.manual_seed(cfg.budget.seed)
    model = _build("model", model_node(cfg.model))
    optimizer = build_optimizer(model, cfg.optim)
    schedule = _build("sched", cfg.sched)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: schedule(step, plan.total_steps)
    )
    engine = build_engine(model, optimizer, scheduler, cfg.ds)
    # Before any checkpoint loads: the initial parameters are the reference for drift.
    instruments = Instruments(cfg.probes, engine, cfg.ds.precision, dist.world, plan.seq_len)

    ckpt = Checkpointer(cfg.checkpoint.dir, config_hash(cfg) + f"-w{dist.world}", dist.is_main)
    previous_run = ckpt.run_id() if cfg.checkpoint.resume == "auto" else None
    start_step = ckpt.load(engine) if previous_run else 0
    tracker = _open_tracker(cfg, dist, previous_run, ckpt.dir) if dist.is_main else None
    if tracker is not None:
        ckpt.remember_run(tracker.run_id)
        # The count torch runs with, and why: a speed compared across runs needs both.
        threads_used = {"threads": torch.get_num_threads(), "threads_from": chosen.source}
        tracker.log_params({f"runtime.{k}": str(v) for k, v in threads_used.items()})
    run_id = tracker.run_id if tracker else ""
    if start_step and dist.is_main:
        console.print(f"resuming run {run_id} at step {start_step}/{plan.total_steps}")

    loader = build_loader(
        source,
        seed=cfg.budget.data_seed,
        micro_batch=cfg.ds.micro_batch,
        grad_accum=cfg.ds.grad_accum,
        rank=dist.rank,
        world=dist.world,
        start_step=start_step,
        total_steps=plan.total_steps,
        **OmegaConf.to_container(cfg.data.loader, resolve=True),
    )
    heldout = heldout_batches(
        source, cfg.budget.eval_sequences, cfg.ds.micro_batch, dist.rank, dist.world
    )
    loop = TrainLoop(engine, plan, dist, tracker, heldout, instruments, cfg, on_eval)
    with StopSignals() as signals, _progress(dist.is_main, plan, start_step) as tick:
        loop.tick = tick
        status, step, train_loss = loop.train(iter(loader), start_step, ckpt, signals)
    # A job stopped early was evaluated at the step it stopped: its summary shows that loss.
    eval_loss = loop.evaluate(step) if status == "completed" else None
    if status == "stopped":
        eval_loss = loop.last_eval

    if status == "interrupted":
        loop.checkpoint(ckpt, step)
    if tracker is not None:
        tags = {
            "hyprun.outcome": status,
            "hyprun.tokens": step * plan.tokens_per_step,
            "hyprun.steps": step,
        }
        if status == "diverged":
            tags[NAN_UPDATES_TAG] = str(step - 1)  # the step that went NaN applied no update
        if loop.nan_module:
            tags[NAN_MODULE_TAG] = loop.nan_module
        tracker.set_tags(tags)
        ended = {"completed": "FINISHED", "stopped": "FINISHED", "diverged": "FAILED"}
        tracker.finish(ended.get(status, "KILLED"))
    if status != "interrupted":
        distributed.barrier()
        ckpt.finish()
    stopped_by = signal.Signals(signals.received).name if signals.received else None
    result = JobResult(
        run_id, status, step, step * plan.tokens_per_step, train_loss, eval_loss, stopped_by
    )
    if dist.is_main:
        console.print(_summary(result))
    return result


@dataclass(frozen=True)
class Clocks:
    """Wall seconds, and CPU seconds of the process and of the calling thread."""

    wall: float
    process: float
    thread: float

    @classmethod
    def now(cls) -> Clocks:
        return cls(time.perf_counter(), time.process_time(), time.thread_time())

    def __sub__(self, other: Clocks) -> Clocks:
        return Clocks(
            self.wall - other.wall, self.process - other.process, self.thread - other.thread
        )

    def __add__(self, other: Clocks) -> Clocks:
        return Clocks(
            self.wall + other.wall, self.process + other.process, self.thread + other.thread
        )


class TrainLoop:
    """The hot loop. Metrics leave it as detached tensors; `.item()` runs only at log steps and
    once per optimizer step for the NaN check (which a probe config can turn off)."""

    def __init__(
        self,
        engine,
        plan: Plan,
        dist,
        tracker: Tracker | None,
        heldout,
        instruments: Instruments,
        cfg: DictConfig,
        on_eval=None,
    ):
        self.engine, self.plan, self.dist, self.tracker = engine, plan, dist, tracker
        self.on_eval = on_eval
        self.last_eval: float | None = None
        self.tick: Callable[[], None] = lambda: None  # a progress bar's advance, on a terminal
        self.heldout, self.instruments = heldout, instruments
        self.log_every = cfg.tracking.log_every_steps
        self.nan_check = cfg.probes.nan_check
        self.accum = engine.gradient_accumulation_steps()
        self.nan_module: str | None = None
        # The step scan's fixed batch: the first held-out micro-batch, never trained on.
        first = heldout[0] if heldout else None
        self.scan_batch = tuple(t.to(dist.device) for t in first) if first else None

    def train(self, batches, start_step: int, ckpt: Checkpointer, signals: StopSignals):
        """Steps from `start_step` to the budget; returns (status, steps done, last train loss)."""
        plan, engine, device, tools = self.plan, self.engine, self.dist.device, self.instruments
        engine.train()
        loss_sum = torch.zeros((), device=device)
        data_wait, window_start, window_steps, last_loss = 0.0, Clocks.now(), 0, None
        nonfinite = torch.zeros(self.accum, device=device)
        for step in range(start_step, plan.total_steps):
            probing, probed, micro_batches = tools.probing(step), {}, []
            for micro in range(self.accum):
                fetch = time.perf_counter()
                x, y = next(batches)
                data_wait += time.perf_counter() - fetch
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                with tools.forward(probing and micro == 0) as seen:
                    loss = engine(x, y)
                probed.update(seen or {})  # filled when the probed forward ends
                engine.backward(loss)
                if self.nan_check:  # on the device: no host sync per micro-step
                    nonfinite[micro] = (~torch.isfinite(loss.detach())).float()
                    micro_batches.append((x, y))
                last = micro == self.accum - 1
                # Once per step, after the last backward is queued and before the optimizer
                # step: a NaN never reaches the weights, and the device has work while the host
                # waits on the flag (it used to sync on every micro-step's loss).
                if last and self.nan_check and self._any_nonfinite(nonfinite):
                    self.nan_module = self._locate_nan(nonfinite, micro_batches)
                    self._log(step + 1, {"train/loss": float("nan")})
                    return "diverged", step + 1, float("nan")
                if probing and last:
                    probed.update(tools.gradients())  # reduced, not yet clipped
                engine.step()
                loss_sum += loss.detach().float()
            done, window_steps = step + 1, window_steps + 1
            self.tick()
            if probing:
                self._log(done, {**probed, **tools.parameters(self.scan_batch)})
            if done % self.log_every == 0 or done == plan.total_steps:
                last_loss = self._mean_over_ranks(loss_sum) / (self.accum * window_steps)
                now = Clocks.now()
                spent = now - window_start
                elapsed = spent.wall
                tokens_per_s = plan.tokens_per_step * window_steps / elapsed
                self._log(
                    done,
                    {
                        "train/loss": last_loss,
                        "train/lr": engine.get_lr()[0],
                        "perf/step_time_s": elapsed / window_steps,
                        "perf/tokens_per_s": tokens_per_s,
                        "perf/data_wait_frac": data_wait / elapsed,
                        # Seconds as well as the share: a loaded machine slows the compute,
                        # not a loader's wait, so the share alone flips with machine load.
                        "perf/data_wait_s": data_wait / window_steps,
                        "perf/compute_s": (elapsed - data_wait) / window_steps,
                        # CPU seconds per step, of the process (all its threads) and of this
                        # loop's thread: they read alike on a busy and an idle machine.
                        "perf/process_cpu_s": spent.process / window_steps,
                        "perf/thread_cpu_s": spent.thread / window_steps,
                        **tools.loss(last_loss),
                        **tools.efficiency(tokens_per_s),
                    },
                )
                if not math.isfinite(last_loss):
                    return "diverged", done, last_loss
                loss_sum.zero_()
                data_wait, window_start, window_steps = 0.0, now, 0  # logging counts next time
            pause = Clocks.now()  # eval and checkpoints are not training time
            if plan.due(plan.eval_every_steps, done) and done < plan.total_steps:
                eval_loss = self.evaluate(done)
                if self.on_eval and self.on_eval(done * plan.tokens_per_step, eval_loss):
                    return "stopped", done, last_loss
            stop = signals.received is not None
            if self.dist.world > 1:
                stop = distributed.any_rank(stop, device)
            if stop:
                return "interrupted", done, last_loss
            if plan.due(plan.ckpt_every_steps, done):
                self.checkpoint(ckpt, done)
            window_start += Clocks.now() - pause
        return "completed", plan.total_steps, last_loss

    def _any_nonfinite(self, nonfinite: torch.Tensor) -> bool:
        """Whether a micro-step's loss was NaN/Inf on any rank (all must stop together): one
        all-reduce and one host sync per optimizer step."""
        return distributed.all_reduce_sum(nonfinite.sum().reshape(1)).item() > 0

    def _locate_nan(self, nonfinite: torch.Tensor, micro_batches: list) -> str | None:
        """Replay this rank's first micro-batch whose loss was NaN/Inf (the weights are still
        those it saw) and name the first module that produced one."""
        bad = [i for i, flag in enumerate(nonfinite.tolist()) if flag]
        x, y = micro_batches[bad[0] if bad else 0]
        return self.instruments.locate_nan(x, y)

    def checkpoint(self, ckpt: Checkpointer, step: int) -> None:
        """Metrics up to `step` are delivered before the checkpoint that lets a rerun skip them."""
        if self.tracker is not None:
            self.tracker.flush(wait=True)
        ckpt.save(self.engine, step)

    @torch.no_grad()
    def evaluate(self, step: int) -> float:
        """Token-weighted mean loss on the fixed held-out set, summed across ranks."""
        self.engine.eval()
        totals = torch.zeros(2, device=self.dist.device, dtype=torch.float64)
        for x, y in self.heldout:
            count = (y != -100).sum()
            loss = self.engine(x.to(self.dist.device), y.to(self.dist.device))
            totals += torch.stack([loss.double() * count, count.double()])
        self.engine.train()
        loss_sum, count = distributed.all_reduce_sum(totals).tolist()
        eval_loss = loss_sum / max(count, 1.0)
        self.last_eval = eval_loss
        self._log(step, {"eval/loss": eval_loss})
        if self.tracker is not None:
            tokens, total = step * self.plan.tokens_per_step, self.plan.total_steps
            console.print(f"step {step}/{total}  tokens {tokens}  eval loss {eval_loss:.4f}")
        return eval_loss

    def _mean_over_ranks(self, value: torch.Tensor) -> float:
        return distributed.all_reduce_sum(value.clone()).item() / self.dist.world

    def _log(self, step: int, metrics: dict[str, float]) -> None:
        if self.tracker is not None:
            self.tracker.log_metrics(metrics, step=step * self.plan.tokens_per_step)


@contextmanager
def _progress(show: bool, plan: Plan, start_step: int):
    """A rich progress bar over the steps when rank 0 writes to a terminal; else nothing."""
    if not (show and console.is_terminal):
        yield lambda: None
        return
    columns = (*Progress.get_default_columns(), TextColumn("{task.completed}/{task.total} steps"))
    with Progress(*columns, console=console, transient=True) as bar:
        task = bar.add_task("training", total=plan.total_steps, completed=start_step)
        yield lambda: bar.advance(task)


def _build(name: str, node: DictConfig):
    """Instantiate a `_target_` config; a constructor's ValueError, or a TypeError (an argument
    it does not take, a value of the wrong type), is the user's bad input."""
    try:
        return instantiate(node, _convert_="all")
    except Exception as error:
        refused = ValueError | TypeError | FileNotFoundError
        cause = error.__cause__ if isinstance(error.__cause__, refused) else error
        if isinstance(cause, refused):
            raise BadInput(f"{name}: {one_line(cause)}") from None
        raise


MAX_PARAMS = 10**13
"""Larger than any model this job can train (40 TB of fp32 weights): a config past it is a typo
or an attack, refused before the job builds anything."""


def preflight(cfg: DictConfig, build_data: bool = False) -> None:
    """What run() refuses before its first step, checked without training or recording: the
    values, the batch geometry, and the model (on the meta device: no memory), optimizer and
    schedule built by the job's own constructors. The controller runs it before a test takes
    its number, so bad input claims nothing. `build_data`: also open the data source (a test
    that changes data.*; the baseline's opened when it ran)."""
    validate(cfg)
    seq_len = None
    if build_data:
        seq_len = drawn_seq_len(_build("data.source", cfg.data.source), cfg.budget.data_seed)
    Plan.of(cfg, world=1, seq_len=seq_len)
    check_extra(cfg.ds)
    model_cfg = _probe_model(cfg.model)
    with torch.device("meta"):
        model = _build("model", model_cfg)
    try:
        build_optimizer(model, cfg.optim)
    except Exception as error:  # torch's own checks (lr, betas, eps), or an unknown argument
        cause = error.__cause__ or error
        raise BadInput(f"optim: {one_line(cause)}") from None
    _build("sched", cfg.sched)


def _probe_model(model: DictConfig) -> DictConfig:
    """The built-in GPT with its size checked and one block (every block takes the same
    arguments, and building thousands of them takes minutes even on the meta device); any
    other model as given."""
    from hyprun.diag.memory import count_params

    if not str(model.get("_target_", "")).endswith(".GPT"):
        return model
    try:
        params = count_params(OmegaConf.to_container(model, resolve=True))
    except (TypeError, ValueError, KeyError):
        return model  # a value count_params cannot read: the constructor names it
    if params > MAX_PARAMS:
        raise BadInput(
            f"the model would have {params:.3g} parameters (model.n_layer={model.n_layer}, "
            f"model.d_model={model.d_model}): beyond any device; check the values"
        )
    probe = model.copy()
    if isinstance(model.n_layer, int) and model.n_layer > 1:
        probe.n_layer = 1
    return probe


def _open_tracker(cfg: DictConfig, dist, previous_run: str | None, folder: Path) -> Tracker:
    """The job's MLflow run; what the server cannot take waits in `folder`/spool.jsonl."""
    t = cfg.tracking
    tracker = Tracker.open(
        t.uri,
        t.experiment,
        run_id=previous_run,
        run_name=t.run_name or _default_run_name(),
        parent_run_id=t.parent_run_id,
        tags={k: str(v) for k, v in (t.tags or {}).items()},
        flush_every_s=t.flush_every_s,
        spool=Path(folder) / "spool.jsonl",
        outage_grace_s=t.outage_grace_s,
    )
    if not tracker.resumed:
        tracker.log_params(flatten(OmegaConf.to_container(cfg, resolve=True)))
        tracker.log_text(OmegaConf.to_yaml(cfg, resolve=True), "config.yaml")
        tracker.set_tags(
            {
                **provenance.tags(dist.world, dist.device),
                "hyprun.config_hash": config_hash(cfg, exclude=("checkpoint", "tracking")),
                "hyprun.outcome": "running",
            }
        )
    if slurm := provenance.slurm_tags():
        tracker.set_tags(slurm)
    tracker.watch_system(t.system_metrics_every_s)
    return tracker


def _default_run_name() -> str:
    """The job's overrides, e.g. `optim.lr=3e-3 sched=cosine`, or `job` without any."""
    if HydraConfig.initialized():
        overrides = [o for o in HydraConfig.get().overrides.task if not o.startswith("hydra")]
        return " ".join(overrides) or "job"
    return "job"


def _summary(r: JobResult) -> str:
    def fmt(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.4f}"

    return (
        f"run {r.run_id}: {r.status} after {r.steps} steps ({r.tokens} tokens); "
        f"train loss {fmt(r.train_loss)}, eval loss {fmt(r.eval_loss)}"
    )


def task(cfg: DictConfig) -> float | None:
    """One job as a Hydra task. Undecorated and importable: a launcher that pickles the task
    function (hydra-submitit) pickles a reference to it, not this module's globals."""
    try:
        result = run(cfg)
    except (BadInput, TrackingOffline) as error:
        console.print(f"hyprun: {error}", markup=False)
        sys.exit(error.exit_code)
    if result.status == "interrupted":
        sys.exit(EXIT_INTERRUPTED)
    return result.eval_loss  # what a Hydra sweeper minimises


hydra_main = hydra.main(config_path="pkg://hyprun.conf", config_name="train", version_base="1.3")(
    task
)


HYDRA_FLAGS = ("-m", "--multirun", "--cfg", "-c", "--help", "-h", "--hydra-help", "--info", "-i")


def main() -> None:
    """Check a single run's overrides first, so bad input is one line and exit code 2."""
    # The deepspeed launcher appends --local_rank=N (also in LOCAL_RANK); Hydra would reject it.
    sys.argv = [a for a in sys.argv if not a.startswith("--local_rank")]
    args = sys.argv[1:]
    if not any(a in HYDRA_FLAGS or a.startswith("--") for a in args):
        try:
            cfg = compose(args)
            validate(cfg)
            source = _build("data.source", cfg.data.source)  # Hydra writes its folder first
            Plan.of(cfg, world=1, seq_len=drawn_seq_len(source, cfg.budget.data_seed))
            model_node(cfg.model)
        except BadInput as error:
            console.print(f"hyprun: {error}", markup=False)
            sys.exit(BadInput.exit_code)
    hydra_main()


if __name__ == "__main__":
    # The importable module's main, not __main__'s, so that `task` pickles by reference.
    from hyprun.runner.job.train import main as importable_main

    importable_main()
