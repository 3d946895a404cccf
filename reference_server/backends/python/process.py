"""One python-backend stub process, from the server's side: its start, its control channel and
arenas (`ipc`), and a reader thread for everything the stub sends.

`StubProcess.call` sends a message and waits for its answer (execute by id; load, initialize and
finalize one at a time). The reader thread takes the answers, a decoupled model's responses (handed
to each request's sink from that thread), BLS requests (run on the server's loop through the
`BackendContext` hooks and answered through shared memory), log lines, and custom-metric and
model-control calls (`services.py`). At EOF (the stub exited or was killed) it fails every waiting
call and open stream with "Stub process '<instance>' is not healthy." `instance.PythonInstance`
decides what to do about it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import json
import logging
import subprocess
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reference_server.backends.context import BackendContext, ModelCall
from reference_server.backends.python import environment, ipc, services
from reference_server.errors import (
    AlreadyExists,
    Cancelled,
    InternalError,
    InvalidArgument,
    NotFound,
    ServerError,
    Unavailable,
    Unknown,
    Unsupported,
)
from reference_server.scheduling.cancel import CANCELLED_MESSAGE
from reference_server.scheduling.execute import ResponseSink, Tensors

__all__ = ["PythonModel", "StubProcess", "server_error_from_code"]

log = logging.getLogger(__name__)

_FINAL = 1  # TRITONSERVER_RESPONSE_COMPLETE_FINAL
_ANSWERS = frozenset(("executed", "executed_many"))

# TRITONSERVER_Error_Code → our errors, which carry Triton's HTTP and gRPC statuses for each.
_BY_CODE: dict[int, type[ServerError]] = {
    0: Unknown, 1: InternalError, 2: NotFound, 3: InvalidArgument, 4: Unavailable, 5: Unsupported,
    6: AlreadyExists, 7: Cancelled,
}  # fmt: skip
_CODE_OF = {"UNKNOWN": 0, "INTERNAL": 1, "NOT_FOUND": 2, "INVALID_ARGUMENT": 3, "UNAVAILABLE": 4,
            "UNIMPLEMENTED": 5, "ALREADY_EXISTS": 6, "CANCELLED": 7}  # fmt: skip


def server_error_from_code(message: str, code: int) -> ServerError:
    """The ServerError for a model's `TritonError(message, code)`."""
    return _BY_CODE.get(code, InternalError)(message)


def _code_of(error: ServerError) -> int:
    return _CODE_OF.get(error.grpc_code, 1)


@dataclass(slots=True)
class PythonModel:
    """What every instance of one python model version shares."""

    name: str
    version: int
    model_file: Path
    model_dir: Path
    context: BackendContext
    config_json: str = ""  # the completed config, as `args["model_config"]`
    output_types: dict[str, str] = field(default_factory=dict)  # output name → v2 datatype
    decoupled: bool = False
    arena_bytes: int = 64 << 20
    stub_timeout_s: float = 30.0
    execute_timeout_s: float = 300.0
    interpreter: tuple[str, ...] = ()  # the stub's Python command; () is the server's own


class _Waiter:
    __slots__ = ("event", "message", "fds", "dead")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.message: dict[str, Any] | None = None
        self.fds: list[int] = []
        self.dead = False


@dataclass(slots=True)
class _Stream:
    sink: ResponseSink
    blocks: list[tuple[int, int]]  # the request's inputs in the server arena
    output_names: Sequence[str]  # empty = all



def _stop_reading(loop: asyncio.AbstractEventLoop, fd: int) -> None:
    """`loop.remove_reader(fd)`. Called through `Any`: typeshed says it returns a bool, uvloop's
    returns None, and compiled code checks what it is told, so the call raised TypeError and a
    dead stub was never marked dead (docs/compiled.md)."""
    remove: Any = loop.remove_reader
    remove(fd)

