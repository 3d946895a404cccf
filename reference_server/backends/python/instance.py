"""The server's side of one python-backend model instance: what runs through its stub process
(`process.StubProcess`), and what happens when the stub fails.

Theory of operation
-------------------
A `PythonInstance` owns one stub process (`stub.py`) at a time, joined by the control channel and
two shared-memory arenas of `ipc`. The scheduler calls `start_requests` on the event loop: the
inputs go into the server's arena, one `execute` message names them, and the loop, which watches
the control socket (`process.StubProcess`), reads the answer and copies the outputs out of the
stub's arena; no thread hand-off on the way (each costs a futex wake-up and a GIL transfer, more
than a small model's execute). Batches whose inputs exceed `LOOP_MAX_INPUT_BYTES`, and any batch
that finds the stub to be restarted, go through `run_requests` in a worker thread instead, which
waits for the same answer. Warmup uses `run`, also blocking. Everything else the stub sends (a
decoupled model's responses, BLS requests, log lines) is dispatched where it is read.

Failures, each confined to what it touches:

- `execute` raises: that batch fails with Triton's "Failed to process the request(s) for model
  '<instance>', message: ..." and the exception's text and frames; the stub keeps serving.
- A response carrying `TritonError`: that request fails with its message and the code's status.
- A request execute gave no response (a non-decoupled model answering through its sender later):
  it stays open, and the rest of the batch is answered (`deferred.OpenRequests`).
- The stub exits or is killed: the reader sees EOF; the batch in flight and every open stream
  fail with "Stub process '<instance>' is not healthy."; the next batch starts a new stub
  (import and `initialize` again) before it runs.
- `execute` runs past `execute-timeout-seconds` (`--backend-config=python,execute-timeout-seconds=N`,
  default 300; 0 = no limit; counted from the batch's send, so a batch queued in the stub behind
  others counts their time too): the batch fails, the stub is killed and a new one starts with
  the next batch. Starting a stub (import, auto-complete, `initialize`) is bounded by
  `stub-timeout-seconds` (Triton's knob, default 30).

`close` calls the model's `finalize` and waits for the stub to exit (killing it after the stub
timeout); a stub whose server dies sees EOF and exits by itself.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import json
import logging
import threading
from collections.abc import Callable, Sequence
from time import perf_counter_ns
from typing import Any

from reference_server.backends.placement import Placement
from reference_server.backends.python import ipc
from reference_server.backends.python.deferred import OpenRequests, reschedule
from reference_server.backends.python.process import PythonModel, StubProcess
from reference_server.errors import InternalError, ModelConfigError, Unavailable
from reference_server.scheduling.execute import BatchItem, Deferred, RequestsOutcome, ResponseSink, Tensors

__all__ = ["PythonInstance"]

log = logging.getLogger(__name__)


#: Larger batches are copied into shared memory by a worker thread, not on the event loop.
LOOP_MAX_INPUT_BYTES = 1 << 20


class _Prepared:
    """One batch written into the server's arena, not yet answered."""

    __slots__ = ("batch_id", "fds", "items", "per_request", "tokens", "message")

    def __init__(self, batch_id: int) -> None:
        self.batch_id = batch_id
        self.fds: list[int] = []  # memfds of tensors too large for the arena
        # token, inputs, outputs, request id, parameters, correlation id, flags: see stub._execute
        self.items: list[tuple[int, list[ipc.TensorDesc], list[str], str, str, int | str, int]] = []
        self.per_request: list[list[tuple[int, int]]] = []  # each request's arena blocks
        self.tokens: list[int] = []  # the decoupled requests' stream tokens
        self.message: dict[str, Any] = {}


