"""usable_cpus: affinity bounded by the cgroup CPU quota (a container's limits.cpu)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from v2kit.runtime import cpus


def _v1(tmp_path: Path, quota: str, period: str) -> tuple[Path, Path]:
    (tmp_path / "q").write_text(quota)
    (tmp_path / "p").write_text(period)
    return tmp_path / "q", tmp_path / "p"


@pytest.mark.parametrize(("text", "quota"), [("max 100000", None), ("200000 100000", 2.0), ("150000 100000", 1.5)])
def test_cgroup_v2_quota(tmp_path: Path, text: str, quota: float | None) -> None:
    (tmp_path / "cpu.max").write_text(text + "\n")
    assert cpus.cgroup_cpu_quota(tmp_path / "cpu.max", _v1(tmp_path, "-1", "100000")) == quota


def test_cgroup_v1_quota_when_v2_is_absent(tmp_path: Path) -> None:
    assert cpus.cgroup_cpu_quota(tmp_path / "none", _v1(tmp_path, "300000", "100000")) == 3.0
    assert cpus.cgroup_cpu_quota(tmp_path / "none", _v1(tmp_path, "-1", "100000")) is None
    assert cpus.cgroup_cpu_quota(tmp_path / "none", (tmp_path / "x", tmp_path / "y")) is None


def test_a_quota_below_the_affinity_bounds_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    monkeypatch.setattr(cpus, "cgroup_cpu_quota", lambda: 1.5)
    assert cpus.usable_cpus() == 2
    monkeypatch.setattr(cpus, "cgroup_cpu_quota", lambda: None)
    assert cpus.usable_cpus() == cpus.affinity_cpus() == 64
