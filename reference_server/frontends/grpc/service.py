"""KServe v2 over gRPC: decode, call the data plane, encode. No business logic here.

`frontends.grpc.server.GrpcServer` serves it, calling its methods as grpc.aio would (a request and a context
with `abort` and `write`). The servicer mirrors `rest.py`: every method turns a tritonclient `inference` proto into the data
plane's arguments, awaits it, and turns the answer back into a proto. Failures leave through one
place, `_rpc`: a `ServerError` carries its own gRPC status-code name, v2kit's errors are mapped to
theirs by `errors.server_error` (a malformed request is INVALID_ARGUMENT), and anything else is a
bug (INTERNAL, logged with its traceback).

ModelStreamInfer answers an error in the stream (`error_message`) and goes on, unless the client
opened the stream with the `triton_grpc_error: true` header: then the first error a response carries
ends the call with its status (`_EndStream`), as Triton's stream_infer_handler.cc does.

ModelInfer is the hot path: the request's raw bytes become zero-copy numpy views (`tensor_from_raw`)
and the only copy on the way out is the one protobuf needs to own the output bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, TypeAlias, TypeVar

import grpc
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from reference_server.core import log_settings, tracing
from reference_server.core.dataplane import GRPC_ENDPOINT
from reference_server.errors import ServerError, Unsupported, server_error
from reference_server.frontends.plane import Plane
from v2kit.grpc_proto import parameters_from_proto, request_from_proto, response_to_proto

log = logging.getLogger(__name__)

__all__ = ["InferenceServicer", "lenient_deserializer"]

Req = TypeVar("Req")
Resp = TypeVar("Resp")
Context: TypeAlias = grpc.aio.ServicerContext  # Any to mypy: grpcio ships no type hints
Method: TypeAlias = Callable[[Any, Req, Context], Awaitable[Resp]]


def _status(exc: Exception, method: str) -> tuple[grpc.StatusCode, str]:
    """The one error mapping of the gRPC front end (the REST middleware reads the same attributes).

    Unexpected errors are logged with their traceback here.
    """
    error = server_error(exc)
    if error is not None:
        return grpc.StatusCode[error.grpc_code], error.message
    log.error("internal error serving gRPC %s", method, exc_info=exc)
    return grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}"


class _Malformed:
    """A request whose bytes are not the method's message: answered INVALID_ARGUMENT, not the
    UNKNOWN that grpc gives when a deserializer raises."""

    __slots__ = ("error",)

    def __init__(self, error: str) -> None:
        self.error = error


def lenient_deserializer(message_class: Any) -> Callable[[bytes], Any]:
    name = message_class.DESCRIPTOR.full_name

    def parse(data: bytes) -> Any:
        try:
            return message_class.FromString(data)
        except DecodeError as exc:
            return _Malformed(f"the request is not a valid {name} message: {exc}")

    return parse


def _rpc(method: Method[Req, Resp]) -> Method[Req, Resp]:
    """Wraps every servicer method so that a failure aborts the call with the status its error names."""

    @functools.wraps(method)
    async def handler(self: Any, request: Req, context: Context) -> Resp:
        if isinstance(request, _Malformed):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, request.error)
        try:
            return await method(self, request, context)
        except grpc.aio.AbortError:
            raise  # already a status: context.abort was called below us
        except Exception as exc:
            code, message = _status(exc, method.__name__)
        await context.abort(code, message)
        raise AssertionError("unreachable: context.abort raises")

    return handler


def _choice(value: Any) -> Any:
    """The value of a `LogSettingsRequest.SettingValue`'s `parameter_choice`, None when none is set."""
    choice = value.WhichOneof("parameter_choice")
    return None if choice is None else getattr(value, choice)


def _check_repository(name: str) -> None:
    # Triton serves one repository and refuses a named one rather than ignoring the field.
    if name:
        raise Unsupported(f"repository_name '{name}': named repositories are not supported by this server")


_FINAL = "triton_final_response"
_EMPTY_FINAL = "triton_enable_empty_final_response"


def _wants_empty_final(request: pb.ModelInferRequest) -> bool:
    parameter = request.parameters.get(_EMPTY_FINAL)
    return parameter is not None and parameter.bool_param


