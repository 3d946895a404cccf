"""The server's compiled request path (v2kit/compiled.py, docs/compiled.md): the listed modules keep
to what mypyc compiles (no async generators, no runtime-checkable protocols), and what compiling
changed behaves as the interpreted code did. These run the same compiled or interpreted; the
import of the stub's root fails compiled without its fix."""

from __future__ import annotations

import ast
import asyncio
import inspect
import runpy
from pathlib import Path

import pytest

from reference_server.backends.python import environment
from reference_server.frontends.http import messages
from reference_server.scheduling.scheduler import _OneAnswer
from v2kit import compiled

ROOT = Path(__file__).resolve().parents[2]
SERVER_MODULES = [name for name in compiled.COMPILED_MODULES if not name.startswith("perfkit.")]


def _source(name: str) -> ast.Module:
    return ast.parse(ROOT.joinpath(*name.split(".")).with_suffix(".py").read_text())


def test_the_server_request_path_is_in_the_compiled_group() -> None:
    for name in ("reference_server.frontends.http.connection", "reference_server.core.dataplane",
                 "reference_server.scheduling.scheduler", "reference_server.backends.python.process",
                 "v2kit.h2.receive"):  # fmt: skip
        assert name in compiled.COMPILED_MODULES
    assert runpy.run_path(str(ROOT / "v2kit" / "compiled.py"))["COMPILED_MODULES"] == compiled.COMPILED_MODULES


@pytest.mark.parametrize("name", SERVER_MODULES)
def test_a_listed_module_has_no_async_generator_nor_runtime_checkable_protocol(name: str) -> None:
    # mypyc refuses the first ("async generators are unimplemented") and breaks the second at import.
    for node in ast.walk(_source(name)):
        if isinstance(node, ast.AsyncFunctionDef):
            inner = [n for n in ast.walk(node) if isinstance(n, ast.Yield | ast.YieldFrom)]
            assert not inner, f"{name}: async generator {node.name} (move it to an interpreted module)"
        if isinstance(node, ast.ClassDef):
            names = [ast.unparse(d) for d in node.decorator_list]
            assert "runtime_checkable" not in names, f"{name}: runtime-checkable protocol {node.name}"


def test_the_stub_is_started_from_the_folder_that_holds_it() -> None:
    # environment.py stays interpreted: compiled, a module's __file__ names the group's shared
    # library in v2kit/, not itself.
    assert environment.__name__ not in compiled.COMPILED_MODULES
    assert (Path(environment.REPO_ROOT) / "reference_server" / "backends" / "python" / "stub.py").is_file()


def test_a_model_that_is_not_decoupled_answers_once() -> None:
    async def answer() -> dict[str, object]:
        return {"OUT": 1}

    async def main() -> list[tuple[object, bool]]:
        return [item async for item in _OneAnswer(answer())]  # type: ignore[arg-type]

    assert asyncio.run(main()) == [({"OUT": 1}, True)]


def test_an_answer_closed_before_its_step_is_never_left_unawaited() -> None:
    async def answer() -> dict[str, object]:
        return {}

    pending = answer()
    asyncio.run(_OneAnswer(pending).aclose())  # type: ignore[arg-type]
    assert inspect.getcoroutinestate(pending) == inspect.CORO_CLOSED


def test_a_handler_answers_through_its_respond_or_in_a_task() -> None:
    class Responding:
        def respond(self, request: messages.HttpRequest, reply: messages.Reply) -> None: ...

    responder = Responding()
    assert messages.reply_through(responder) == responder.respond

    async def handler(request: messages.HttpRequest) -> messages.HttpResponse:
        raise AssertionError("not called here")

    served = messages.reply_through(handler)
    assert served.func is messages.in_task and served.args == (handler,)  # type: ignore[attr-defined]