class _SentBatch:
    """A batch sent to the stub from the event loop, until its answer or its execute timeout.
    Its two callbacks are bound methods, not closures: compiled, a closure and its environment
    hold each other, which left a reference cycle per batch for the garbage collector."""

    __slots__ = ("instance", "stub", "batch", "prepared", "done", "t1")

    def __init__(
        self,
        instance: PythonInstance,
        stub: StubProcess,
        batch: Sequence[BatchItem],
        prepared: _Prepared,
        done: Callable[[RequestsOutcome | Exception], None],
    ) -> None:
        self.instance = instance
        self.stub = stub
        self.batch = batch
        self.prepared = prepared
        self.done = done
        self.t1 = 0  # when the execute was sent

    def on_reply(self, reply: dict[str, Any] | None, out_fds: list[int]) -> None:
        self.instance._on_reply(self, reply, out_fds)

    def expired(self) -> None:
        self.instance._expired(self)


def _result_of(future: asyncio.Future[RequestsOutcome]) -> RequestsOutcome | Exception:
    error = future.exception()
    if error is None:
        return future.result()
    return error if isinstance(error, Exception) else InternalError(repr(error))


class _Single:
    """A lone request for `run` (warmup)."""

    __slots__ = ("inputs", "output_names", "batch_size", "request_id", "parameters", "sink")

    def __init__(self, inputs: Tensors, output_names: Sequence[str]) -> None:
        self.inputs = inputs
        self.output_names = output_names
        self.batch_size = 1
        self.request_id = ""
        self.parameters: dict[str, Any] = {}
        self.sink: ResponseSink | None = None


