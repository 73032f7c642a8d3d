"""Process-group setup for 1 process, torchrun, the deepspeed launcher and srun; CPU or GPU.

Everything distributed that the job needs goes through here, so the training loop reads as if it
ran in one process.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True)
class Dist:
    rank: int
    world: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


RENDEZVOUS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def forget_submitter() -> None:
    """Drop the rendezvous a Slurm task inherited from the process that submitted it.

    sbatch exports the submitter's environment; a submitter that ran a job in-process holds its
    MASTER_PORT open, and the task would fail to listen on it (EADDRINUSE)."""
    for key in RENDEZVOUS:
        os.environ.pop(key, None)


def extensions_dir() -> Path:
    """Where DeepSpeed's compiled extensions are cached: one folder per Python environment, so
    a checkout with another venv never rebuilds a library a job of this one has loaded."""
    digest = hashlib.sha1(sys.prefix.encode()).hexdigest()[:10]
    return Path.home() / ".cache" / "hyprun" / "torch_extensions" / digest


def load_comm_extension() -> None:
    """Build (first time, ~40 s on a CPU) or load DeepSpeed's shared-memory comm extension under
    an flock, before DeepSpeed asks for it, in the folder TORCH_EXTENSIONS_DIR names.

    torch guards a build with a plain lock file that every loader takes, even to find the build
    up to date; a process killed while holding it leaves it behind and every later job waits on
    it forever. The kernel drops an flock with its holder, so a lock file found under ours is one
    such leftover. DeepSpeed keeps the loaded module, so its own load during init takes no lock."""
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is None or not deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
        return  # this accelerator has no such extension
    folder = Path(os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(extensions_dir())))
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "hyprun.flock", "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)  # released when the file closes or this process dies
        for leftover in folder.glob("*/lock"):
            leftover.unlink(missing_ok=True)
        builder.load(verbose=False)


def prepare_env() -> None:
    """Set the variables DeepSpeed reads at import and init. Must run before `import deepspeed`."""
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    # DeepSpeed compiles a communication extension on first use (~40 s on a CPU): keep it cached.
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(extensions_dir()))
    if "RANK" not in os.environ and "SLURM_PROCID" in os.environ and "SLURM_NTASKS" in os.environ:
        # srun starts one task per process: translate Slurm's names into torch's.
        os.environ["RANK"] = os.environ["SLURM_PROCID"]
        os.environ["WORLD_SIZE"] = os.environ["SLURM_NTASKS"]
        os.environ["LOCAL_RANK"] = os.environ.get("SLURM_LOCALID", "0")
        # Rank 0 listens on the allocation's first node, on a port of this job's own: jobs
        # sharing a node must not collide, and every task derives the same one. Set, not
        # defaulted: sbatch exports the submitter's environment, MASTER_PORT included.
        os.environ["MASTER_ADDR"] = _first_node(os.environ.get("SLURM_JOB_NODELIST"))
        os.environ["MASTER_PORT"] = str(20000 + int(os.environ["SLURM_JOB_ID"]) % 20000)
    if os.environ.get("WORLD_SIZE") == "1" and "MASTER_PORT" not in os.environ:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    if "RANK" not in os.environ:
        # A plain `python -m hyprun.runner.job.train`: a world of one (else DeepSpeed looks for
        # MPI), on a
        # port of its own (an inherited MASTER_PORT may belong to another job).
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
        os.environ["MASTER_PORT"] = str(_free_port())
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")


def init() -> Dist:
    """Initialise (once per process) the process group and return this process's place in it."""
    prepare_env()
    import deepspeed

    cuda = torch.cuda.is_available()
    if not torch.distributed.is_initialized():
        load_comm_extension()
        deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo", verbose=False)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    return Dist(
        torch.distributed.get_rank(), torch.distributed.get_world_size(), local_rank, device
    )


def all_reduce_sum(values: torch.Tensor) -> torch.Tensor:
    if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        torch.distributed.all_reduce(values, op=torch.distributed.ReduceOp.SUM)
    return values


def any_rank(flag: bool, device: torch.device) -> bool:
    """True on every rank when `flag` is true on any rank (a signal reached only some of them)."""
    return bool(all_reduce_sum(torch.tensor([float(flag)], device=device)).item() > 0)


def barrier() -> None:
    if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        torch.distributed.barrier()


def _first_node(nodelist: str | None) -> str:
    """The first host of a Slurm node list (`gpu[01-04]` -> `gpu01`), as Slurm expands it."""
    if not nodelist:
        return "127.0.0.1"
    if not any(mark in nodelist for mark in "[,"):
        return nodelist  # one plain host name: nothing to expand
    import subprocess

    out = subprocess.run(
        ["scontrol", "show", "hostnames", nodelist],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return out.stdout.split()[0] if out.returncode == 0 and out.stdout.split() else "127.0.0.1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
