"""The load generator's side of the wire: one `InferClient` protocol, `make_client`, and its HTTP
adapter (keep-alive connections of `perfkit.wire.http_pool` for inference, aiohttp for the rest);
the gRPC adapter (`perfkit.wire.grpc.channel` for inference, grpc.aio for the rest) is
`perfkit.wire.grpc.client`'s.

`prepare()` encodes a request once (with `v2kit.codec` / `v2kit.grpc_proto`). `send()` is the hot path
and does as little as it can: it sends the pre-encoded bytes, reads the whole reply, checks its
framing without decoding tensors, and classifies every failure into a short kind for counting
("HTTP 503", "grpc UNAVAILABLE", "timeout", "connection refused", ...). It never raises, except
`asyncio.CancelledError`. Only the first `MESSAGES_PER_KIND` failures of a kind carry their text.

What `Outcome.send_ns` and `Outcome.recv_ns` cover (time.perf_counter_ns, client side only):

- HTTP. `send_ns`: from the call until the request bytes (request line, headers and body, encoded
  once in `prepare()`) are written to the transport: taking a pooled keep-alive connection, or
  opening one, and the write. `recv_ns`: from the reply's first bytes arriving to the body fully
  read and checked (status, JSON header parsed, binary sizes adding up), as perf_analyzer's libcurl
  client does; it includes the wait for the event loop to resume the request once the reply is in.
- gRPC. `send_ns`: from the call until its HEADERS and DATA frames (encoded once in `prepare()`)
  are handed to the transport: opening the HTTP/2 connection if there is none, a stream id, and
  the write; for a body larger than the server's windows, until its last DATA frame left.
  perf_analyzer's gRPC "send" is marshalling the request, which `prepare()` did once. `recv_ns`:
  parsing the reply's message as a ModelInferResponse (perf_analyzer's "unmarshal response"), once
  its frames are all in; like perf_analyzer's, it leaves out reading and de-framing the reply.
- gRPC streaming (`--streaming`, `perfkit.wire.grpc.streaming`): `send_ns` until the request's message
  is handed to the transport on its stream; `recv_ns` parsing every reply of the request; and
  `response_ns`, the arrival of each response that carried outputs, which the load generator
  turns into first-response latency, inter-response gaps and responses per request.

Neither includes the network or the server: those are the rest of the request's latency.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import ssl
import time
from collections.abc import Mapping
from typing import Any, Protocol

import aiohttp
import yarl
from multidict import CIMultiDict, CIMultiDictProxy

from perfkit.errors import MODEL_CONFIGURATION, MODEL_REPOSITORY, MissingExtension, PerfkitError, TargetError
from perfkit.target import TlsSpec, lists_extension
from perfkit.wire import http_pool as http_wire
from perfkit.wire.grpc.client import GrpcClient
from perfkit.wire.limits import LOAD_TIMEOUT_S, MAX_CONTROL_REPLY
from perfkit.wire.prepared import TEMPLATE_FIELDS, Prepared, SequenceTemplate, http_sequence_template
from perfkit.wire.replies import (
    MESSAGES_PER_KIND,
    VALIDATION_MISMATCH,
    FailureLog,
    Outcome,
    ReplyFraming,
    describe,
    http_failure_kind,
    http_outputs,
    note_once,
    output_mismatch,
)
from perfkit.wire.sniff import not_kserve_hint, sniff, wrong_port_hint
from v2kit import codec as v2

__all__ = [
    "MESSAGES_PER_KIND",
    "VALIDATION_MISMATCH",
    "Outcome",
    "InferClient",
    "HttpClient",
    "make_client",
    "output_mismatch",
]

_now = time.perf_counter_ns
#: The answers of a server without the route asked for: an extension it does not have.
_NO_ROUTE = frozenset((404, 405, 501))


class InferClient(Protocol):
    url: str
    protocol: str  # "http" | "grpc"

    def prepare(self, request: v2.InferRequest) -> Prepared: ...
    def prepare_sequence(self, request: v2.InferRequest) -> SequenceTemplate: ...
    async def send(self, prepared: Prepared) -> Outcome: ...
    async def live(self) -> bool: ...
    async def ready(self) -> bool: ...
    async def server_metadata(self) -> dict[str, Any]: ...
    async def model_metadata(self, model: str, version: str = "") -> dict[str, Any]: ...
    async def model_config(self, model: str, version: str = "") -> dict[str, Any]: ...
    async def model_statistics(self, model: str = "", version: str = "") -> dict[str, Any]: ...
    async def repository_index(self) -> list[dict[str, Any]]: ...
    async def load_model(self, name: str, config: dict[str, Any] | None = None) -> None: ...
    async def unload_model(self, name: str) -> None: ...
    async def register_system_shared_memory(self, name: str, key: str, byte_size: int) -> None: ...
    async def unregister_system_shared_memory(self, name: str) -> None: ...
    async def register_cuda_shared_memory(
        self, name: str, raw_handle: bytes, device_id: int, byte_size: int
    ) -> None: ...
    async def unregister_cuda_shared_memory(self, name: str) -> None: ...
    async def close(self) -> None: ...


def make_client(
    url: str,
    protocol: str,
    *,
    request_timeout_s: float = 30.0,
    headers: Mapping[str, str] = {},  # read only
    binary_outputs: bool = True,
    connections: int = 0,
    json_tensors: bool = False,
    tls: TlsSpec | None = None,
    streaming: bool = False,
    compression: str = "none",  # gRPC request messages: none, gzip or deflate
) -> InferClient:
    """A client for `url` over `protocol` ("http" or "grpc"). `connections` caps the HTTP connection
    pool (0: one per concurrent request); gRPC multiplexes every call on one channel. `json_tensors`
    sends HTTP inputs as JSON (`--input-tensor-format json`); `binary_outputs` asks HTTP for binary
    outputs (gRPC outputs are always raw). `headers` go with every call (HTTP headers, gRPC
    metadata), `Authorization` included. `tls`: HTTPS is an `https://` url, verified against
    `tls.https_ca_certs` (or the system's roots); gRPC uses TLS when `tls.grpc_use_ssl`.
    `streaming`: gRPC inference over `ModelStreamInfer` streams (`--streaming`); `compression`: its messages'."""
    tls = tls or TlsSpec()
    if request_timeout_s <= 0:
        raise PerfkitError(f"the request timeout must be > 0 seconds, got {request_timeout_s}")
    if connections < 0:
        raise PerfkitError(f"the connection count must be >= 0 (0: unlimited), got {connections}")
    if protocol == "http":
        if streaming:
            raise PerfkitError("--streaming is for -i grpc (Triton streams over gRPC's ModelStreamInfer); add -i grpc")
        return HttpClient(url, request_timeout_s, headers, (not json_tensors, binary_outputs), connections, tls)
    if protocol == "grpc":
        if json_tensors:
            raise PerfkitError("--input-tensor-format json is for HTTP only; use -i http or binary tensors")
        return GrpcClient(url, request_timeout_s, headers, tls, streaming=streaming, compression=compression)
    raise PerfkitError(f"-i must be http or grpc, got '{protocol}'")


# --- HTTP ------------------------------------------------------------------------------------------


async def _read_bounded(response: aiohttp.ClientResponse, what: str) -> bytes:
    """A control-plane answer's body, refused past MAX_CONTROL_REPLY (announced, or as it comes)."""
    too_large = TargetError(f"{what}: the answer is over {MAX_CONTROL_REPLY} bytes; is -u an inference server?")
    if (response.content_length or 0) > MAX_CONTROL_REPLY:
        raise too_large
    body = bytearray()
    async for chunk in response.content.iter_chunked(1 << 16):
        body += chunk
        if len(body) > MAX_CONTROL_REPLY:
            raise too_large
    return bytes(body)


class HttpClient:
    protocol = "http"

    def __init__(
        self,
        url: str,
        timeout_s: float,
        headers: Mapping[str, str],
        binary: tuple[bool, bool],
        connections: int,
        tls: TlsSpec | None = None,
    ) -> None:
        self.url = url
        self._base = yarl.URL(url if "://" in url else f"http://{url}")
        if self._base.scheme not in ("http", "https") or not self._base.host:
            raise PerfkitError(f"-u {url}: expected HOST:PORT or http(s)://HOST:PORT for -i http")
        https = (tls or TlsSpec()).https_context() if self._base.scheme == "https" else None
        self._ssl: ssl.SSLContext | bool = https or True
        self._wire_ssl = https
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._headers = dict(headers)
        self._binary = binary  # (inputs, outputs)
        self._connections = connections
        self._session: aiohttp.ClientSession | None = None  # control plane; opened in the event loop, on first use
        # Inference goes over lean keep-alive connections of its own (see perfkit.wire.http_pool).
        host, port = self._base.raw_host or "", self._base.port or 0
        self._wire = http_wire.ConnectionPool(host, port, ssl_context=https, limit=connections, timeout_s=timeout_s)
        authority = f"[{host}]" if ":" in host else host
        self._host_header = authority if self._base.is_default_port() else f"{authority}:{port}"
        self.failures = FailureLog()  # what the console says of failed requests
        self.framing = ReplyFraming()  # checks each reply's framing; parses a repeated head once

    @property
    def binary(self) -> tuple[bool, bool]:
        """Whether requests carry binary inputs and ask for binary outputs (else JSON in the body)."""
        return self._binary

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._connections, limit_per_host=0, ssl=self._ssl),
                timeout=self._timeout,
                headers=self._headers,  # every call, not only infer (Authorization)
                auto_decompress=False,
                # Triton compresses responses when asked to; perf_analyzer does not ask.
                skip_auto_headers=("Accept-Encoding",),
            )
        return self._session

    def _url(self, model: str, version: str, *tail: str) -> yarl.URL:
        url = self._base / "v2" / "models" / model
        return (url / "versions" / version if version else url).joinpath(*tail)

    def prepare(self, request: v2.InferRequest) -> Prepared:
        try:
            body, header_length = v2.encode_infer_request(request, *self._binary)
        except v2.CodecError as exc:
            raise PerfkitError(f"cannot encode a request for model '{request.model_name}': {exc}") from None
        content_type = "application/json" if header_length is None else "application/octet-stream"
        headers = CIMultiDict({"Host": self._host_header, "Content-Type": content_type})
        headers.update(self._headers)  # -H headers replace ours, whatever their case
        if header_length is not None:
            headers[v2.HEADER_LENGTH] = str(header_length)
        url = self._url(request.model_name, request.model_version, "infer")
        try:
            wire = http_wire.encode_request("POST", url.raw_path_qs, headers, body)
        except ValueError as refused:  # not `exc`: compiled, a name keeps the type of its first except
            raise PerfkitError(f"-H: {refused}; pass headers as 'Name: value' on one line") from None
        return Prepared(body, len(body), url, CIMultiDictProxy(headers), wire)

    def prepare_sequence(self, request: v2.InferRequest) -> SequenceTemplate:
        """`request` encoded once for any sequence id and flags (SequenceTemplate.make)."""
        parameters = {**request.parameters, **TEMPLATE_FIELDS}
        return http_sequence_template(self.prepare(dataclasses.replace(request, parameters=parameters)))

    async def send(self, prepared: Prepared) -> Outcome:
        assert prepared.wire, "prepared by a GrpcClient"
        start = _now()
        status, header_length, body, sent, first, failure = await self._wire.exchange(prepared.wire)
        if failure is not None:
            kind = http_failure_kind(failure)
            recv_ns = _now() - first if first else 0
            return Outcome(
                kind, 0, sent - start if sent else 0, recv_ns, note_once(self.failures, kind, describe(failure))
            )
        ok = status == 200 and self.framing.ok(body, header_length)
        if ok and prepared.expected is not None:
            try:
                problem = output_mismatch(prepared.expected, http_outputs(body, header_length))
            except v2.CodecError as exc:
                problem = f"the outputs cannot be decoded: {exc}"
            if problem:
                kind = VALIDATION_MISMATCH
                return Outcome(kind, len(body), sent - start, _now() - first, note_once(self.failures, kind, problem))
        done = _now()
        if ok:
            return Outcome("", len(body), sent - start, done - first)
        if status == 200:
            kind, message = "bad response", "the JSON header or the binary sizes of the infer response are malformed"
        else:  # decoded only while wanted
            kind = f"HTTP {status}"
            message = v2.decode_error(body) if self.failures.wanted(kind) else ""
        return Outcome(kind, len(body), sent - start, done - first, note_once(self.failures, kind, message))

    async def _call(self, method: str, url: yarl.URL, body: Any = None) -> tuple[int, bytes]:
        session = self._session or self._open()
        try:
            async with session.request(method, url, json=body, timeout=self._timeout) as response:
                return response.status, await _read_bounded(response, f"{method} {url}")
        except asyncio.TimeoutError:
            raise TargetError(f"{method} {url}: no answer within {self._timeout.total} s") from None
        except aiohttp.ClientError as exc:
            raise await self._unreachable(exc) from None

    async def _unreachable(self, exc: aiohttp.ClientError) -> TargetError:
        """Why a control-plane call failed; when the port answered in another protocol, which."""
        if not isinstance(exc, aiohttp.ClientConnectorError):  # it answered, but how? (a gRPC port?)
            hint = wrong_port_hint(await sniff(self._base.raw_host or "", self._base.port or 0, self._wire_ssl), "http")
            if hint:
                return TargetError(f"-u {self.url}: {hint}")
        return TargetError(f"cannot reach {self._base} over HTTP ({describe(exc)}); is -u right?")

    async def _json(self, method: str, url: yarl.URL, body: Any = None) -> Any:
        status, data = await self._call(method, url, body)
        return self._decoded(method, url, status, data)

    @staticmethod
    def _decoded(method: str, url: yarl.URL, status: int, data: bytes) -> Any:
        if status != 200:
            raise TargetError(f"{method} {url}: HTTP {status}: {v2.decode_error(data)}")
        try:
            return json.loads(data)
        except ValueError:
            raise TargetError(f"{method} {url}: the response is not JSON: {data[:200]!r}") from None

    async def live(self) -> bool:
        status = (await self._call("GET", self._base / "v2" / "health" / "live"))[0]
        if status == 404:  # every KServe v2 server has this route: not one (the metrics port?)
            raise TargetError(f"-u {self.url} {not_kserve_hint()}")
        return status == 200

    async def ready(self) -> bool:
        return (await self._call("GET", self._base / "v2" / "health" / "ready"))[0] == 200

    async def server_metadata(self) -> dict[str, Any]:
        return await self._json("GET", self._base / "v2")  # type: ignore[no-any-return]

    async def model_metadata(self, model: str, version: str = "") -> dict[str, Any]:
        return await self._json("GET", self._url(model, version))  # type: ignore[no-any-return]

    async def model_config(self, model: str, version: str = "") -> dict[str, Any]:
        """The model's configuration; MissingExtension where the server has no such route (404:
        Triton's model configuration extension, which MLServer and KServe lack)."""
        url = self._url(model, version, "config")
        status, data = await self._call("GET", url)
        if status in _NO_ROUTE and not await self._lists_extension(MODEL_CONFIGURATION):
            raise MissingExtension(f"GET {url}: HTTP {status}: {v2.decode_error(data)}", MODEL_CONFIGURATION)
        return self._decoded("GET", url, status, data)  # type: ignore[no-any-return]

    async def _lists_extension(self, extension: str) -> bool:
        """Whether the server metadata lists `extension`. Triton answers 404 for a model it has not
        loaded, on a route it has: only a server without the extension lacks the route."""
        try:
            metadata = await self.server_metadata()
        except TargetError:
            return False
        return isinstance(metadata, dict) and bool(lists_extension(metadata, extension))

    async def model_statistics(self, model: str = "", version: str = "") -> dict[str, Any]:
        url = self._url(model, version, "stats") if model else self._base / "v2" / "models" / "stats"
        return await self._json("GET", url)  # type: ignore[no-any-return]

    async def repository_index(self) -> list[dict[str, Any]]:
        """The models the server knows, Triton's repository index. Where it has none (KServe: 404),
        the names `GET /v2/models` lists, each with its state by its ready route."""
        url = self._base / "v2" / "repository" / "index"
        status, data = await self._call("POST", url, {})
        if status not in _NO_ROUTE:
            return self._decoded("POST", url, status, data)  # type: ignore[no-any-return]
        listed = self._base / "v2" / "models"
        status, data = await self._call("GET", listed)
        if status in _NO_ROUTE:
            raise MissingExtension(f"POST {url} and GET {listed}: HTTP {status}", MODEL_REPOSITORY)
        names = self._decoded("GET", listed, status, data)
        names = names.get("models") if isinstance(names, dict) else None
        if not isinstance(names, list):
            raise TargetError(f'GET {listed}: expected {{"models": [name, ...]}}, got {data[:200]!r}')
        ready = [(await self._call("GET", self._url(str(n), "", "ready")))[0] == 200 for n in names]
        return [{"name": str(n), "state": "READY" if r else "UNAVAILABLE"} for n, r in zip(names, ready)]

    async def load_model(self, name: str, config: dict[str, Any] | None = None) -> None:
        """Load (or reload) `name` through the repository API; `config` overrides its config.pbtxt.
        Raises TargetError with the server's reason when it refuses."""
        body = {"parameters": {"config": json.dumps(config)}} if config is not None else {}
        await self._repository("load", name, body)

    async def unload_model(self, name: str) -> None:
        await self._repository("unload", name, {})

    async def register_system_shared_memory(self, name: str, key: str, byte_size: int) -> None:
        await self._shared_memory(name, "register", {"key": key, "offset": 0, "byte_size": byte_size})

    async def unregister_system_shared_memory(self, name: str) -> None:
        await self._shared_memory(name, "unregister")

    async def register_cuda_shared_memory(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        body = {"raw_handle": {"b64": base64.b64encode(raw_handle).decode()}, "device_id": device_id}
        await self._shared_memory(name, "register", {**body, "byte_size": byte_size}, "cudasharedmemory")

    async def unregister_cuda_shared_memory(self, name: str) -> None:
        await self._shared_memory(name, "unregister", None, "cudasharedmemory")

    async def _shared_memory(self, name: str, action: str, body: Any = None, kind: str = "systemsharedmemory") -> None:
        url = self._base / "v2" / kind / "region" / name / action
        status, data = await self._call("POST", url, body)  # Triton answers 200 with an empty body
        if status != 200:
            raise TargetError(f"POST {url}: HTTP {status}: {v2.decode_error(data)}")

    async def _repository(self, action: str, name: str, body: dict[str, Any]) -> None:
        session = self._session or self._open()
        url = self._base / "v2" / "repository" / "models" / name / action
        try:
            # A load builds sessions and instances: it may take far longer than an inference.
            async with session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=LOAD_TIMEOUT_S)) as response:
                status, data = response.status, await response.read()
        except asyncio.TimeoutError:
            raise TargetError(f"{action} of model '{name}': no answer within {LOAD_TIMEOUT_S} s") from None
        except aiohttp.ClientError as exc:
            raise await self._unreachable(exc) from None
        if status != 200:
            raise TargetError(f"{action} of model '{name}' failed: HTTP {status}: {v2.decode_error(data)}")

    async def close(self) -> None:
        await self._wire.close()
        session, self._session = self._session, None
        if session is not None:
            await session.close()
