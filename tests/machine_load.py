"""How busy the machine was with other work while a comparison ran: a comparison of two tools on a
shared 2-core machine that fails while other processes took much of the CPU is a statement about the
machine, and is skipped with its figures rather than failed."""

from __future__ import annotations

import contextlib
import time

import psutil

# Other processes taking more than this share of the CPUs during a comparison make its result
# a statement about the machine: such a run is skipped rather than failed.
BUSY_MACHINE_SHARE = 0.25


class OtherLoad:
    """The share of the machine's CPU time that went to processes outside this test's own process
    tree (pytest, its servers and the tools it runs) while the block ran: other jobs on a shared
    machine. Read `.share` after the block."""

    share = 0.0

    def __enter__(self) -> OtherLoad:
        self._start = (time.monotonic(), _machine_busy_s(), _tree_cpu_s())
        return self

    def __exit__(self, *exc: object) -> None:
        wall_s, busy_s, tree_s = (
            now - then for now, then in zip((time.monotonic(), _machine_busy_s(), _tree_cpu_s()), self._start)
        )
        self.share = max(0.0, busy_s - tree_s) / (wall_s * (psutil.cpu_count() or 1))


def _machine_busy_s() -> float:
    t = psutil.cpu_times()
    # guest time is already in user; steal is time the hypervisor gave to others.
    return float(sum(t) - t.idle - getattr(t, "iowait", 0.0) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0))


def _tree_cpu_s() -> float:
    """CPU of this process and of its descendants, live ones and those already waited for."""
    me = psutil.Process()
    total = sum(me.cpu_times()[:4])  # user, system, and children's that were waited for
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            total += sum(child.cpu_times()[:4])
    return float(total)
