"""perfkit reads a reference server's startup lines until its last one, ready or not: a server that
starts not ready (a model failed to load) says "Server not ready" and never "Server ready" until the
model serves, and perfkit must not wait out its start timeout for it."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from perfkit.target import _wait_for_listeners

#: What the server prints when a model failed to load; the process then keeps serving.
NOT_READY = (
    "print('Started HTTPService at 127.0.0.1:8123', flush=True); "
    "print(\"Server not ready: 'broken'\", flush=True); "
    "import time; time.sleep(60)"
)


def test_a_server_not_ready_ends_the_startup_lines(tmp_path: Path) -> None:
    process = subprocess.Popen([sys.executable, "-c", NOT_READY], stdout=subprocess.PIPE, text=True)
    try:
        started = time.monotonic()
        ports = _wait_for_listeners(process, tmp_path / "server.log", timeout_s=30)
        assert ports == {"HTTPService": 8123}
        assert time.monotonic() - started < 20  # the last line, not the timeout, ended the wait
    finally:
        process.kill()
        process.wait()
        assert process.stdout is not None
        process.stdout.close()
