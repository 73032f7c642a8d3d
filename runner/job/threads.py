"""How many torch threads a job runs: sized from the CPU share this process actually has.

torch starts one intra-op thread per core it sees, whatever share of them the process may use:
a container's CPU quota, Slurm's cpus-per-task without a cpuset, or several ranks on one node.
Past its share, a thread waits at every parallel region's barrier while the scheduler runs
someone else (issue 25: the demo ran 24x slower on 2 cores at load ~11, 3.1k vs 75k tokens/s).

The share is the smallest of
- the CPUs the process may run on (`os.sched_getaffinity`: taskset, Slurm's and cgroup cpusets),
- the cgroup's CPU quota (v2 `cpu.max`, v1 `cpu.cfs_quota_us / cpu.cfs_period_us`), rounded down,
divided by the job's processes on this node (LOCAL_WORLD_SIZE, set by torchrun and DeepSpeed's
launcher, else SLURM_NTASKS_PER_NODE), then capped by SLURM_CPUS_PER_TASK (already per task).

Who decides, first match wins: the job config's `threads` (a whole number), OMP_NUM_THREADS when
the environment sets it, the share. The machine's load is not read: it changes by the second
(and lags by a minute in /proc/loadavg, where a seed's own threads would shrink the next seed's
count), so a baseline's seeds and its tests would run at counts no config explains. On a shared
machine whose share is all its cores, set `threads=1` or OMP_NUM_THREADS=1 (bench/threads.py).

Whatever our own job gets, a user's app gets: the app launcher applies the same count in its
process and hands it to an app's subprocess as OMP_NUM_THREADS and MKL_NUM_THREADS.

How the threads wait matters as much as how many there are: runner/__init__.py sets
OMP_WAIT_POLICY=PASSIVE unless the user set it (bench/threads.py, 2 cores: beside a CPU-hungry job
2.2x the tokens/s of torch's defaults on an otherwise idle machine, 19-24x under more load; alone
on an idle machine 0.62x of them).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from hyprun.runner.errors import BadInput

CGROUP_ROOT = Path("/sys/fs/cgroup")
V1_CPU_FOLDERS = ("cpu", "cpu,cpuacct", "cpuacct,cpu")


@dataclass(frozen=True)
class Choice:
    """A thread count and where it came from, as recorded on the run."""

    count: int
    source: str


def affinity_cpus() -> int:
    """CPUs this process may run on (all of them where the platform cannot say)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # macOS has no sched_getaffinity
        return os.cpu_count() or 1


def cgroup_quota(root: Path = CGROUP_ROOT, membership: str | None = None) -> float | None:
    """CPUs' worth of time the process's cgroup (or an ancestor) may use, or None (no quota).

    `membership`: the text of /proc/self/cgroup (read when not given)."""
    if membership is None:
        try:
            membership = Path("/proc/self/cgroup").read_text()
        except OSError:
            membership = ""
    quotas = [q for folder in _cgroup_folders(root, membership) if (q := _quota(folder))]
    return min(quotas) if quotas else None


def _cgroup_folders(root: Path, membership: str) -> Iterator[Path]:
    """The process's cgroup folders and their ancestors, v2 and v1 alike."""
    for line in membership.splitlines():
        _, controllers, path = line.split(":", 2)
        relative = Path(path.lstrip("/"))
        if controllers == "":  # v2: one unified hierarchy
            bases = [root]
        elif "cpu" in controllers.split(","):
            bases = [root / name for name in V1_CPU_FOLDERS]
        else:
            continue
        for base in bases:
            # Inside a container the hierarchy is often mounted at its own cgroup: root too.
            yield from (base / part for part in (relative, *relative.parents))


def _quota(folder: Path) -> float | None:
    try:
        if (v2 := folder / "cpu.max").is_file():
            quota, period = v2.read_text().split()[:2]
            return None if quota == "max" else int(quota) / int(period)
        if (v1 := folder / "cpu.cfs_quota_us").is_file():
            quota = int(v1.read_text())
            period = int((folder / "cpu.cfs_period_us").read_text())
            return None if quota <= 0 else quota / period
    except (OSError, ValueError, ZeroDivisionError):
        return None
    return None


def local_processes(env: Mapping[str, str]) -> int:
    """Processes of this job on this node: the launcher's count, else Slurm's, else one."""
    for key in ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"):
        if (value := _whole(env.get(key))) is not None:
            return value
    return 1


def cpu_share(env: Mapping[str, str] | None = None, root: Path = CGROUP_ROOT) -> Choice:
    """Threads this process's share of the CPUs affords (see the module's docstring)."""
    env = os.environ if env is None else env
    affinity, quota = affinity_cpus(), cgroup_quota(root)
    node = min(affinity, max(1, math.floor(quota))) if quota else affinity
    processes = local_processes(env)
    count = max(1, node // processes)
    parts = [f"affinity {affinity}", f"cgroup quota {quota:g}" if quota else "no cgroup quota"]
    if processes > 1:
        parts.append(f"/ {processes} processes on the node")
    if (per_task := _whole(env.get("SLURM_CPUS_PER_TASK"))) is not None:
        count = min(count, per_task)
        parts.append(f"SLURM_CPUS_PER_TASK {per_task}")
    return Choice(count, "cpu share: " + ", ".join(parts))


def choose(configured: object = None, env: Mapping[str, str] | None = None) -> Choice:
    """The count a job runs with: the config's, OMP_NUM_THREADS, or the CPU share."""
    env = os.environ if env is None else env
    if configured is not None:
        if isinstance(configured, bool) or not isinstance(configured, int) or configured < 1:
            raise BadInput(
                f"threads={configured!r} must be a positive whole number, or null to size it "
                "from the CPU share"
            )
        return Choice(configured, "config threads")
    if (given := _whole(env.get("OMP_NUM_THREADS"))) is not None:
        return Choice(given, "OMP_NUM_THREADS")
    return cpu_share(env)


def environment(count: int) -> dict[str, str]:
    """What a child process needs to start with `count` threads (torch reads OMP_NUM_THREADS,
    numpy's BLAS MKL_NUM_THREADS), less what the environment already sets: the user's wins."""
    keys = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
    return {key: str(count) for key in keys if key not in os.environ}


@contextmanager
def limited(count: int) -> Iterator[None]:
    """torch's intra-op threads set to `count`, put back afterwards (in-process jobs share the
    caller's torch); inter-op threads too where torch still allows it (before its first use)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(count)
    # Settable once per process, before any inter-op work: a later job keeps the first's.
    with suppress(RuntimeError):
        torch.set_num_interop_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _whole(value: str | None) -> int | None:
    """A positive whole number from an environment value, else None (unset, empty, garbage)."""
    try:
        number = int(str(value).strip())
    except ValueError:
        return None
    return number if number >= 1 else None