class PythonInstance:
    """One instance of a python model: a stub process, restarted when it dies."""

    runs_on_loop = False

    def __init__(self, model: PythonModel, placement: Placement) -> None:
        self.model = model
        self.name = placement.name
        self.placement = placement
        self._stub: StubProcess | None = None
        self._lock = threading.Lock()  # one batch, start or close at a time
        self._tokens = itertools.count(1)
        self._closed = False
        # The batches sent from the loop and not yet answered, oldest first: (deadline, what to do
        # when it passes) under `execute-timeout-seconds`, watched by one timer (`_check_deadlines`).
        self._deadlines: dict[_Prepared, tuple[int, Callable[[], None]]] = {}
        self._watchdog: asyncio.TimerHandle | None = None
        # The batches sent to the stub and not concluded, by batch id, for `cancel` to find a
        # request's token (those of a stub that died are dropped when the next one starts).
        self._running: dict[int, tuple[Sequence[BatchItem], _Prepared]] = {}
        self._open = OpenRequests(model, self.name)  # requests execute left open (`deferred`)

    # --- lifecycle ------------------------------------------------------------------------------------

    def load(self, config_json: str, auto_complete: bool) -> str | None:
        """Start a stub and import the model file; returns auto_complete_config's config as JSON
        (None when the model has none or `auto_complete` is off). Raises InternalError for what the
        model file raised (the Python error in the stub's words), ModelConfigError for the stub."""
        with self._lock:
            self._stub = StubProcess(self.model, self.name)
            message = {"op": "load", "model_file": str(self.model.model_file), "model_config": config_json,
                       "auto_complete": auto_complete}  # fmt: skip
            reply = self._control(self._stub, message, "import")
            if reply["error"] is not None:
                # Triton's words and status for it (an Internal error, the Python error as the text);
                # where it happened goes to the log.
                stage = " for auto-complete" if auto_complete else ""
                log.info("Failed to initialize Python stub%s: %s", stage, reply["error"])
                log.info("model '%s': the failure above is in %s", self.model.name, self.model.model_file)
                raise InternalError(reply["error"])
            config: str | None = reply["config"]
            return config

    def initialize(self) -> None:
        with self._lock:
            assert self._stub is not None
            self._initialize(self._stub)

    def _initialize(self, stub: StubProcess) -> None:
        model = self.model
        args = {
            "model_config": model.config_json,
            "model_instance_kind": self.placement.device,
            "model_instance_name": self.name,
            "model_instance_device_id": str(self.placement.gpu or 0),
            "model_repository": str(model.model_dir),
            "model_version": str(model.version),
            "model_name": model.name,
        }
        reply = self._control(stub, {"op": "initialize", "args": args}, "initialize")
        if reply["error"] is not None:
            log.info("Failed to initialize Python stub: %s", reply["error"])
            log.error("ERROR: Failed to create instance: %s", reply["error"])
            log.info("model '%s' instance '%s': the failure above is in %s", model.name, self.name, model.model_file)
            raise InternalError(reply["error"])  # Triton's status and words, as for `load`

    def _control(self, stub: StubProcess, message: dict[str, Any], what: str) -> dict[str, Any]:
        timeout = self.model.stub_timeout_s
        try:
            reply, fds = stub.call(message, timeout)
            ipc.close_fds(fds)
            return reply
        except TimeoutError:
            stub.kill()
            raise ModelConfigError(
                f"model '{self.model.name}' instance '{self.name}': the stub did not finish {what} within "
                f"{timeout:g} s (--backend-config=python,stub-timeout-seconds=N)"
            ) from None
        except ipc.ChannelClosed:
            code = stub.process.poll()
            # Triton's words (an INTERNAL error), then which step it died in.
            raise InternalError(
                f"Stub process '{self.name}' is not healthy. (It exited during {what}, exit status {code}.)"
            ) from None

    def close(self) -> None:
        """Call the model's finalize and stop the stub.

        Called after the scheduler's grace period: a batch still running then has been failed
        already, so its stub gets a second and is then killed, rather than holding up the unload
        or the server's exit until the execute timeout.
        """
        self._closed = True
        if not self._lock.acquire(timeout=1.0):
            stub = self._stub
            if stub is not None:
                stub.kill()
            self._lock.acquire()
        try:
            stub, self._stub = self._stub, None
            if stub is None:
                return
            if stub.alive and stub.model.config_json:
                try:
                    reply, fds = stub.call({"op": "finalize"}, self.model.stub_timeout_s)
                    ipc.close_fds(fds)
                    if reply["error"] is not None:
                        log.error(
                            "model '%s' instance '%s': finalize() failed: %s",
                            self.model.name,
                            self.name,
                            reply["error"],
                        )
                except (TimeoutError, ipc.ChannelClosed):
                    stub.kill()
            stub.channel.shut()  # EOF: a stub that did not finalize exits now
            stub.close()
        finally:
            self._lock.release()

    def _running_stub(self) -> StubProcess:
        stub = self._stub
        if stub is not None and stub.alive:
            return stub
        if self._closed:
            raise Unavailable(f"model '{self.model.name}' instance '{self.name}' is unloaded")
        if stub is not None:
            log.warning("model '%s': stub process '%s' died; starting a new one", self.model.name, self.name)
            stub.kill()
            stub.close()
        self._stub = None
        self._running.clear()
        try:
            stub = StubProcess(self.model, self.name)
            self._stub = stub
            message = {"op": "load", "model_file": str(self.model.model_file), "model_config": self.model.config_json,
                       "auto_complete": False}  # fmt: skip
            reply = self._control(stub, message, "import")
            if reply["error"] is not None:
                raise ModelConfigError(f"failed to load the model file: {reply['error']}")
            self._initialize(stub)
        except (ModelConfigError, InternalError) as exc:
            raise InternalError(f"Stub process '{self.name}' is not healthy, and restarting it failed: {exc}") from None
        return stub

    # --- execution ------------------------------------------------------------------------------------

    def run(self, inputs: Tensors, output_names: Sequence[str]) -> Tensors:
        """One request outside the scheduler (warmup)."""
        (result,), _, _ = self.run_requests([_Single(inputs, output_names)])
        if isinstance(result, Deferred):  # left open: its answer comes when the model sends it
            answer = concurrent.futures.Future[Tensors | Exception]()
            result.then(answer.set_result)
            result = answer.result()
        if isinstance(result, Exception):
            raise result
        return result

    def run_requests(self, batch: Sequence[BatchItem]) -> RequestsOutcome:
        with self._lock:
            stub = self._running_stub()
            return self._execute(stub, batch)

    def start_requests(self, batch: Sequence[BatchItem], done: Callable[[RequestsOutcome | Exception], None]) -> None:
        """`run_requests` from the event loop, without a thread: send now, and finish when the
        loop reads the answer. A stub to (re)start, or inputs too large to copy on the loop, go
        to a worker thread through `run_requests` instead."""
        loop = asyncio.get_running_loop()
        stub = self._stub
        if (
            stub is None
            or not stub.alive
            or stub.loop is not loop
            or self._closed
            or sum(array.nbytes for request in batch for array in request.inputs.values()) > LOOP_MAX_INPUT_BYTES
        ):
            future = loop.run_in_executor(None, self.run_requests, batch)
            future.add_done_callback(lambda f: done(_result_of(f)))
            return
        try:
            prepared = self._prepare(stub, batch)
        except Exception as error:
            done(error)
            return
        sent = _SentBatch(self, stub, batch, prepared, done)
        try:
            stub.expect(prepared.batch_id, sent.on_reply)
            sent.t1 = perf_counter_ns()
            stub.send_execute(prepared.message, prepared.fds)
        except ipc.ChannelClosed:
            stub.unexpect(prepared.batch_id)
            done(stub.unhealthy())
            return
        finally:
            ipc.close_fds(prepared.fds)
        timeout_s = self.model.execute_timeout_s
        if timeout_s > 0:
            self._deadlines[prepared] = (sent.t1 + int(timeout_s * 1e9), sent.expired)
            if self._watchdog is None:
                self._watchdog = loop.call_later(timeout_s, self._check_deadlines)

    def _on_reply(
        self, sent: _SentBatch, reply: dict[str, Any] | None, out_fds: list[int]
    ) -> None:
        prepared, stub, done = sent.prepared, sent.stub, sent.done
        self._deadlines.pop(prepared, None)
        t2 = perf_counter_ns()
        if reply is None:
            done(stub.unhealthy())
            return
        try:
            results = self._conclude(stub, sent.batch, prepared, reply, out_fds)
        except Exception as error:
            done(error)
            return
        done((results, sent.t1, t2))

    def _expired(self, sent: _SentBatch) -> None:
        stub = sent.stub
        if stub.unexpect(sent.prepared.batch_id) is not None:
            stub.kill()
            self._abandon(stub, sent.batch, sent.prepared)
            sent.done(self._timeout_error())

    def _check_deadlines(self) -> None:
        """The execute timeout of the batches sent from the loop: one timer for all of them, at the
        oldest one's deadline (a timer set and cancelled per batch cost 3 us of each). They were
        sent in order with the same timeout, so the first one left is always the oldest."""
        self._watchdog = None
        deadlines = self._deadlines
        now = perf_counter_ns()
        while deadlines:
            prepared, (deadline, expire) = next(iter(deadlines.items()))
            if deadline > now:
                self._watchdog = asyncio.get_running_loop().call_later((deadline - now) / 1e9, self._check_deadlines)
                return
            del deadlines[prepared]
            expire()

    def cancel(self, request: BatchItem) -> bool:
        """The client gave `request` up (a decoupled one: the request feeding its sink): tell the
        model (`cancel.Cancellable`). Whether the request runs here."""
        stub = self._stub
        if stub is None or not stub.alive:
            return False
        if request.sink is not None:
            return stub.cancel_stream(request.sink)
        if self._open and self._open.cancel(request):
            return True
        for batch, prepared in list(self._running.values()):
            for item, entry in zip(batch, prepared.items):
                if item is request:
                    stub.cancel_request(entry[0])
                    return True
        return False

    def _prepare(self, stub: StubProcess, batch: Sequence[BatchItem]) -> _Prepared:
        """The inputs into the server's arena, and the execute message that names them."""
        prepared = _Prepared(stub.next_id())
        try:
            for request in batch:
                inputs = [ipc.write_tensor(stub.server_arena, n, a, prepared.fds) for n, a in request.inputs.items()]
                prepared.per_request.append([(d[3][1], d[3][2]) for d in inputs if d[3][0] == "a"])
                token = next(self._tokens)
                params, sequence = ipc.split_sequence(request.parameters)
                parameters = json.dumps(params, separators=(",", ":")) if params else "{}"
                # A tuple, not a dict: less to pickle and unpickle per request (stub._execute unpacks it).
                item = (token, inputs, list(request.output_names), request.request_id, parameters, *sequence)
                prepared.items.append(item)
                if request.sink is not None:
                    prepared.tokens.append(token)
                    stub.open_stream(token, request.sink, prepared.per_request[-1], request.output_names)
        except BaseException:
            self._abandon(stub, batch, prepared)
            ipc.close_fds(prepared.fds)
            raise
        prepared.message = {
            "op": "execute",
            "id": prepared.batch_id,
            "model_name": self.model.name,
            "requests": prepared.items,
            "free": stub.take_frees(),
            # Sent while another batch is unanswered: the stub then looks for the next one before
            # it answers this one, to send both answers together (see stub._execute).
            "ahead": stub.answers_pending(),
        }
        self._running[prepared.batch_id] = (batch, prepared)
        return prepared

    def _execute(self, stub: StubProcess, batch: Sequence[BatchItem]) -> RequestsOutcome:
        prepared = self._prepare(stub, batch)
        try:
            t1 = perf_counter_ns()
            reply, out_fds = stub.call(prepared.message, self.model.execute_timeout_s, prepared.fds)
        except TimeoutError:
            stub.kill()
            self._abandon(stub, batch, prepared)
            raise self._timeout_error() from None
        except ipc.ChannelClosed:
            raise stub.unhealthy() from None
        finally:
            ipc.close_fds(prepared.fds)
        t2 = perf_counter_ns()
        return self._conclude(stub, batch, prepared, reply, out_fds), t1, t2

    def _conclude(
        self,
        stub: StubProcess,
        batch: Sequence[BatchItem],
        prepared: _Prepared,
        reply: dict[str, Any],
        out_fds: list[int],
    ) -> list[Tensors | Exception]:
        """Each request's outputs (or error) from the stub's answer; raises when execute failed."""
        try:
            if reply["error"] is not None:
                self._abandon(stub, batch, prepared)
                raise InternalError(
                    f"Failed to process the request(s) for model '{self.name}', message: {reply['error']}"
                )
            left_open = reply.get("deferred")  # requests the model answers later (deferred.py)
            if left_open is None:
                self._release_unary(stub, batch, prepared.per_request)
            results: list[Tensors | Exception] = []
            if prepared.tokens:
                results = [{} for _ in batch]  # a decoupled model answers through the streams
            else:
                for response in reply["responses"]:
                    if response is None:
                        # The stub leaves such a request open (`deferred`) unless it was rescheduled.
                        results.append(InternalError(f"model instance '{self.name}' gave no response for a request: a "
                                                     "non-decoupled model returns one response per request, or sends "
                                                     "it with the final flag through its response sender"))  # fmt: skip
                        continue
                    outputs, error = stub.read_response(response, out_fds)
                    results.append(error if error is not None else outputs or {})
                if left_open is not None:
                    tokens = [item[0] for item in prepared.items]
                    self._open.hold(stub, batch, tokens, prepared.per_request, left_open, results)
            if "reschedule" in reply:
                reschedule(self.model, stub, prepared.items, reply["reschedule"], results)
            return results
        finally:
            self._running.pop(prepared.batch_id, None)
            ipc.close_fds(out_fds)

    def _abandon(self, stub: StubProcess, batch: Sequence[BatchItem], prepared: _Prepared) -> None:
        """A batch that will not be answered: its streams end and its inputs' space is free."""
        self._running.pop(prepared.batch_id, None)
        for token in prepared.tokens:
            stub.drop_stream(token)
        self._release_unary(stub, batch, prepared.per_request)

    def _timeout_error(self) -> InternalError:
        return InternalError(
            f"Failed to process the request(s) for model '{self.name}', message: execute() did not return within "
            f"{self.model.execute_timeout_s:g} s (--backend-config=python,execute-timeout-seconds=N); the stub "
            "process was killed and is restarted for the next request"
        )

    @staticmethod
    def _release_unary(stub: StubProcess, batch: Sequence[BatchItem], per_request: list[list[tuple[int, int]]]) -> None:
        # A decoupled request's inputs stay until its final response (drop_stream frees them).
        for request, blocks in zip(batch, per_request):
            if request.sink is None:
                stub.release(blocks)
