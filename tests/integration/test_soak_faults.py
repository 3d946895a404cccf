"""bench/soak.py with its faults, briefly: one round of the faults a one-process server can take
quickly (kill -9 and SIGSTOP of the echo model's stub, an unload and load under load), then the
core killed under load. Nothing lost, duplicated, mismatched or hung; each fault's failures are of
named kinds and counted against it; each fault recovered; nothing left behind. About 4 s.

(The kill of a front-end worker needs a worker that has lived some seconds: the 10-minute run in
bench/README.md throws it.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration]

SOAK = Path(__file__).resolve().parents[2] / "bench" / "soak.py"
QUICK_KINDS = ("stub-kill", "stub-stall", "unload")


def test_a_short_soak_with_every_quick_fault_loses_nothing(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    command = [
        sys.executable, str(SOAK), "--duration", "1", "--concurrency", "8", "--reload-every", "100",
        "--fault-every", "0.3", "--stub-timeout", "0.3", "--fault-kinds", ",".join(QUICK_KINDS),
        "--kill-core-at-end", "--seed", "7", "--max-growth-mb", "10000", "--json", str(out),
    ]  # fmt: skip
    run = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, f"soak exited {run.returncode}:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    assert "seed 7" in run.stdout  # printed, so that a run can be thrown again
    figures = json.loads(out.read_text())
    assert figures["verdict"] == "PASS"
    assert figures["sent"] > 0 and figures["answered"] > 0
    for total in ("lost", "duplicated", "mismatched", "hung"):
        assert figures[total] == 0, (total, figures)
    assert figures["unexplained_errors"] == {}
    faults = figures["faults"]
    assert set(faults) == {*QUICK_KINDS, "core-kill"}, faults
    for kind in QUICK_KINDS:
        assert faults[kind]["thrown"] >= 1 and faults[kind]["recovered"] == faults[kind]["thrown"], faults[kind]
        assert faults[kind]["server_failures"] == [], faults[kind]
    # The stalled stub's batch fails with the server's words, and the unload's requests as unknown model.
    assert any("execute() did" in kind for kind in faults["stub-stall"]["failed_by_kind"]), faults["stub-stall"]
    # (How many requests meet the model unloaded depends on how long the unload takes: maybe none.)
    assert all("unknown model" in kind or "NOT_FOUND" in kind for kind in faults["unload"]["failed_by_kind"])
    # Every error is one of the faults' (none unexplained), each counted once.
    assert sum(f["requests_failed"] for f in faults.values()) == sum(figures["errors"].values())
    assert figures["sent"] == figures["answered"] + sum(figures["errors"].values())
    assert faults["core-kill"]["thrown"] == 1 and figures["outlived_core"] == []
    assert figures["left_behind"] == {"processes": [], "shm_files": []}