def _stream_reply(request: pb.ModelInferRequest, final: bool, error: str = "") -> pb.ModelStreamInferResponse:
    """A reply without outputs (a failed response, or a final flag sent alone): the request's id,
    model name and version as it asked for them, and whether it is the last."""
    reply = pb.ModelInferResponse(id=request.id, model_name=request.model_name, model_version=request.model_version)
    reply.parameters[_FINAL].bool_param = final
    return pb.ModelStreamInferResponse(error_message=error, infer_response=reply)


class _EndStream(Exception):
    """A response's error on a stream opened with the `triton_grpc_error: true` header: it ends the
    call with its status (src/grpc/stream_infer_handler.cc, WriteGRPCErrorResponse)."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _ends_on_error(context: Context) -> bool:
    # Triton reads the header once, when the stream opens; only "true" turns the mode on.
    metadata = getattr(context, "invocation_metadata", None)
    return metadata is not None and ("triton_grpc_error", "true") in tuple(metadata() or ())


def _rejected(request: pb.ModelInferRequest, exc: Exception) -> pb.ModelStreamInferResponse:
    # Refused before it ran: Triton's reply carries only the id, so the client can tell which
    # request failed.
    message = _status(exc, "ModelStreamInfer")[1]
    return pb.ModelStreamInferResponse(error_message=message, infer_response=pb.ModelInferResponse(id=request.id))


class InferenceServicer(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    """`inference.GRPCInferenceService` over a DataPlane."""

    def __init__(self, plane: Plane) -> None:
        self._plane = plane

    # --- health and metadata ---------------------------------------------------------------------

    @_rpc
    async def ServerLive(self, request: pb.ServerLiveRequest, context: Context) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self._plane.live())

    @_rpc
    async def ServerReady(self, request: pb.ServerReadyRequest, context: Context) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=self._plane.ready())

    @_rpc
    async def ModelReady(self, request: pb.ModelReadyRequest, context: Context) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(ready=self._plane.model_ready(request.name, request.version))

    @_rpc
    async def ServerMetadata(self, request: pb.ServerMetadataRequest, context: Context) -> pb.ServerMetadataResponse:
        return json_format.ParseDict(self._plane.server_metadata(), pb.ServerMetadataResponse())

    @_rpc
    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context: Context) -> pb.ModelMetadataResponse:
        metadata = self._plane.model_metadata(request.name, request.version)
        return json_format.ParseDict(metadata, pb.ModelMetadataResponse())

    @_rpc
    async def ModelConfig(self, request: pb.ModelConfigRequest, context: Context) -> pb.ModelConfigResponse:
        return pb.ModelConfigResponse(config=self._plane.model_config_proto(request.name, request.version))

    # --- inference -------------------------------------------------------------------------------

    @_rpc
    async def ModelInfer(self, request: pb.ModelInferRequest, context: Context) -> pb.ModelInferResponse:
        with self._plane.admit():
            return response_to_proto(await self._plane.infer(request_from_proto(request), endpoint=GRPC_ENDPOINT))

    def start_ModelInfer(self, request: pb.ModelInferRequest, done: Callable[[Any], None]) -> None:
        """ModelInfer without a coroutine (`server._serve_now`): the request goes to the
        scheduler through `Plane.start_infer`, and `done` gets the response message, or the
        (status, details) that `ModelInfer` would abort with, once, on the loop."""
        if isinstance(request, _Malformed):
            done((grpc.StatusCode.INVALID_ARGUMENT, request.error))
            return
        plane = self._plane
        try:
            plane.acquire()
        except Exception as exc:
            done(_status(exc, "ModelInfer"))
            return
        held = True

        def answered(response: Any) -> None:
            nonlocal held
            if held:
                held = False
                plane.release()
            try:
                if isinstance(response, Exception):
                    raise response
                message = response_to_proto(response)
            except Exception as exc:
                done(_status(exc, "ModelInfer"))
                return
            done(message)

        try:
            plane.start_infer(request_from_proto(request), answered, endpoint=GRPC_ENDPOINT)
        except Exception as exc:
            answered(exc)

    @_rpc
    async def ModelStreamInfer(self, requests: AsyncIterator[pb.ModelInferRequest], context: Context) -> None:
        # Requests on one stream run concurrently, as in Triton, so that a single stream can fill a
        # dynamic batch and a slow decoupled request holds up no other; replies leave as they come,
        # each carrying its request's id. grpc.aio allows one write in flight, hence the lock.
        # With `triton_grpc_error: true`, a response's error ends the call with its status instead
        # (a request refused before it runs is still answered in the stream, as Triton does).
        write_lock = asyncio.Lock()
        tasks: set[asyncio.Task[None]] = set()
        failures: list[BaseException] = []
        ends = _ends_on_error(context)
        main = asyncio.current_task()

        async def answer(request: pb.ModelInferRequest | _Malformed) -> None:
            async with contextlib.aclosing(self._stream_replies(request, ends)) as replies:
                async for reply in replies:
                    async with write_lock:
                        await context.write(reply)

        def finished(task: asyncio.Task[None]) -> None:
            tasks.discard(task)
            if not task.cancelled() and (exc := task.exception()) is not None:
                failures.append(exc)
                if isinstance(exc, _EndStream) and main is not None:
                    main.cancel()  # stop waiting for the client's next request

        try:
            async for request in requests:
                if failures:
                    break
                task = asyncio.create_task(answer(request))
                tasks.add(task)
                task.add_done_callback(finished)
            # The client half-closed: finish what it sent, then end the call with OK.
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
            if failures:
                raise failures[0]  # a write failed, or a response's error ends the stream (`ends`)
        except (asyncio.CancelledError, _EndStream):
            ended = next((f for f in failures if isinstance(f, _EndStream)), None)
            if ended is None:
                raise
            await context.abort(ended.code, ended.message)
        finally:
            # Cancelled (the client went away), or the call failed: the requests still running
            # are cancelled, and so are their models' executions.
            for pending in tasks:
                pending.cancel()

    async def _stream_replies(
        self, request: pb.ModelInferRequest | _Malformed, ends: bool = False
    ) -> AsyncGenerator[pb.ModelStreamInferResponse, None]:
        """Triton's replies to one request on the stream (src/grpc/stream_infer_handler.cc): each
        response with `triton_final_response`; an error as `error_message` (the stream stays open;
        with `ends`, a response's error raises `_EndStream` instead);
        a final flag sent alone as an empty response only when the request asked for one with
        `triton_enable_empty_final_response`."""
        if isinstance(request, _Malformed):
            yield pb.ModelStreamInferResponse(error_message=request.error, infer_response=pb.ModelInferResponse())
            return
        plane = self._plane
        try:
            plane.acquire()
        except Exception as exc:
            yield _rejected(request, exc)
            return
        try:
            try:
                responses = plane.infer_stream(request_from_proto(request), endpoint=GRPC_ENDPOINT)
            except Exception as exc:
                yield _rejected(request, exc)
                return
            async with contextlib.aclosing(responses):
                try:
                    async for response, final in responses:
                        if response is None:
                            if _wants_empty_final(request):
                                yield _stream_reply(request, final)
                        elif isinstance(response, ServerError):
                            if ends:
                                raise _EndStream(grpc.StatusCode[response.grpc_code], response.message)
                            yield _stream_reply(request, final, response.message)
                        else:
                            proto = response_to_proto(response)
                            proto.parameters[_FINAL].bool_param = final
                            yield pb.ModelStreamInferResponse(infer_response=proto)
                except _EndStream:
                    raise
                except Exception as exc:
                    # The execution failed: Triton's last, failed response for the request.
                    code, message = _status(exc, "ModelStreamInfer")
                    if ends:
                        raise _EndStream(code, message) from None
                    yield _stream_reply(request, True, message)
        finally:
            plane.release()

    # --- statistics and repository ---------------------------------------------------------------

    @_rpc
    async def ModelStatistics(self, request: pb.ModelStatisticsRequest, context: Context) -> pb.ModelStatisticsResponse:
        # The data plane speaks the statistics extension's JSON, whose field names are the proto's.
        stats = self._plane.statistics(request.name, request.version)
        return json_format.ParseDict(stats, pb.ModelStatisticsResponse())

    @_rpc
    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest, context: Context) -> pb.RepositoryIndexResponse:
        _check_repository(request.repository_name)
        models = self._plane.repository_index(request.ready)
        return json_format.ParseDict({"models": models}, pb.RepositoryIndexResponse())

    @_rpc
    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, context: Context
    ) -> pb.RepositoryModelLoadResponse:
        _check_repository(request.repository_name)
        # ModelRepositoryParameter shares InferParameter's `parameter_choice` oneof; a `file:`
        # override arrives as bytes_param, the file's content.
        await self._plane.load_model(request.model_name, parameters_from_proto(request.parameters))
        return pb.RepositoryModelLoadResponse()

    @_rpc
    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: Context
    ) -> pb.RepositoryModelUnloadResponse:
        _check_repository(request.repository_name)
        await self._plane.unload_model(request.model_name, parameters_from_proto(request.parameters))
        return pb.RepositoryModelUnloadResponse()

    # --- shared memory (core/shared_memory.py) -----------------------------------------------------

    @_rpc
    async def SystemSharedMemoryStatus(
        self, request: pb.SystemSharedMemoryStatusRequest, context: Context
    ) -> pb.SystemSharedMemoryStatusResponse:
        response = pb.SystemSharedMemoryStatusResponse()
        for region in self._plane.shared_memory.status(request.name):
            response.regions[region["name"]].CopyFrom(pb.SystemSharedMemoryStatusResponse.RegionStatus(**region))
        return response

    @_rpc
    async def SystemSharedMemoryRegister(
        self, request: pb.SystemSharedMemoryRegisterRequest, context: Context
    ) -> pb.SystemSharedMemoryRegisterResponse:
        self._plane.shared_memory.register(request.name, request.key, request.offset, request.byte_size)
        return pb.SystemSharedMemoryRegisterResponse()

    @_rpc
    async def SystemSharedMemoryUnregister(
        self, request: pb.SystemSharedMemoryUnregisterRequest, context: Context
    ) -> pb.SystemSharedMemoryUnregisterResponse:
        self._plane.shared_memory.unregister(request.name)
        return pb.SystemSharedMemoryUnregisterResponse()

    @_rpc
    async def CudaSharedMemoryStatus(
        self, request: pb.CudaSharedMemoryStatusRequest, context: Context
    ) -> pb.CudaSharedMemoryStatusResponse:
        response = pb.CudaSharedMemoryStatusResponse()
        for region in self._plane.shared_memory.cuda_status(request.name):
            response.regions[region["name"]].CopyFrom(pb.CudaSharedMemoryStatusResponse.RegionStatus(**region))
        return response

    @_rpc
    async def CudaSharedMemoryRegister(
        self, request: pb.CudaSharedMemoryRegisterRequest, context: Context
    ) -> pb.CudaSharedMemoryRegisterResponse:
        shm = self._plane.shared_memory
        shm.cuda_register(request.name, request.raw_handle, request.device_id, request.byte_size)
        return pb.CudaSharedMemoryRegisterResponse()

    @_rpc
    async def CudaSharedMemoryUnregister(
        self, request: pb.CudaSharedMemoryUnregisterRequest, context: Context
    ) -> pb.CudaSharedMemoryUnregisterResponse:
        self._plane.shared_memory.cuda_unregister(request.name)
        return pb.CudaSharedMemoryUnregisterResponse()

    # --- the trace and logging extensions ----------------------------------------------------------

    @_rpc
    async def TraceSetting(self, request: pb.TraceSettingRequest, context: Context) -> pb.TraceSettingResponse:
        # Triton's gRPC front end applies an update only when the request names some setting.
        settings = {name: list(value.value) for name, value in request.settings.items()}
        changes = tracing.changes_from_proto(settings) if settings else None
        response = pb.TraceSettingResponse()
        for name, value in self._plane.trace_settings(request.model_name, changes).items():
            response.settings[name].value.extend(value if isinstance(value, list) else [value])
        return response

    @_rpc
    async def LogSettings(self, request: pb.LogSettingsRequest, context: Context) -> pb.LogSettingsResponse:
        settings = {
            name: (value.WhichOneof("parameter_choice"), _choice(value)) for name, value in request.settings.items()
        }
        changes = log_settings.changes_from_proto(settings) if settings else None
        response = pb.LogSettingsResponse()
        for name, value in self._plane.log_settings(changes).items():
            setting = response.settings[name]
            if isinstance(value, bool):
                setting.bool_param = value
            elif isinstance(value, int):
                setting.uint32_param = value
            else:
                setting.string_param = value
        return response
