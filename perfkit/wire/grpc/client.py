"""The gRPC adapter of `perfkit.wire.client.InferClient` (made by `client.make_client` for -i grpc).

Inference goes over the lean HTTP/2 channel (`perfkit.wire.grpc.channel`), or with `--streaming`
over `ModelStreamInfer` streams on the same kind of connection (`perfkit.wire.grpc.streaming`).
Everything else (health, metadata, config, statistics, the repository, shared-memory registration)
goes over grpc.aio, opened on first use, its answers bounded (`perfkit.wire.limits`).

`send()` never raises (except `asyncio.CancelledError`): it classifies every failure into a short
kind as the HTTP adapter does (`perfkit.wire.replies`); what its `Outcome.send_ns` and `recv_ns`
cover is in `perfkit.wire.client`'s docstring. A control-plane call that fails raises TargetError,
naming the protocol the port speaks when it is not gRPC (`perfkit.wire.sniff`).
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import Mapping
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from perfkit.errors import MODEL_CONFIGURATION, MODEL_REPOSITORY, MissingExtension, PerfkitError, TargetError
from perfkit.target import TlsSpec
from perfkit.wire.grpc import channel as grpc_wire
from perfkit.wire.grpc.streaming import EMPTY_FINAL, StreamChannel, encode_stream_headers
from perfkit.wire.limits import LOAD_TIMEOUT_S, MAX_CONTROL_REPLY
from perfkit.wire.prepared import Prepared, SequenceTemplate, grpc_sequence_payload
from perfkit.wire.replies import (
    VALIDATION_MISMATCH,
    FailureLog,
    Outcome,
    describe,
    grpc_failure_kind,
    note_once,
    output_mismatch,
)
from perfkit.wire.sniff import sniff, wrong_port_hint
from v2kit import codec as v2
from v2kit.grpc_proto import message_to_json, request_to_proto, response_from_proto

__all__ = ["GrpcClient"]

_now = time.perf_counter_ns
_MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
_STATUS_CODES = {code.value[0]: code for code in grpc.StatusCode}


def _host_port(target: str) -> tuple[str, int | None]:
    """("host", port) from "host:port" or "[v6 address]:port"; port None when absent or not a number."""
    host, _, port = target.rpartition(":")
    if not port.isdigit() or not 0 < int(port) < 65536:
        return target, None
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host, int(port)


def _raw_outputs(response: Any) -> dict[str, bytes]:
    """A ModelInferResponse's outputs as raw bytes: from raw_output_contents, or from the typed
    contents fields where the server answers in them (KServe's python server)."""
    if response.raw_output_contents or not response.outputs:
        return {o.name: raw for o, raw in zip(response.outputs, response.raw_output_contents)}
    try:
        return {t.name: v2.tensor_to_raw(t.data, t.datatype, t.name) for t in response_from_proto(response).outputs}
    except v2.CodecError:  # the mismatch says what is missing
        return {}


def _after_responses(responses: tuple[int, ...], message: str) -> str:
    """A streamed request's failure text, led by the responses it got first, if any."""
    if not responses:
        return message
    return f"{len(responses)} response{'' if len(responses) == 1 else 's'}, then {message}"


class GrpcClient:
    protocol = "grpc"

    def __init__(  # `streaming`: inference over ModelStreamInfer streams (perfkit.wire.grpc.streaming)
        self, url: str, request_timeout_s: float, headers: Mapping[str, str], tls: TlsSpec | None = None, *,
        streaming: bool = False, compression: str = "none",
    ) -> None:  # fmt: skip
        self.url = url
        self._target = url.split("://", 1)[1] if "://" in url else url
        host, port = _host_port(self._target)
        if not host or port is None:
            raise PerfkitError(f"-u {url}: expected HOST:PORT for -i grpc")
        tls = tls or TlsSpec()
        self._credentials: grpc.ChannelCredentials | None = None
        context: ssl.SSLContext | None = None
        if tls.grpc_use_ssl:
            roots = tls.grpc_root_certificates()
            self._credentials = grpc.ssl_channel_credentials(roots, *tls.grpc_client_certificate())  # (key, chain)
            context = tls.grpc_context(roots)
        self._timeout_s = request_timeout_s
        # -H headers travel as call metadata, whose keys gRPC wants in lower case.
        self._metadata = tuple((k.lower(), v) for k, v in headers.items()) or None
        self._wire = grpc_wire.Channel(host, port, context, compression=compression)  # inference
        self._address = (host, port, context)  # to sniff what the port speaks when a call fails
        self._streams = StreamChannel(host, port, context) if streaming else None  # inference, --streaming
        stream_metadata = (*(self._metadata or ()), *self._wire.coding)  # its messages are compressed as calls' are
        self._stream_block = encode_stream_headers(self._wire.target, context is not None, stream_metadata)
        self._channel: grpc.aio.Channel | None = None  # the rest; opened in the event loop, on first use
        self._stub: Any = None
        self.failures = FailureLog()  # what the console says of failed requests

    def _open(self) -> Any:
        if self._channel is None:
            # Control-plane answers only (inference goes over the lean channel): bounded, see perfkit.wire.limits.
            options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", MAX_CONTROL_REPLY)]
            if self._credentials is None:
                self._channel = grpc.aio.insecure_channel(self._target, options=options)
            else:
                self._channel = grpc.aio.secure_channel(self._target, self._credentials, options=options)
            self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)
        return self._stub

    def prepare(self, request: v2.InferRequest) -> Prepared:
        try:
            proto = request_to_proto(request)
        except v2.CodecError as exc:
            raise PerfkitError(f"cannot encode a request for model '{request.model_name}': {exc}") from None
        if self._streams is not None:
            # As perf_analyzer asks: the final flag always comes, alone if the model sends it so.
            proto.parameters[EMPTY_FINAL].bool_param = True
            payload = proto.SerializeToString()
            return Prepared(payload, len(payload), stream_message=self._wire.stream_message(payload))
        payload = proto.SerializeToString()
        call = self._wire.encode(_MODEL_INFER, payload, self._metadata or (), self._timeout_s)
        return Prepared(payload, len(payload), grpc_call=call)

    def prepare_sequence(self, request: v2.InferRequest) -> SequenceTemplate:
        """`request` encoded once for any sequence id and flags (SequenceTemplate.make)."""
        try:
            message = request_to_proto(request).SerializeToString()
        except v2.CodecError as exc:
            raise PerfkitError(f"cannot encode a request for model '{request.model_name}': {exc}") from None
        if self._wire.coding:  # the sequence id is written into the encoded message, call by call
            raise PerfkitError("--grpc-compression-algorithm is not for sequence models; drop it")
        payload, offsets = grpc_sequence_payload(message)
        call = self._wire.encode(_MODEL_INFER, payload, self._metadata or (), self._timeout_s)
        at_id, at_start, at_end = (5 + o for o in offsets)  # past the gRPC message prefix
        prepared = Prepared(payload, len(payload), grpc_call=call)
        return SequenceTemplate(prepared, call.body, (at_id, at_start, at_end), grpc=True)

    async def send(self, prepared: Prepared) -> Outcome:
        if self._streams is not None:
            return await self._send_streamed(prepared)
        assert prepared.grpc_call is not None, "prepared by an HttpClient"
        start = _now()
        try:
            call = await self._wire.call(prepared.grpc_call)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # send() classifies every failure
            return Outcome("client error", 0, 0, 0, note_once(self.failures, "client error", describe(exc)))
        sent = call.sent_ns - start if call.sent_ns else 0
        if call.status:
            if call.status == grpc_wire.MALFORMED:
                kind = "bad response"
            else:
                kind = grpc_failure_kind(_STATUS_CODES.get(call.status, grpc.StatusCode.UNKNOWN), call.details)
            return Outcome(kind, 0, sent, 0, note_once(self.failures, kind, call.details))
        reply = call.message
        received = _now()
        try:
            response = pb.ModelInferResponse.FromString(reply)
            ok = len(response.raw_output_contents) in (0, len(response.outputs))
            problem = "" if ok else "raw_output_contents does not match the outputs"
        except DecodeError as exc:
            problem = f"the reply is not a ModelInferResponse: {exc}"
        done = _now()
        if problem:
            message = note_once(self.failures, "bad response", problem)
            return Outcome("bad response", len(reply), sent, done - received, message)
        if prepared.expected is not None:
            mismatch = output_mismatch(prepared.expected, _raw_outputs(response))
            if mismatch:
                message = note_once(self.failures, VALIDATION_MISMATCH, mismatch)
                return Outcome(VALIDATION_MISMATCH, len(reply), sent, _now() - received, message)
        return Outcome("", len(reply), sent, done - received)

    async def _send_streamed(self, prepared: Prepared) -> Outcome:
        assert self._streams is not None and prepared.stream_message, "prepared without --streaming"
        start = _now()
        try:
            done = await self._streams.exchange(self._stream_block, prepared.stream_message, self._timeout_s)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # send() classifies every failure
            return Outcome("client error", 0, 0, 0, note_once(self.failures, "client error", describe(exc)))
        sent = done.sent_ns - start if done.sent_ns else 0
        responses = tuple(done.response_ns)
        code, message = done.status, done.details
        if code == grpc_wire.MALFORMED:
            kind = "bad response"
        elif code == grpc.StatusCode.DEADLINE_EXCEEDED.value[0] and responses:
            kind, message = "no final response", _after_responses(responses, message)
        elif code:
            kind = grpc_failure_kind(_STATUS_CODES.get(code, grpc.StatusCode.UNKNOWN), message)
        elif done.error_response:
            # A decoupled request that failed partway (its stub died after its first responses) is
            # one error, and its text says what came before it.
            kind, message = "error response", _after_responses(responses, done.error_response)
        else:
            return Outcome("", done.bytes_in, sent, done.parse_ns, response_ns=responses)
        note = note_once(self.failures, kind, message)
        return Outcome(kind, done.bytes_in, sent, done.parse_ns, note, response_ns=responses)

    async def _rpc(self, method: str, request: Any, timeout_s: float | None = None, extension: str = "") -> Any:
        """The call's answer; a TargetError saying why it failed, MissingExtension where the server
        does not implement `extension`'s method."""
        if self._stub is None:
            self._open()
        try:
            timeout = self._timeout_s if timeout_s is None else timeout_s
            return await getattr(self._stub, method)(request, timeout=timeout, metadata=self._metadata)
        except grpc.aio.AioRpcError as exc:
            code, details = exc.code(), exc.details() or ""
            if grpc_failure_kind(code, details) in ("connection refused", "connection reset"):
                raise TargetError(f"cannot reach {self._target} over gRPC ({details}); is -u right?") from None
            hint = wrong_port_hint(await sniff(*self._address), "grpc") if code == grpc.StatusCode.UNAVAILABLE else None
            if hint:
                raise TargetError(f"-u {self.url}: {hint}") from None
            message = f"gRPC {method} at {self._target}: {code.name}: {details}"
            if extension and code == grpc.StatusCode.UNIMPLEMENTED:
                raise MissingExtension(message, extension) from None
            raise TargetError(message) from None

    async def live(self) -> bool:
        return bool((await self._rpc("ServerLive", pb.ServerLiveRequest())).live)

    async def ready(self) -> bool:
        return bool((await self._rpc("ServerReady", pb.ServerReadyRequest())).ready)

    async def server_metadata(self) -> dict[str, Any]:
        return message_to_json(await self._rpc("ServerMetadata", pb.ServerMetadataRequest()))

    async def model_metadata(self, model: str, version: str = "") -> dict[str, Any]:
        return message_to_json(await self._rpc("ModelMetadata", pb.ModelMetadataRequest(name=model, version=version)))

    async def model_config(self, model: str, version: str = "") -> dict[str, Any]:
        request = pb.ModelConfigRequest(name=model, version=version)
        reply = await self._rpc("ModelConfig", request, extension=MODEL_CONFIGURATION)  # MLServer, KServe: none
        return message_to_json(reply.config)

    async def model_statistics(self, model: str = "", version: str = "") -> dict[str, Any]:
        request = pb.ModelStatisticsRequest(name=model, version=version)
        return message_to_json(await self._rpc("ModelStatistics", request))

    async def load_model(self, name: str, config: dict[str, Any] | None = None) -> None:
        """Load (or reload) `name` through the repository API; `config` overrides its config.pbtxt.
        Raises TargetError with the server's reason when it refuses."""
        request = pb.RepositoryModelLoadRequest(model_name=name)
        if config is not None:
            request.parameters["config"].string_param = json.dumps(config)
        await self._rpc("RepositoryModelLoad", request, LOAD_TIMEOUT_S)

    async def unload_model(self, name: str) -> None:
        await self._rpc("RepositoryModelUnload", pb.RepositoryModelUnloadRequest(model_name=name))

    async def register_system_shared_memory(self, name: str, key: str, byte_size: int) -> None:
        request = pb.SystemSharedMemoryRegisterRequest(name=name, key=key, offset=0, byte_size=byte_size)
        await self._rpc("SystemSharedMemoryRegister", request)

    async def unregister_system_shared_memory(self, name: str) -> None:
        await self._rpc("SystemSharedMemoryUnregister", pb.SystemSharedMemoryUnregisterRequest(name=name))

    async def register_cuda_shared_memory(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        fields = {"name": name, "raw_handle": raw_handle, "device_id": device_id, "byte_size": byte_size}
        await self._rpc("CudaSharedMemoryRegister", pb.CudaSharedMemoryRegisterRequest(**fields))

    async def unregister_cuda_shared_memory(self, name: str) -> None:
        await self._rpc("CudaSharedMemoryUnregister", pb.CudaSharedMemoryUnregisterRequest(name=name))

    async def repository_index(self) -> list[dict[str, Any]]:
        reply = await self._rpc("RepositoryIndex", pb.RepositoryIndexRequest(), extension=MODEL_REPOSITORY)
        # proto3 has no absent strings. Triton 2.51's HTTP index leaves out every empty field (a
        # model known only by name is {"name"}, a READY one has no reason): rebuild that shape.
        models = [{k: v for k, v in message_to_json(m).items() if v != ""} for m in reply.models]
        for model in models:  # MLServer writes its state enum's str(): "State.READY"
            if isinstance(model.get("state"), str):
                model["state"] = model["state"].removeprefix("State.")
        return models

    async def close(self) -> None:
        channel, self._channel, self._stub = self._channel, None, None
        await self._wire.close()
        if self._streams is not None:
            await self._streams.close()
        if channel is not None:
            await channel.close()
