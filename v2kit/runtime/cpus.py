"""How many CPUs this process may use: its affinity, bounded by a cgroup CPU quota (a container's
`limits.cpu`), which affinity alone does not show."""

from __future__ import annotations

import math
import os
from pathlib import Path

_CGROUP_V2 = Path("/sys/fs/cgroup/cpu.max")
_CGROUP_V1 = (Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"), Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us"))


def affinity_cpus() -> int:
    """CPUs this process may be scheduled on (every CPU off Linux); at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def usable_cpus() -> int:
    """CPUs this process may run on, at most its cgroup's quota rounded up; at least 1."""
    cpus = affinity_cpus()
    quota = cgroup_cpu_quota()
    return max(1, min(cpus, math.ceil(quota))) if quota is not None else cpus


def cgroup_cpu_quota(v2: Path = _CGROUP_V2, v1: tuple[Path, Path] = _CGROUP_V1) -> float | None:
    """The cgroup's CPU quota in CPUs (cpu.max `200000 100000` is 2.0); None when unlimited or unknown."""
    try:
        quota, _, period = v2.read_text().strip().partition(" ")
        return None if quota == "max" else int(quota) / int(period or 100000)
    except (OSError, ValueError):
        pass
    try:
        quota_us, period_us = (int(path.read_text()) for path in v1)
    except (OSError, ValueError):
        return None
    return None if quota_us <= 0 or period_us <= 0 else quota_us / period_us
