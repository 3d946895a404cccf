"""The stub: the child process that runs one instance of a python-backend model.

`python -m reference_server.backends.python.stub FD SERVER_ARENA_FD STUB_ARENA_FD ARENA_BYTES` (the
server starts it through a lighter bootstrap, `environment._BOOTSTRAP`, that calls `run`), which is
told what to load over the control channel (see `ipc`). The main thread runs the model (load,
`auto_complete_config`, `initialize`, `execute`, `finalize`) one call at a time, as Triton's stub
does; a decoupled model's `async def execute` is the exception, run on a background asyncio loop
(`_run_in_background`, as Triton's stub runs it) while execute answers at once, so that one
instance's coroutines await together. There is no reader thread: a thread that waits reads
(`Stub.pump`), so the idle main thread receives its next execute itself, and a thread waiting for
a BLS answer reads until it comes (frees and other threads' answers are routed on the way).
Decoupled responses may be sent from any thread, during execute or after it returned.

When the control channel reaches EOF (the server exited, even by SIGKILL) the stub exits; during
an execute, when no one reads, a watchdog thread sees the server gone within a second: no stub
outlives its server.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import importlib.util
import inspect
import itertools
import json
import os
import queue
import signal
import socket
import sys
import threading
import time
import traceback
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reference_server.backends.python import ipc
from reference_server.backends.python.pb import triton_python_backend_utils as pb_utils
from reference_server.backends.python.pb.release import release_flags
from reference_server.backends.python.stub_calls import BLS_OWNERS, StubCalls

#: The files between a model's `pb_utils.Logger` call and `Stub.log`.
_LOGGER_FILES = frozenset((pb_utils.__file__, __file__))

# Model files import it by Triton's name; it must be this very module, which holds `_runtime`.
sys.modules.setdefault("triton_python_backend_utils", pb_utils)

#: The most execute answers that go in one message.
_MAX_ANSWERS = 16
_EXECUTE_RESULT_HINT = "execute() must return a list with one pb_utils.InferenceResponse per request"


class BackendError(Exception):
    """A check of the stub's own on what a model did: Triton's stub makes these in C++, so they read
    as their message alone, with no Python type name."""


def format_exception(exc: BaseException) -> str:
    """`Type: message` then the model's frames, as Triton's stub reports a Python error (pybind11's
    words): from where it was raised out through the callers, innermost first, up to this stub. A
    finished coroutine's frame has no caller, so an `async def execute` shows the frames below it."""
    if isinstance(exc, BackendError):
        return str(exc)
    own = os.path.dirname(__file__)
    return _with_frames(exc, lambda frame: frame.f_code.co_filename.startswith(own))


def format_import_error(exc: BaseException, importer: types.FrameType) -> str:
    """What a model file raised when `importer` imported it, as Triton's stub reports it (pybind11's
    words): the frames from where it was raised out to `importer`, importlib's included."""
    return _with_frames(exc, lambda frame: frame is importer)


