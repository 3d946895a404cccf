"""A full /dev/shm: the server and perfkit run in a private mount namespace whose /dev/shm is a
1 MiB tmpfs, filled before they start (`unshare -m`; skipped where mounting is not permitted).

What must hold:

- perfkit's `--shared-memory system` sweep fails at once, exit 2, with an error that names
  /dev/shm, the bytes its regions need and the fix; nothing of it is left in /dev/shm, and it
  writes no results.
- The server keeps serving: a python model's stub needs no /dev/shm (its arenas are memfds); a
  front-end worker that cannot make a model's statistics file there says so in the core's log
  and leaves the model to the core (no file left, no crash); registering a region whose object
  the client could not create answers Triton's "Unable to open shared memory region" (400); and
  an output written into a region whose pages the client never allocated (ftruncate alone, as
  tritonclient's utilities make them) fails that request with a named error (500), where a store
  through the mapping would be SIGBUS, the end of the server.

The scenario runs as one child process in the namespace (SCENARIO below), which reports what it
saw as JSON; the test asserts on it. About 3 s.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_faults_under_load import _ECHO, _write_model

pytestmark = [pytest.mark.integration]

SHM_SIZE = "1m"
SCENARIO = r"""
import json, logging, os, subprocess, sys, time, urllib.error, urllib.request
from pathlib import Path

from reference_server.server import running_server
from tests.servers import loopback_config

repository, out = Path(sys.argv[1]), Path(sys.argv[2])
report = {}

# Fill /dev/shm.
with open("/dev/shm/filler", "wb") as filler:
    try:
        while True:
            filler.write(b"\0" * 65536)
            filler.flush()
    except OSError as exc:
        report["fill"] = exc.strerror
stats = os.statvfs("/dev/shm")
report["free"] = stats.f_bavail * stats.f_frsize

log_lines = []
class Keep(logging.Handler):
    def emit(self, record):
        log_lines.append(record.getMessage())
logging.getLogger().addHandler(Keep(level=logging.WARNING))


def call(method, url, body=None):
    request = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(), method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")


def infer(base, outputs=None):
    body = {"inputs": [{"name": "IN", "shape": [1, 4], "datatype": "INT32", "data": [1, 2, 3, 4]}]}
    if outputs:
        body["outputs"] = outputs
    return call("POST", f"{base}/v2/models/echo/infer", body)


