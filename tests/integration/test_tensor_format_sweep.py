"""`perfkit sweep` and `perfkit probe` against a stub with MLServer 1.7.1's HTTP manners: GET /v2 lists
no extension, and a binary-tensor request gets HTTP 500 with a Python traceback for its body. By
default perfkit sends it JSON tensors and asks for JSON outputs, and says so; with binary tensors
forced, every request fails and the run ends with the server's own words and the flag that helps.
(The real MLServer: tests/integration/test_oip_servers.py, with PERFKIT_PEERS.)"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from perfkit.cli import main
from perfkit.errors import ExitCode
from perfkit.results.model import read_sweep

pytestmark = [pytest.mark.integration]

TRACEBACK = """Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/fastapi/encoders.py", line 59, in <lambda>
    bytes: lambda o: o.decode(),
UnicodeDecodeError: 'utf-8' codec can't decode byte 0x80 in position 102: invalid start byte"""
WORDS = "UnicodeDecodeError: 'utf-8' codec can't decode byte 0x80 in position 102: invalid start byte"
METADATA = {"name": "addone", "platform": "", "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16]}],
            "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 16]}]}  # fmt: skip
# Served here so that the test needs nothing but the tensor format: MLServer itself has no config route.
CONFIG = {
    "name": "addone",
    "max_batch_size": 0,
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [1, 16]}],
}
# Short windows, at most three: a level ends in about half a second, measured, valid or not.
WINDOWS = ["-m", "addone", "--concurrency-range", "1", "-p", "150", "-r", "3", "-s", "1000", "--no-report"]


def _app(seen: list[tuple[str, bool]]) -> web.Application:
    """The stub; `seen` gets each inference's (content type, whether it asked for binary outputs)."""

    async def infer(request: web.Request) -> web.Response:
        body = await request.read()
        if request.content_type != "application/json":
            seen.append((request.content_type, True))
            return web.Response(status=500, text=TRACEBACK)
        doc = json.loads(body)
        asked = any("binary_data" in (o.get("parameters") or {}) for o in doc.get("outputs") or ())
        seen.append((request.content_type, asked or "binary_data_output" in (doc.get("parameters") or {})))
        data = [x + 1 for x in doc["inputs"][0]["data"]]
        out = {"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 16], "data": data}
        return web.json_response({"model_name": "addone", "id": "1", "parameters": {}, "outputs": [out]})

    def answer(doc: Any) -> Any:
        async def handler(request: web.Request) -> web.Response:
            return web.json_response(doc)

        return handler

    app = web.Application()
    app.router.add_get("/v2/health/live", answer({}))
    app.router.add_get("/v2/health/ready", answer({}))
    app.router.add_get("/v2", answer({"name": "mlserver", "version": "1.7.1", "extensions": []}))
    app.router.add_post("/v2/repository/index", answer([{"name": "addone", "state": "READY"}]))
    app.router.add_get("/v2/models/addone", answer(METADATA))
    app.router.add_get("/v2/models/addone/ready", answer({}))
    app.router.add_get("/v2/models/addone/config", answer(CONFIG))
    app.router.add_post("/v2/models/addone/infer", infer)
    return app


@contextmanager
def stub_mlserver() -> Iterator[tuple[str, list[tuple[str, bool]]]]:
    """The stub on a loop of its own thread (perfkit's commands run their own loop)."""
    seen: list[tuple[str, bool]] = []
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(_app(seen))

    async def start() -> str:
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return f"127.0.0.1:{runner.addresses[0][1]}"

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    url = asyncio.run_coroutine_threadsafe(start(), loop).result(10)
    try:
        yield url, seen
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def test_a_sweep_sends_json_tensors_to_a_server_without_binary_tensor_data(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with stub_mlserver() as (url, seen):
        code = main(["sweep", "-u", url, *WINDOWS, "--report-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code in (ExitCode.OK, ExitCode.UNSTABLE), err  # 3: a window too short to be valid on a busy machine
    note = f"mlserver 1.7.1 at {url} does not list the binary_tensor_data extension: JSON tensors"
    assert err.count(note) == 1 and "(--input-tensor-format binary to force)" in err
    assert seen and set(seen) == {("application/json", False)}  # JSON in, JSON out asked for
    (result_file,) = tmp_path.glob("sweep-*.json")
    assert read_sweep(result_file).levels[0].error_count == 0


def test_binary_tensors_forced_end_the_run_with_the_servers_words_and_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with stub_mlserver() as (url, seen):
        code = main(["sweep", "-u", url, *WINDOWS, "--input-tensor-format", "binary", "--report-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == ExitCode.ERRORS
    assert seen and all(content_type == "application/octet-stream" for content_type, _ in seen)
    line = (f"requests failed: HTTP 500: {WORDS}; perfkit sent binary tensors (the binary_tensor_data extension), "
            "which the server may not read: try --input-tensor-format json")  # fmt: skip
    assert err.count(line) == 2, err  # once when it came, once at the end
    assert err.rstrip().endswith(f"error: {line}")
    assert "JSON outputs (--output-tensor-format binary to force)" in err  # the outputs were not chosen


def test_probe_chooses_the_format_the_same_way_and_takes_the_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with stub_mlserver() as (url, seen):
        assert main(["probe", "-u", url, "-n", "3"]) == ExitCode.OK
        out = "\n".join(capsys.readouterr())
        assert "does not list the binary_tensor_data extension: JSON tensors" in out
        assert seen == [("application/json", False)] * 3
        seen.clear()
        assert main(["probe", "-u", url, "-n", "2", "--input-tensor-format", "binary"]) == ExitCode.FAILED
        out = "\n".join(capsys.readouterr())
        assert f"error: HTTP 500: {WORDS}; perfkit sent binary tensors" in out and "--input-tensor-format json" in out
        assert [content_type for content_type, _ in seen] == ["application/octet-stream"] * 2