def _with_frames(exc: BaseException, outside: Callable[[types.FrameType], bool]) -> str:
    """`Type: message`, then pybind11's walk: from the innermost frame of the traceback out through
    each frame's caller, up to the first frame `outside` the model."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    lines: list[str] = []
    frame, lineno = (tb.tb_frame, tb.tb_lineno) if tb is not None else (None, 0)
    while frame is not None and not outside(frame):
        lines.append(f"  {frame.f_code.co_filename}({lineno}): {frame.f_code.co_name}\n")
        frame = frame.f_back
        lineno = frame.f_lineno if frame is not None else 0
    return f"{type(exc).__name__}: {exc}" + ("\n\nAt:\n" + "".join(lines) if lines else "")


class Stub(StubCalls):
    """The model and the bridge `pb_utils._runtime` that its utilities call (BLS and service calls
    in `StubCalls`)."""

    def __init__(self, channel: ipc.Channel, server_arena: ipc.Arena, stub_arena: ipc.Arena) -> None:
        self.channel = channel
        self.server_arena = server_arena  # the server writes, we read
        self.arena = stub_arena  # we write, the server reads and frees
        self.work: collections.deque[tuple[dict[str, Any], list[int]]] = collections.deque()
        # Whoever waits for something reads the channel while no one else does (see `pump`).
        self._turn = threading.Condition()
        self._reading = False
        self.model: Any = None
        self.model_class: Any = None
        self.decoupled = False
        self.instance_name = ""
        self.loop = asyncio.new_event_loop()
        # A decoupled model's `async def execute` runs here, on a thread of its own, as Triton's
        # stub does: execute answers at once and the coroutines of many batches await together.
        self._background: asyncio.AbstractEventLoop | None = None
        self._running_coroutines: set[concurrent.futures.Future[Any]] = set()
        # Tokens of decoupled senders dropped before their final flag (pb.response_sender).
        self._dropped: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._bls_ids = itertools.count(1)
        self._bls: dict[int, Any] = {}
        self._bls_lock = threading.Lock()
        self._main_thread = threading.get_ident()
        self._executing: Any = ()  # the requests of the execute running on the main thread (message tuples)
        self._answers: list[dict[str, Any]] = []  # executes answered, not sent yet (see _execute)
        # Tokens of requests whose client went away (the server's `cancel`), until their final response.
        self.cancelled: set[int] = set()
        # A non-decoupled model's requests left open by execute (`_leave_open`), until their final
        # flag; what their senders send waits for the answer that left them open to go out.
        self._left_open: set[int] = set()
        self._deferring = threading.Lock()
        # BLS runs once `initialize` has returned and until `finalize` starts, as in Triton's stub.
        self.bls_allowed = False
        self._calls: dict[int, collections.deque[dict[str, Any]]] = {}  # service calls unanswered

    # --- reading: by whichever thread waits ------------------------------------------------------

    def pump(self, ready: Callable[[], bool]) -> None:
        """Return once `ready()` holds, reading and routing messages meanwhile whenever no other
        thread is reading. The model's thread, idle, reads its next execute itself: no hand-off
        from a reader thread per batch. A thread waiting for a BLS answer reads too, so one is
        there to read whenever someone waits."""
        turn = self._turn
        while True:
            with turn:
                while not ready() and self._reading:
                    turn.wait()
                if ready():
                    return
                self._reading = True
            try:
                message, fds = self.channel.recv()
                self._route(message, fds)
            except ipc.ChannelClosed:
                os._exit(0)  # the server is gone: never outlive it
            except BaseException:
                traceback.print_exc()  # a broken protocol: stop, the server restarts us
                os._exit(1)
            finally:
                with turn:
                    self._reading = False
                    turn.notify_all()

    def poll(self) -> None:
        """Route whatever has come, without waiting; nothing when another thread is reading (it
        routes them). For `is_cancelled` during a long execute, when no thread reads."""
        turn = self._turn
        with turn:
            if self._reading:
                return
            self._reading = True
        try:
            while True:
                try:
                    message, fds = self.channel.recv(wait=False)
                except BlockingIOError:
                    return
                self._route(message, fds)
        except ipc.ChannelClosed:
            os._exit(0)
        finally:
            with turn:
                self._reading = False
                turn.notify_all()

    def _route(self, message: dict[str, Any], fds: list[int]) -> None:
        op = message["op"]
        for offset, nbytes in message.get("free", ()):
            self.arena.release(offset, nbytes)  # given back with an execute
        if op == "free":
            for offset, nbytes in message["blocks"]:
                self.arena.release(offset, nbytes)
        elif op == "cancel":
            self.cancelled.add(message["token"])
        elif op == "bls_result":
            self._bls_result(message, fds)
        elif op == "execute_many":  # executes the server handed out in one pass of its loop
            for execute in message["executes"]:
                self._route(execute, [])
        elif op == "service_result":
            with self._bls_lock:
                self._calls.pop(message["id"]).append(message)
        else:
            self.work.append((message, fds))

    # --- the main thread ----------------------------------------------------------------------

    def serve(self) -> None:
        work = self.work
        while True:
            self.pump(lambda: bool(work))
            message, fds = work.popleft()
            op = message["op"]
            if op != "execute":
                self._flush()
            if op == "load":
                self.channel.send({"op": "loaded", **self._load(message)})
            elif op == "initialize":
                self.channel.send({"op": "initialized", "error": self._initialize(message["args"])})
            elif op == "execute":
                self._execute(message, fds)
            elif op == "finalize":
                error = None
                self.bls_allowed = False
                if self.model is not None and hasattr(self.model, "finalize"):
                    try:
                        self.model.finalize()
                    except Exception as exc:
                        error = format_exception(exc)
                self.channel.send({"op": "finalized", "error": error})
                return

    def _load(self, message: dict[str, Any]) -> dict[str, Any]:
        path = Path(message["model_file"])
        # Triton puts the version folder on sys.path, so model.py may import its neighbours, and the
        # model folder, from which it imports the file as `<version>.model`.
        sys.path[:0] = [str(path.parent), str(path.parent.parent)]
        try:
            if path.suffix == ".py":
                # Imported by name, as Triton's stub imports it: its errors then show the same
                # importlib frames, and the module has the same name.
                name = f"{path.parent.name}.{path.stem}" if path.parent.name.isdigit() else path.stem
                sys.modules.pop(name, None)
                __import__(name)
                module = sys.modules[name]
            else:
                spec = importlib.util.spec_from_file_location("model", path)
                if spec is None or spec.loader is None:
                    return {"error": f"cannot import {path}", "config": None}
                module = importlib.util.module_from_spec(spec)
                sys.modules["model"] = module
                spec.loader.exec_module(module)
        except BaseException as exc:  # SyntaxError, ImportError, SystemExit from a model file
            return {"error": format_import_error(exc, sys._getframe()), "config": None}
        self.model_class = getattr(module, "TritonPythonModel", None)
        if self.model_class is None:  # Python's words, as Triton's stub reports them
            error = f"AttributeError: module '{module.__name__}' has no attribute 'TritonPythonModel'"
            return {"error": error, "config": None}
        config = None
        if message["auto_complete"] and hasattr(self.model_class, "auto_complete_config"):
            try:
                completed = self.model_class.auto_complete_config(pb_utils.ModelConfig(message["model_config"]))
                if not isinstance(completed, pb_utils.ModelConfig):
                    name = json.loads(message["model_config"]).get("name", "")
                    return {
                        "error": f"auto_complete_config function in model '{name}' must return a valid "
                        "pb.ModelConfig object.",
                        "config": None,
                    }
                config = json.dumps(completed.as_dict())
            except (Exception, SystemExit) as exc:  # SystemExit too: Triton's stub reports it and lives
                return {"error": format_exception(exc), "config": None}
        return {"error": None, "config": config}

    def _initialize(self, args: dict[str, str]) -> str | None:
        config = json.loads(args["model_config"])
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(config)
        self.instance_name = args["model_instance_name"]  # Triton's stub names the instance in its errors
        if self.decoupled:
            self._watch_dropped()
        try:
            self.model = self.model_class()
            if hasattr(self.model, "initialize"):
                result = self.model.initialize(args)
                if inspect.iscoroutine(result):
                    self.loop.run_until_complete(result)
        except (Exception, SystemExit) as exc:  # SystemExit too: Triton's stub reports it and lives
            return format_exception(exc)
        self.bls_allowed = True
        return None

    def _execute(self, message: dict[str, Any], fds: list[int]) -> None:
        requests: list[Any] = []
        arena, model_name, decoupled = self.server_arena, message["model_name"], self.decoupled
        incoming, tensor, sender = (
            pb_utils.InferenceRequest._incoming,
            pb_utils.Tensor._of,
            pb_utils.InferenceResponseSender,
        )
        read = ipc.read_tensor
        for token, inputs, outputs, request_id, parameters, correlation_id, flags in message["requests"]:
            tensors = [tensor(desc[0], read(arena, desc, fds, copy=False)) for desc in inputs]
            request = incoming(model_name, tensors, outputs, request_id, parameters, sender(token, decoupled))
            request._correlation_id, request._flags = correlation_id, flags
            requests.append(request)
        if fds:
            ipc.close_fds(fds)
        reply: dict[str, Any] = {"op": "executed", "id": message["id"], "responses": None, "error": None}
        out_fds: list[int] = []
        holding = False
        self._executing = message["requests"]  # the owners of the BLS calls made on this thread
        try:
            result = self.model.execute(requests)
            if inspect.iscoroutine(result):
                if decoupled:
                    self._run_in_background(result, requests)
                    result = None
                else:
                    result = self.loop.run_until_complete(result)
            reschedule = pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE
            rescheduled = [i for i, request in enumerate(requests) if release_flags(request) == reschedule]
            if self.decoupled:
                if result is not None:
                    raise BackendError(
                        f"Python model '{self.instance_name}' is using the decoupled mode and the execute "
                        "function must return None."
                    )
            else:
                if result is None:  # the responses went through each request's sender
                    result = [request._sender.kept if request._sender else None for request in requests]
                if not isinstance(result, list):
                    raise BackendError(
                        f"Expected a list in the execute return, found type '{type(result)}'; {_EXECUTE_RESULT_HINT}"
                    )
                if len(result) != len(requests):
                    raise BackendError(
                        "Number of InferenceResponse objects do not match the number of InferenceRequest "
                        f"objects. InferenceRequest(s) size is:{len(requests)}, and InferenceResponse(s) "
                        f"size is:{len(result)}"
                    )
                for i in rescheduled:
                    if result[i] is not None:
                        kind = type(result[i])  # named as Triton's stub names its own classes
                        named = (
                            f"<class 'c_python_backend_utils.{kind.__name__}'>"
                            if kind.__module__ == pb_utils.__name__
                            else kind
                        )
                        raise BackendError(
                            "Expected a None object in the execute function return list for reschduled request, "
                            f"found type '{named}'."
                        )
                responses = reply["responses"] = [self._response(r, out_fds) for r in result]
                if None in responses and (not rescheduled or responses.count(None) > len(rescheduled)):
                    # a request left open, to be answered later
                    self._deferring.acquire()  # released once this answer is out (see _leave_open)
                    holding = True
                    left_open = self._leave_open(requests, responses, rescheduled, out_fds)
                    if left_open:
                        reply["deferred"] = left_open
            if rescheduled:
                reply["reschedule"] = rescheduled  # run again, not released (see pb/release.py)
                for i in rescheduled:
                    requests[i]._sender._close()  # the next run of the request gets a sender of its own
        except Exception as exc:
            reply["error"] = format_exception(exc)
            reply["responses"] = None
            reply.pop("deferred", None)
            if decoupled:  # the server ends their streams with the error: nothing more goes out
                for request in requests:
                    request._sender._close()
        self._executing = ()
        if self.cancelled and not decoupled:
            # These requests are over, and so is any cancellation that came for an earlier one.
            last = message["requests"][-1][0]
            self.cancelled = {token for token in self.cancelled if token > last or token in self._left_open}
        if holding:
            try:  # now, not with a later answer: the model may send for its open requests
                self._flush()
                self.channel.send(reply, out_fds)
            finally:
                ipc.close_fds(out_fds)
                self._deferring.release()
            return
        if out_fds:
            self._flush()
            self.channel.send(reply, out_fds)
            ipc.close_fds(out_fds)
            return
        # When the next execute is already here (batches handed ahead under load), its answer goes
        # with this one: one message, one wake-up of the server, for both.
        self._answers.append(reply)
        if len(self._answers) >= _MAX_ANSWERS or not self._execute_next(message["ahead"]):
            self._flush()

    def _leave_open(
        self, requests: list[Any], responses: list[dict[str, Any] | None], rescheduled: list[int], out_fds: list[int]
    ) -> list[int]:
        """The requests given no response by execute (None returned for them, or in place of the
        list) that stay open, as Triton's python backend leaves them: their senders may send the
        response and the final flag later, from any thread. One that sent during execute is
        answered with that response now. Their tokens; the caller holds `_deferring`, so that
        nothing they send goes out before the answer that names them."""
        left_open = []
        skip = set(rescheduled)
        with pb_utils.InferenceResponseSender._lock:
            for index, request in enumerate(requests):
                if responses[index] is not None or index in skip:
                    continue
                sender = request._sender
                if sender.kept is not None:
                    responses[index] = self._response(sender.kept, out_fds)
                elif not sender._closed:
                    sender._late = True
                    left_open.append(sender._token)
        if left_open:
            self._left_open.update(left_open)
            self._watch_dropped()
        return left_open

    def _watch_dropped(self) -> None:
        """Have senders dropped before their final flag reported (see `_end_dropped`), once."""
        if pb_utils.InferenceResponseSender.dropped is None:
            pb_utils.InferenceResponseSender.dropped = self._dropped
            threading.Thread(target=self._end_dropped, name="stub-dropped-senders", daemon=True).start()

    def _run_in_background(self, coroutine: Any, requests: list[pb_utils.InferenceRequest]) -> None:
        if self._background is None:
            self._background = asyncio.new_event_loop()
            threading.Thread(target=self._background.run_forever, name="stub-async-execute", daemon=True).start()
        # The coroutine's task copies this context: its BLS calls are made for its requests.
        owners = BLS_OWNERS.set(tuple(item[0] for item in self._executing))
        try:
            future = asyncio.run_coroutine_threadsafe(coroutine, self._background)
        finally:
            BLS_OWNERS.reset(owners)
        self._running_coroutines.add(future)  # held, as Triton's stub holds them, until they end
        future.add_done_callback(lambda done: self._background_done(done, requests))

    def _background_done(self, future: concurrent.futures.Future[Any], requests: list[Any]) -> None:
        """A decoupled coroutine ended: one that raised is logged with its traceback (as Triton's
        stub logs it) and fails its requests that are still open, and only those."""
        self._running_coroutines.discard(future)
        exc = future.exception() if not future.cancelled() else None
        if exc is None:
            return
        self.log("ERROR", "".join(traceback.format_exception(exc)).rstrip())
        self._fail_open(requests, format_exception(exc))

    def _fail_open(self, requests: list[Any], error: str) -> None:
        text = f"Failed to process the request(s) for model '{self.instance_name}', message: {error}"
        for request in requests:
            if request._sender._close():
                self._send_final_error(request._sender._token, text)

    def _send_final_error(self, token: int, text: str) -> None:
        response = pb_utils.InferenceResponse(error=pb_utils.TritonError(text))
        self.send_response(token, response, pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    def _end_dropped(self) -> None:
        """End the requests whose decoupled sender was dropped before its final flag, which would
        otherwise leave their clients waiting for ever (Triton 2.51's do)."""
        while True:
            token = self._dropped.get()
            text = (
                f"Failed to process the request(s) for model '{self.instance_name}', message: the request's "
                "response sender was released without the final flag; a model that answers through its "
                "response sender ends each request with sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)"
            )
            try:
                self._send_final_error(token, text)
            except ipc.ChannelClosed:
                return

    def _execute_next(self, ahead: bool) -> bool:
        # Only a batch that was sent ahead has a successor that may be waiting unread: for any
        # other (every batch at concurrency 1) the read that would find nothing is skipped.
        if not self.work and ahead:
            self.poll()
        return bool(self.work) and self.work[0][0]["op"] == "execute"

    def _flush(self) -> None:
        answers, self._answers = self._answers, []
        if len(answers) == 1:
            self.channel.send(answers[0])
        elif answers:
            self.channel.send({"op": "executed_many", "answers": answers})

    def _response(self, response: Any, fds: list[int]) -> dict[str, Any] | None:
        if response is None:
            return None
        if not isinstance(response, pb_utils.InferenceResponse):
            raise BackendError(
                "Expected an 'InferenceResponse' object in the execute function return list, found type "
                f"'{type(response)}'; {_EXECUTE_RESULT_HINT}"
            )
        error = response._error
        arena, write = self.arena, ipc.write_tensor
        return {
            "outputs": [write(arena, t._name, t._host_array(), fds) for t in response._tensors],
            "error": None if error is None else (error.message(), error.code()),
            "parameters": response._parameters,
        }

    # --- pb_utils._runtime --------------------------------------------------------------------

    def is_cancelled(self, token: int) -> bool:
        if token not in self.cancelled:
            self.poll()  # one non-blocking read: only models that ask pay for it
        return token in self.cancelled

    def in_execute(self, token: int) -> bool:
        """Whether request `token` belongs to the execute running now."""
        return any(item[0] == token for item in self._executing)

    def send_response(self, token: int, response: pb_utils.InferenceResponse | None, flags: int) -> None:
        if not self.decoupled:  # a request left open: after the answer that says so (see _leave_open)
            with self._deferring:
                self._send_response(token, response, flags)
                if flags & pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL:
                    self._left_open.discard(token)
            return
        self._send_response(token, response, flags)

    def _send_response(self, token: int, response: pb_utils.InferenceResponse | None, flags: int) -> None:
        if flags & pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            self.cancelled.discard(token)
        fds: list[int] = []
        desc = self._response(response, fds)
        self.channel.send({"op": "response", "token": token, "response": desc, "flags": flags}, fds)
        ipc.close_fds(fds)

    def log(self, level: str, message: str) -> None:
        # The server's log names the model file and line that called pb_utils.Logger, as Triton's does.
        frame = sys._getframe(1)
        while frame.f_back is not None and frame.f_code.co_filename in _LOGGER_FILES:
            frame = frame.f_back
        where = (os.path.basename(frame.f_code.co_filename), frame.f_lineno)
        self.channel.send({"op": "log", "level": level, "message": message, "where": where})


def _watch_parent(parent: int) -> None:
    # While the model's thread runs a long execute no one reads the channel, so its EOF would go
    # unseen: a server that died meanwhile (even by SIGKILL) is noticed here within a second.
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)


def main(argv: list[str]) -> int:
    # Ctrl-C in a terminal reaches the whole process group: the server stops its stubs itself
    # (finalize, then EOF), so the stub must not die half-way on the same signal.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    fd, server_arena_fd, stub_arena_fd, size = (int(a) for a in argv[:4])
    # A model sees the argv of Triton's embedded interpreter, [""]: a model that runs
    # `unittest.main(exit=False)` (Triton's QA models do) would take ours for test names.
    sys.argv[:] = [""]
    channel = ipc.Channel(socket.socket(fileno=fd))
    stub = Stub(channel, ipc.Arena(server_arena_fd, size), ipc.Arena(stub_arena_fd, size))
    pb_utils._runtime = stub
    threading.Thread(target=_watch_parent, args=(os.getppid(),), name="stub-parent-watch", daemon=True).start()
    stub.serve()
    return 0


def run(argv: list[str]) -> None:
    """The process's whole life: serve, then exit at once."""
    code = main(argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # daemon threads and a model's own threads must not keep us alive


if __name__ == "__main__":
    run(sys.argv[1:])