with running_server(loopback_config(repository, frontend_workers=2)) as server:
    base = f"http://{server.http_url}"
    report["shm_during"] = sorted(os.listdir("/dev/shm"))
    started = time.monotonic()
    sweep = subprocess.run(
        [sys.executable, "-m", "perfkit", "sweep", "-u", server.http_url, "-m", "echo", "--shape", "IN:4",
         "--shared-memory", "system", "--concurrency-range", "1", "-p", "200", "-r", "3",
         "--report-dir", str(out), "-f", str(out / "perfkit.csv"), "--quiet", "--no-report"],
        capture_output=True, text=True, timeout=60,
    )
    report["sweep"] = {"rc": sweep.returncode, "stderr": sweep.stderr, "took_s": time.monotonic() - started}
    report["shm_after_sweep"] = sorted(os.listdir("/dev/shm"))
    report["infer"] = infer(base)[0]
    identity = {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
    report["infer_identity"] = call("POST", f"{base}/v2/models/identity/infer", identity)[0]
    report["register_missing"] = call(
        "POST", f"{base}/v2/systemsharedmemory/region/never_made/register",
        {"key": "/never_made", "offset": 0, "byte_size": 64},
    )
    # An output region whose object has a size but no pages: ftruncate succeeds in a full tmpfs.
    fd = os.open("/dev/shm/sparse_out", os.O_CREAT | os.O_RDWR, 0o600)
    os.ftruncate(fd, 65536)
    os.close(fd)
    report["register_sparse"] = call(
        "POST", f"{base}/v2/systemsharedmemory/region/sparse_out/register",
        {"key": "/sparse_out", "offset": 0, "byte_size": 65536},
    )[0]
    report["infer_into_sparse"] = infer(
        base, [{"name": "OUT", "parameters": {"shared_memory_region": "sparse_out", "shared_memory_byte_size": 16}}]
    )
    call("POST", f"{base}/v2/systemsharedmemory/region/sparse_out/unregister")
    os.unlink("/dev/shm/sparse_out")
    report["infer_after"] = infer(base)[0]

report["shm_after_server"] = sorted(os.listdir("/dev/shm"))
report["log"] = log_lines
print(json.dumps(report))
"""


def _namespace_refused() -> str:
    """Why this machine cannot run the scenario ("" when it can)."""
    probe = [
        "unshare",
        "-m",
        "--propagation",
        "private",
        "sh",
        "-c",
        f"mount -t tmpfs -o size={SHM_SIZE} tmpfs /dev/shm",
    ]
    try:
        done = subprocess.run(probe, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot run unshare: {exc}"
    return "" if done.returncode == 0 else f"unshare -m + mount tmpfs not permitted here: {done.stderr.strip()}"


def test_a_full_dev_shm_fails_perfkit_at_once_and_the_server_serves_on(demo_repository: Path, tmp_path: Path) -> None:
    refused = _namespace_refused()
    if refused:
        pytest.skip(refused)
    repository, out = tmp_path / "models", tmp_path / "out"
    _write_model(repository, "echo", _ECHO)  # python: its stub's arenas are memfds
    # onnxruntime with an instance a worker: the workers would run it themselves.
    shutil.copytree(demo_repository / "identity", repository / "identity")
    config = repository / "identity" / "config.pbtxt"
    config.write_text(config.read_text().replace("instance_group [ { count: 1 } ]", "instance_group [ { count: 2 } ]"))
    out.mkdir()
    command = (
        f"mount -t tmpfs -o size={SHM_SIZE} tmpfs /dev/shm && "
        f'exec "{sys.executable}" -c "$SCENARIO" "{repository}" "{out}"'
    )
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", command],
        capture_output=True, text=True, timeout=120, cwd=Path(__file__).parents[2],
        env={**os.environ, "SCENARIO": SCENARIO},
    )  # fmt: skip
    assert done.returncode == 0, f"the scenario died ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    report: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    print(json.dumps(report, indent=1)[:4000])
    assert report["fill"] == "No space left on device" and report["free"] == 0

    # (a) perfkit fails at once, says what it needed and the fix, leaves nothing and claims nothing.
    sweep = report["sweep"]
    assert sweep["rc"] == 2, sweep
    assert (
        "--shared-memory system: no room in /dev/shm (0 bytes free) for the run's 2 shared-memory regions"
        in (sweep["stderr"])
    ), sweep["stderr"]
    assert "bytes; free space there" in sweep["stderr"] and "--shm-size" in sweep["stderr"]
    assert sweep["took_s"] < 30
    assert report["shm_after_sweep"] == report["shm_during"]
    assert not list(out.iterdir()), "a failed run wrote results"

    # (b) The server serves on: the python stub needs no /dev/shm; the workers leave `identity` to the core.
    assert report["shm_during"] == ["filler"]  # no statistics file, no stub region
    assert report["infer"] == report["infer_identity"] == report["infer_after"] == 200
    refused_hosting = [line for line in report["log"] if "cannot run model 'identity' itself" in line]
    assert len(refused_hosting) == 2, report["log"]  # one line a worker, naming the file and the fix
    assert all(
        "cannot make the statistics file /dev/shm/" in line and "No space left" in line for line in refused_hosting
    )
    status, body = report["register_missing"]
    assert status == 400 and body["error"].startswith("Unable to open shared memory region: '/never_made'"), body
    assert report["register_sparse"] == 200
    status, body = report["infer_into_sparse"]
    assert status == 500 and "cannot write 16 bytes of output to key '/sparse_out': No space left" in body["error"]
    assert report["shm_after_server"] == ["filler"]