class StubProcess:
    """One stub process and its channel, arenas and reader thread."""

    def __init__(self, model: PythonModel, instance_name: str) -> None:
        self.model = model
        self.instance_name = instance_name
        self.channel, child = ipc.Channel.pair()
        label = f"pb-{model.name}-{instance_name}"[:200]
        self.server_arena = ipc.Arena.create(label + "-in", model.arena_bytes)
        self.stub_arena = ipc.Arena.create(label + "-out", model.arena_bytes)
        fds = (child.fileno(), self.server_arena.fd, self.stub_arena.fd)
        command, env = environment.stub_command(model.interpreter, [*map(str, fds), str(model.arena_bytes)])
        try:
            self.process = subprocess.Popen(
                command,
                pass_fds=fds,
                env=env,
                stdin=subprocess.DEVNULL,
            )
        finally:
            child.close()
        self.alive = True
        self._lock = threading.Lock()
        self._waiters: dict[object, _Waiter] = {}
        self._streams: dict[int, _Stream] = {}
        # Requests an execute answer left open (`deferred`), by token, until `defer` opens their
        # stream: their responses, if any came before that, wait here (see `defer`).
        self._early: dict[int, list[tuple[dict[str, Any], list[int]]]] = {}
        self._ids = itertools.count(1)
        self._to_free: list[tuple[int, int]] = []  # stub-arena blocks read and copied, not yet given back
        self._to_free_bytes = 0
        self._callbacks: dict[int, Callable[[dict[str, Any] | None, list[int]], None]] = {}
        # BLS calls running for requests of the model (their tokens, not yet cancelled), by BLS id.
        self._bls_calls: dict[int, tuple[set[int], concurrent.futures.Future[None]]] = {}
        # The server's event loop reads the channel when there is one (no thread hand-off per
        # answer); without one (a backend used on its own) a reader thread does.
        loop = model.context.loop
        self.loop = loop if loop is not None and loop.is_running() and not loop.is_closed() else None
        self._reader: threading.Thread | None = None
        self._outbox: ipc.Outbox | None = None
        if self.loop is not None:
            self._outbox = ipc.Outbox(self.channel, self.loop, self._lost)
            self.loop.call_soon_threadsafe(self.loop.add_reader, self.channel.sock.fileno(), self._on_readable)
        else:
            self._reader = threading.Thread(target=self._read, name=f"{instance_name}-stub-reader", daemon=True)
            self._reader.start()

    # --- requests and answers -------------------------------------------------------------------

    def call(
        self, message: dict[str, Any], timeout_s: float, fds: list[int] | None = None
    ) -> tuple[dict[str, Any], list[int]]:
        """Send `message` and wait for its answer (execute by id; load, initialize and finalize are
        one at a time). Raises TimeoutError, or ipc.ChannelClosed when the stub died."""
        key: object = message.get("id", "control")
        waiter = _Waiter()
        with self._lock:
            if not self.alive:
                raise ipc.ChannelClosed("stub is gone")
            self._waiters[key] = waiter
        try:
            self.channel.send(message, fds)
            if not waiter.event.wait(timeout_s if timeout_s > 0 else None):
                raise TimeoutError
        finally:
            with self._lock:
                self._waiters.pop(key, None)
        if waiter.dead or waiter.message is None:
            raise ipc.ChannelClosed("stub is gone")
        return waiter.message, waiter.fds

    def send_execute(self, message: dict[str, Any], fds: list[int]) -> None:
        """Send an execute from the loop. One sent ahead (the stub still owes an answer, so it is
        busy) waits for the end of the loop's pass and goes with the others of that pass
        (`ipc.Outbox`)."""
        if self._outbox is None:
            self.channel.send(message, fds)
        else:
            self._outbox.send(message, fds, hold=message["ahead"])

    def _lost(self, messages: list[dict[str, Any]]) -> None:
        """Executes held for the end of the loop's pass that could not be sent: the stub is gone."""
        for message in messages:
            callback = self.unexpect(message["id"])
            if callback is not None:
                callback(None, [])

    def expect(self, batch_id: int, callback: Callable[[dict[str, Any] | None, list[int]], None]) -> None:
        """Have `callback(answer, fds)` called (on the reading side) when execute `batch_id` is
        answered, or `callback(None, [])` if the stub dies first. On the loop only."""
        with self._lock:
            if not self.alive:
                raise ipc.ChannelClosed("stub is gone")
            self._callbacks[batch_id] = callback

    def answers_pending(self) -> bool:
        """Whether an execute sent from the loop is still unanswered."""
        return bool(self._callbacks)

    def unexpect(self, batch_id: int) -> Callable[[dict[str, Any] | None, list[int]], None] | None:
        with self._lock:
            return self._callbacks.pop(batch_id, None)

    def open_stream(
        self, token: int, sink: ResponseSink, blocks: list[tuple[int, int]], output_names: Sequence[str]
    ) -> None:
        with self._lock:
            self._streams[token] = _Stream(sink, blocks, output_names)

    def defer(self, token: int, sink: ResponseSink, blocks: list[tuple[int, int]], output_names: Sequence[str]) -> None:
        """Open the stream of a request its execute left open (`deferred.py`). A worker thread that
        waited for the execute answer opens it while the loop reads on: whatever the model sent for
        it meanwhile was kept for now."""
        with self._lock:
            if not self.alive:
                early = None
            else:
                self._streams[token] = _Stream(sink, blocks, output_names)
                early = self._early.pop(token, [])
        if early is None:
            self.release(blocks)
            sink(None, True, self.unhealthy())
            return
        for message, fds in early:
            self._response(message, fds)

    def cancel_stream(self, sink: ResponseSink) -> bool:
        """Tell the stub that the client gave up the stream `sink` feeds (the model sees
        `is_cancelled()`); it stays open until its final response, which frees its inputs. Whether
        it was one of ours."""
        with self._lock:
            token = next((t for t, stream in self._streams.items() if stream.sink is sink), None)
        if token is None:
            return False
        self.cancel_request(token)
        return True

    def cancel_request(self, token: int) -> None:
        """Tell the stub that the client gave up request `token`, and cancel the BLS calls the
        model made for it (for a batch of several, once all of them are cancelled). Sent at once,
        even past the request's execute held in the outbox: the stub keeps a cancellation that
        comes before its request's execute."""
        try:
            self.channel.send({"op": "cancel", "token": token})
        except ipc.ChannelClosed:
            pass  # the stub is gone: the request ends with its death
        with self._lock:
            orphans = []
            for owners, call in self._bls_calls.values():
                if token in owners:
                    owners.discard(token)
                    if not owners:
                        orphans.append(call)
        for call in orphans:
            call.cancel()  # its caller hears CANCELLED (see _run_bls)

    def drop_stream(self, token: int) -> None:
        with self._lock:
            stream = self._streams.pop(token, None)
        if stream is not None:
            self.release(stream.blocks)

    def release(self, blocks: list[tuple[int, int]]) -> None:
        for offset, nbytes in blocks:
            self.server_arena.release(offset, nbytes)

    def give_back(self, blocks: list[tuple[int, int]]) -> None:
        """Free stub-arena blocks we have copied out of: they ride on the next execute message, or
        go at once when they add up to an eighth of the arena (decoupled and BLS traffic)."""
        if not blocks:
            return
        with self._lock:
            self._to_free += blocks
            self._to_free_bytes += sum(nbytes for _, nbytes in blocks)
            if self._to_free_bytes < self.stub_arena.size // 8:
                return
            pending, self._to_free, self._to_free_bytes = self._to_free, [], 0
        self.channel.send({"op": "free", "blocks": pending})

    def take_frees(self) -> list[tuple[int, int]]:
        with self._lock:
            pending, self._to_free, self._to_free_bytes = self._to_free, [], 0
        return pending

    def next_id(self) -> int:
        return next(self._ids)

    def kill(self) -> None:
        with self._lock:
            self.alive = False  # now, not when the reader sees EOF: the next batch must start a new stub
        try:
            self.process.kill()
        except OSError:
            pass

    def close(self) -> None:
        """Wait for the exited (or killed) process and let go of the channel and arenas.
        Not on the loop (it waits for the loop to stop reading)."""
        try:
            self.process.wait(timeout=self.model.stub_timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            self.process.wait()
        self._detach()
        self._died()  # whatever the loop had not read: the streams still open end now
        self.channel.close()
        if self._reader is not None:
            self._reader.join(5)
        # Once nothing reads its calls any more: its metric families leave the metrics port with it.
        services.release(self)
        self.server_arena.close()
        self.stub_arena.close()

    def _detach(self) -> None:
        """Stop the loop reading the socket before it is closed (its number could be reused)."""
        loop = self.loop
        if loop is None or loop.is_closed():
            return
        detached = concurrent.futures.Future[None]()

        def remove() -> None:
            if self.channel.sock.fileno() >= 0:
                _stop_reading(loop, self.channel.sock.fileno())
            detached.set_result(None)

        try:
            loop.call_soon_threadsafe(remove)
            detached.result(5)
        except (RuntimeError, concurrent.futures.TimeoutError):
            pass  # the loop is closed or stopped: it reads nothing any more

    # --- reading: the loop, or a reader thread ------------------------------------------------

    def _on_readable(self) -> None:
        # At most a few messages per callback, so one chatty stub cannot hold the loop. After an
        # execute answer it stops without the read that would find nothing (a failed recvmsg on
        # every request at low load): the loop's readiness is level-triggered, so anything sent
        # meanwhile is read on the loop's next pass.
        for _ in range(32):
            try:
                message, fds = self.channel.recv(wait=False)
            except BlockingIOError:
                return
            except ipc.ChannelClosed:
                assert self.loop is not None
                if self.channel.sock.fileno() >= 0:
                    _stop_reading(self.loop, self.channel.sock.fileno())
                self._died()
                return
            try:
                self._dispatch(message, fds)
            except Exception:
                log.exception(
                    "model '%s' instance '%s': bad message from the stub", self.model.name, self.instance_name
                )
                self.kill()
            if message["op"] in _ANSWERS:
                return

    def _read(self) -> None:
        try:
            while True:
                message, fds = self.channel.recv()
                self._dispatch(message, fds)
        except ipc.ChannelClosed:
            pass
        except Exception:
            log.exception("model '%s' instance '%s': bad message from the stub", self.model.name, self.instance_name)
            self.kill()
        self._died()

    def _dispatch(self, message: dict[str, Any], fds: list[int]) -> None:
        op = message["op"]
        if op == "executed_many":  # answers the stub sent together (none of them with fds)
            for answer in message["answers"]:
                self._dispatch(answer, [])
            return
        if op in ("executed", "loaded", "initialized", "finalized"):
            if "deferred" in message:  # before anyone hears the answer: see `defer`
                with self._lock:
                    for token in message["deferred"]:
                        self._early[token] = []
            key: object = message["id"] if op == "executed" else "control"
            callback = self.unexpect(message["id"]) if op == "executed" else None
            if callback is not None:
                callback(message, fds)
                return
            with self._lock:
                waiter = self._waiters.get(key)
            if waiter is None:
                ipc.close_fds(fds)  # its caller gave up (timeout); the stub is being killed
                return
            waiter.message, waiter.fds = message, fds
            waiter.event.set()
        elif op == "response":
            self._response(message, fds)
        elif op == "free":
            for offset, nbytes in message["blocks"]:
                self.stub_arena.release(offset, nbytes)
        elif op == "bls":
            self._bls(message, fds)
        elif op == "bls_cancel":  # ResponseIterator.cancel()
            with self._lock:
                running = self._bls_calls.get(message["id"])
            if running is not None:
                running[1].cancel()  # the call answers CANCELLED (see _run_bls)
        elif op == "service":  # custom metrics and the model loading API
            services.serve(self, message, fds)
        elif op == "log":
            level = {"WARNING": logging.WARNING, "ERROR": logging.ERROR, "VERBOSE": logging.DEBUG}.get(
                message["level"], logging.INFO
            )
            # As Triton's: the model file and line that logged, and the message as the model wrote it.
            file, line = message.get("where", (self.instance_name, 0))
            log.log(level, "%s", message["message"], extra={"triton_file": file, "triton_line": line})
        else:
            raise ValueError(f"unknown operation {op!r}")

    def _response(self, message: dict[str, Any], fds: list[int]) -> None:
        token = message["token"]
        final = bool(message["flags"] & _FINAL)
        with self._lock:
            stream = self._streams.get(token)
            if stream is None and token in self._early:
                self._early[token].append((message, fds))  # its stream opens in a moment (`defer`)
                return
        try:
            outputs, error = self.read_response(message["response"], fds)
        finally:
            ipc.close_fds(fds)
        if stream is None:
            return  # the request already ended (its execute failed)
        if final:
            self.drop_stream(token)
        if outputs is not None and stream.output_names:
            missing = [name for name in stream.output_names if name not in outputs]
            if missing:
                error = InternalError(f"model '{self.model.name}' did not produce requested output(s) {missing}")
            outputs = {name: outputs[name] for name in stream.output_names if name in outputs}
        if error is not None:
            # An error response, as Triton's: the stream goes on unless it carried the final flag.
            stream.sink(None, final, error)
        elif outputs is not None or final:
            stream.sink(outputs, final, None)

    def read_response(self, desc: dict[str, Any] | None, fds: list[int]) -> tuple[Tensors | None, ServerError | None]:
        """A response's outputs (copied out of shared memory, which is then freed) or its error.
        The caller closes `fds`."""
        try:
            if desc is None:
                return None, None
            outputs: Tensors = {}
            blocks = []
            for tensor in desc["outputs"]:
                outputs[tensor[0]] = ipc.read_tensor(self.stub_arena, tensor, fds, copy=True)
                if tensor[3][0] == "a":
                    blocks.append((tensor[3][1], tensor[3][2]))
            self.give_back(blocks)
            if desc["error"] is not None:
                return None, server_error_from_code(*desc["error"])
            self.model_check(desc["outputs"])
            return outputs, None
        except ipc.ChannelClosed:
            return None, self.unhealthy()

    def model_check(self, outputs: list[ipc.TensorDesc]) -> None:
        """Log an output whose datatype is not the configuration's, once per output of the model: it
        goes to the client as the model made it, as on Triton 2.51, which does not check."""
        types = self.model.output_types
        for name, got, _, _ in outputs:
            want = types.get(name)
            if want is not None and got != want and types.pop(name, None) is not None:
                log.warning(
                    "model '%s' instance '%s': output '%s' has datatype %s but the model configuration says %s; "
                    "it is sent as %s",
                    self.model.name, self.instance_name, name, got, want, got,
                )  # fmt: skip

    def unhealthy(self) -> InternalError:
        return InternalError(f"Stub process '{self.instance_name}' is not healthy.")

    def _died(self) -> None:
        with self._lock:
            self.alive = False
            waiters = list(self._waiters.values())
            streams = list(self._streams.values())
            self._streams.clear()
            callbacks = list(self._callbacks.values())
            self._callbacks.clear()
            early = [fds for messages in self._early.values() for _, fds in messages]
            self._early.clear()
        for fds in early:
            ipc.close_fds(fds)
        for waiter in waiters:
            waiter.dead = True
            waiter.event.set()
        for callback in callbacks:
            callback(None, [])
        for stream in streams:
            stream.sink(None, True, self.unhealthy())

    # --- BLS ------------------------------------------------------------------------------------------

    def _bls(self, message: dict[str, Any], fds: list[int]) -> None:
        try:
            inputs = {d[0]: ipc.read_tensor(self.stub_arena, d, fds, copy=True) for d in message["inputs"]}
        finally:
            ipc.close_fds(fds)
        self.give_back([(d[3][1], d[3][2]) for d in message["inputs"] if d[3][0] == "a"])
        try:
            parameters = json.loads(message["parameters"] or "{}")
        except json.JSONDecodeError:
            parameters = {}
        timeout = message["timeout"]
        call = ModelCall(
            model_name=message["model_name"],
            model_version=message["model_version"],
            inputs=inputs,
            output_names=list(message["outputs"]),
            request_id=message["request_id"],
            parameters=ipc.join_sequence(parameters if isinstance(parameters, dict) else {}, *message["sequence"]),
            timeout_us=timeout or None,
        )
        context = self.model.context
        bls_id, decoupled = message["id"], bool(message["decoupled"])
        if context.loop is None or context.call_model is None or context.stream_model is None:
            self._bls_answer(bls_id, decoupled, None, Unsupported("this server offers no BLS here"), True)
            return
        running = asyncio.run_coroutine_threadsafe(self._run_bls(context, call, bls_id, decoupled), context.loop)
        owners = message.get("owners")
        if owners or decoupled:  # what may cancel it: cancel_request (its owners), bls_cancel (a stream's)
            with self._lock:
                self._bls_calls[bls_id] = (set(owners or ()), running)
            running.add_done_callback(lambda _: self._forget_bls(bls_id))

    def _forget_bls(self, bls_id: int) -> None:
        with self._lock:
            self._bls_calls.pop(bls_id, None)

    async def _run_bls(self, context: BackendContext, call: ModelCall, bls_id: int, decoupled: bool) -> None:
        assert context.call_model is not None and context.stream_model is not None
        try:
            if decoupled:
                final_sent = False
                async for outputs, final in context.stream_model(call):
                    self._bls_answer(bls_id, True, outputs, None, final)
                    final_sent = final
                if not final_sent:
                    self._bls_answer(bls_id, True, None, None, True)
            else:
                self._bls_answer(bls_id, False, await context.call_model(call), None, True)
        except ServerError as error:
            self._bls_answer(bls_id, decoupled, None, error, True)
        except asyncio.CancelledError:  # the request it was made for was cancelled (cancel_request)
            self._bls_answer(bls_id, decoupled, None, Cancelled(CANCELLED_MESSAGE), True)
        except Exception as error:  # a bug on our side must still answer the model
            log.exception("BLS call from '%s' failed", self.instance_name)
            self._bls_answer(bls_id, decoupled, None, InternalError(f"{type(error).__name__}: {error}"), True)

    def _bls_answer(
        self, bls_id: int, decoupled: bool, outputs: Tensors | None, error: ServerError | None, final: bool
    ) -> None:
        fds: list[int] = []
        response = None
        if outputs is not None:
            response = {
                "outputs": [ipc.write_tensor(self.server_arena, n, a, fds) for n, a in outputs.items()],
                "parameters": "{}",
            }
        wire_error = None if error is None else (error.message, _code_of(error))
        try:
            self.channel.send(
                {"op": "bls_result", "id": bls_id, "response": response, "error": wire_error, "final": final,
                 "decoupled": decoupled},
                fds,
            )  # fmt: skip
        except ipc.ChannelClosed:
            pass
        finally:
            ipc.close_fds(fds)
