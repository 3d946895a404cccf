"""KServe v2 over HTTP/REST: route, decode, call the data plane, encode. No business logic here.

`RestApi` is the handler of `http_server.HttpServer`, which owns the transport, the size limit,
the body timeout, admission and the read gate. It answers through the request's `Reply`: at once
where the data plane answers at once, from the scheduler's callback for an inference (no task, no
loop pass: `DataPlane.start_infer`), and from a task for what awaits (generate, the repository).
Paths under `/v1` go to the OpenAI-compatible routes (`openai/`), after the same token check.
Routing compares the path's percent-decoded segments with the protocol's routes; a decoded segment
that holds a '/' (`%2F`) stays one segment, so it can never reach another route, and a model name
is only ever one segment.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
from collections.abc import Callable, Coroutine
from functools import partial
from typing import Any
from urllib.parse import unquote

from reference_server.core import log_settings, tracing
from reference_server.core.load_overrides import FILE_PREFIX
from reference_server.errors import InternalError, InvalidArgument, server_error
from reference_server.frontends.auth import OPEN_HTTP_PATHS, Token, Unauthenticated
from reference_server.frontends.forwarding import HeaderForwarding
from reference_server.frontends.http.encoding import ContentCodings
from reference_server.frontends.http.generate import generate
from reference_server.frontends.http.limits import DEFAULT_LIMITS, HttpLimits
from reference_server.frontends.http.messages import Reply, internal_error, reply_when_done
from reference_server.frontends.http.openai import OpenAiApi, OpenAiError, openai_error
from reference_server.frontends.http.read_gate import ReadGate
from reference_server.frontends.http.server import HttpRequest, HttpResponse, HttpServer, error_response
from reference_server.frontends.plane import Plane
from reference_server.frontends.restricted import Restrictions
from v2kit import codec as v2

__all__ = ["RestApi", "build_rest_server", "is_infer"]

log = logging.getLogger(__name__)

_HEADER_LENGTH_KEY = v2.HEADER_LENGTH.lower()
_JSON = "application/json"
_OCTETS = "application/octet-stream"
_CHALLENGE = (("WWW-Authenticate", 'Bearer realm="perfkit-reference-server"'),)

#: A handler's arguments: the API, the request, the model name, the version ('' for none) and
#: where its answer goes.
RouteHandler = Callable[["RestApi", HttpRequest, str, str, Reply], None]


def is_infer(method: bytes, url: bytes) -> bool:
    """Whether a request, by its method and raw URL, is an inference request (takes a slot)."""
    return method == b"POST" and url.split(b"?", 1)[0].endswith(b"/infer")


def _refusal(exc: Exception) -> HttpResponse:
    error = server_error(exc)
    if error is not None:
        return error_response(error.message, error.http_status)
    log.error("admission failed: %s: %s", type(exc).__name__, exc)
    return error_response(f"internal error: {type(exc).__name__}: {exc}", 500)


class RestApi:
    """The KServe v2 REST routes over a DataPlane, with optional bearer-token authentication."""

    def __init__(
        self,
        plane: Plane,
        token: Token | None = None,
        header_forward: HeaderForwarding | None = None,
        restricted: Restrictions | None = None,
    ) -> None:
        self.plane = plane
        self.token = token
        self.header_forward = header_forward  # --http-header-forward-pattern
        self.restricted = restricted  # --http-restricted-api
        self._openai: OpenAiApi | None = None  # made on the first /v1 request

    def respond(self, request: HttpRequest, reply: Reply) -> None:
        """Every error `errors.server_error` knows leaves as a KServe error JSON with its status; a bug
        as a 500, logged."""
        try:
            self._route(request, reply)
        except Exception as exc:
            reply(self._failure(exc, request))

    def _failure(self, exc: Exception, request: HttpRequest) -> HttpResponse:
        if isinstance(exc, Unauthenticated):
            return HttpResponse(exc.http_status, v2.error_body(exc.message), _JSON, _CHALLENGE)
        error = server_error(exc)
        if error is None:
            return internal_error(exc, f"{request.method} {request.path}")
        return error_response(error.message, error.http_status)

    def _later(self, answer: Coroutine[Any, Any, HttpResponse], request: HttpRequest, reply: Reply) -> None:
        reply_when_done(answer, reply, lambda exc: self._failure(exc, request))

    def _route(self, request: HttpRequest, reply: Reply) -> None:
        path = request.path
        route = _ROUTED.get(path)
        if route is None:
            route = self._route_new(path, request, reply)
            if route is None:
                return
        endpoint, methods, model, version = route
        # The matched route, not the path's spelling, decides: no spelling of a path (%2F, '..')
        # reaches a protected handler through an open name. Unmatched paths want the token too.
        if self.token is not None and not (endpoint is not None and path in OPEN_HTTP_PATHS):
            self.token.check(request.headers.get("authorization"))
        if endpoint is None:
            reply(error_response(f"Not Found: {request.method} {path}", 404))
            return
        if self.restricted is not None:  # before the method, as tritonserver checks it
            refused = self.restricted.refusal(endpoint.__name__, request.headers)
            if refused is not None:
                reply(error_response(refused, 403))
                return
        # HEAD is GET without the body (RFC 9110 §9.3.2), which the transport leaves out.
        if request.method not in methods and not (request.method == "HEAD" and "GET" in methods):
            response = error_response(f"Method Not Allowed: {request.method} {path}", 405)
            response.headers = (("Allow", _ALLOW[methods]),)  # RFC 9110 §15.5.6
            reply(response)
            return
        endpoint(self, request, model, version, reply)

    def _route_new(
        self, path: str, request: HttpRequest, reply: Reply
    ) -> tuple[RouteHandler | None, frozenset[str], str, str] | None:
        """The route of a path not seen yet, kept in `_ROUTED`; or None where the OpenAI routes
        answered it (they route on the segments themselves)."""
        segments = [unquote(s, errors="surrogateescape") if "%" in s else s for s in path.split("/")]
        if len(segments) >= 2 and not segments[0] and segments[1] == "v1":  # the OpenAI-compatible routes
            if self.token is not None:
                try:
                    self.token.check(request.headers.get("authorization"))
                except Unauthenticated as exc:
                    answer = openai_error(OpenAiError(exc.message, exc.http_status, code="invalid_api_key"))
                    answer.headers = _CHALLENGE
                    reply(answer)
                    return None
            if self._openai is None:
                self._openai = OpenAiApi(self.plane, self.plane.server_metadata()["name"])
            self._openai.respond(request, segments[2:], reply)
            return None
        route = _match(segments)
        if len(_ROUTED) >= _ROUTED_MAX:
            _ROUTED.clear()
        _ROUTED[path] = route
        return route

    # -- endpoints

    def health_live(self, request: HttpRequest, model: str, version: str, reply: Reply) -> None:
        reply(_status(self.plane.live()))

    def health_ready(self, request: HttpRequest, model: str, version: str, reply: Reply) -> None:
        reply(_status(self.plane.ready()))

    def server_metadata(self, request: HttpRequest, model: str, version: str, reply: Reply) -> None:
        reply(_json(self.plane.server_metadata()))

    def model_metadata(self, request: HttpRequest, model: str, version: str, reply: Reply) -> None:
        reply(_json(self.plane.model_metadata(model, version)))

    def model_ready(self, request: HttpRequest, model: str, version: str, reply: Reply) -> None:
        if self.plane.model_ready(model, version):
            reply(HttpResponse(200))
        else:  # Triton's answer, with its body
            reply(HttpResponse(400, b'{"error":"Model version not ready"}', _JSON))

    def model_config(self, request: HttpRequest, model: str, version: str, reply: Reply) -> None:
        reply(_json(self.plane.model_config(model, version)))

    def model_stats(self, request: HttpRequest, model: str, version: str, reply: Reply) -> None:
        reply(_json(self.plane.statistics(model, version)))

    def infer(self, request: HttpRequest, model: str, version: str, reply: Reply) -> None:
        plane = self.plane
        raw_length = request.headers.get(_HEADER_LENGTH_KEY)
        if raw_length is None:
            header_length = None
        else:
            try:
                header_length = int(raw_length)
            except ValueError:
                raise InvalidArgument(f"{v2.HEADER_LENGTH} must be an integer, got '{raw_length}'") from None
        if header_length == 0:
            infer_request = plane.decode_raw_request(model, version, request.body)
        else:
            infer_request = v2.decode_infer_request(request.body, header_length, model, version)
        if self.header_forward is not None:
            lines = ((name.decode("latin-1"), value.decode("latin-1")) for name, value in request.raw_headers)
            self.header_forward.apply(lines, infer_request.parameters)
        # A partial, not a closure: compiled, a closure and its environment hold each other, and
        # every request would leave a reference cycle for the garbage collector (docs/compiled.md).
        plane.start_infer(infer_request, partial(self._answered, infer_request, request, reply))

    def _answered(
        self, infer_request: v2.InferRequest, request: HttpRequest, reply: Reply, response: v2.InferResponse | Exception
    ) -> None:
        # Called by the scheduler when the batch is done: the answer is encoded and written now.
        try:
            if isinstance(response, Exception):
                raise response
            payload, json_length = v2.encode_infer_response(response, infer_request)
        except Exception as exc:
            reply(self._failure(exc, request))
            return
        if json_length is None:
            reply(HttpResponse(200, payload, _JSON))
        else:
            reply(HttpResponse(200, payload, _OCTETS, ((v2.HEADER_LENGTH, str(json_length)),)))

    def generate(self, request: HttpRequest, model: str, version: str, reply: Reply) -> None:
        self._later(generate(self.plane, request, model, version, stream=False), request, reply)

    def generate_stream(self, request: HttpRequest, model: str, version: str, reply: Reply) -> None:
        self._later(generate(self.plane, request, model, version, stream=True), request, reply)

    def repository_index(self, request: HttpRequest, model: str, version: str, reply: Reply) -> None:
        ready = _json_object(request.body).get("ready", False)
        if not isinstance(ready, bool):
            raise InvalidArgument("repository index field 'ready' must be a boolean")
        reply(_json(self.plane.repository_index(ready)))

    def repository_load(self, request: HttpRequest, model: str, version: str, reply: Reply) -> None:
        self._later(self._load(model, _load_parameters(request.body)), request, reply)

    def repository_unload(self, request: HttpRequest, model: str, version: str, reply: Reply) -> None:
        self._later(self._unload(model, _parameters(request.body)), request, reply)

    async def _load(self, model: str, parameters: dict[str, Any]) -> HttpResponse:
        await self.plane.load_model(model, parameters)
        return HttpResponse(200)

    async def _unload(self, model: str, parameters: dict[str, Any]) -> HttpResponse:
        await self.plane.unload_model(model, parameters)
        return HttpResponse(200)

    # The shared memory extensions: `model` is the region's name ('' for all of them).

    def system_shm_status(self, request: HttpRequest, region: str, version: str, reply: Reply) -> None:
        reply(_json(self.plane.shared_memory.status(region)))

    def system_shm_register(self, request: HttpRequest, region: str, version: str, reply: Reply) -> None:
        body = _json_object(request.body)
        key, byte_size = _field(body, "key", str), _field(body, "byte_size", int)
        offset = _field(body, "offset", int, 0)
        self.plane.shared_memory.register(region, key, offset, byte_size)
        reply(HttpResponse(200))

    def system_shm_unregister(self, request: HttpRequest, region: str, version: str, reply: Reply) -> None:
        self.plane.shared_memory.unregister(region)
        reply(HttpResponse(200))

    def cuda_shm_status(self, request: HttpRequest, region: str, version: str, reply: Reply) -> None:
        reply(_json(self.plane.shared_memory.cuda_status(region)))

    def cuda_shm_register(self, request: HttpRequest, region: str, version: str, reply: Reply) -> None:
        body = _json_object(request.body)
        raw_handle, device_id = _field(body, "raw_handle", dict), _field(body, "device_id", int, 0)
        byte_size = _field(body, "byte_size", int)
        b64 = raw_handle.get("b64")
        try:
            handle = base64.b64decode(b64, validate=True) if isinstance(b64, str) else None
        except binascii.Error:
            handle = None
        if handle is None:
            raise InvalidArgument(
                f"failed to register CUDA shared memory region: '{region}': 'raw_handle' must be a valid base64 "
                'encoded cudaIpcMemHandle_t, as {"b64": "..."}'
            )
        self.plane.shared_memory.cuda_register(region, handle, device_id, byte_size)
        reply(HttpResponse(200))

    def cuda_shm_unregister(self, request: HttpRequest, region: str, version: str, reply: Reply) -> None:
        self.plane.shared_memory.cuda_unregister(region)
        reply(HttpResponse(200))

    # The trace and logging extensions: a POST's body is read as Triton's HTTP front end reads it.

    def trace_setting(self, request: HttpRequest, model: str, version: str, reply: Reply) -> None:
        if version:  # Triton routes no version here
            reply(error_response("Not Found", 404))
            return
        changes = tracing.changes_from_json(_settings_body(request)) if request.method == "POST" else None
        reply(_json(self.plane.trace_settings(model, changes)))

    def logging(self, request: HttpRequest, model: str, version: str, reply: Reply) -> None:
        changes = log_settings.changes_from_json(_settings_body(request)) if request.method == "POST" else None
        reply(_json(self.plane.log_settings(changes)))


_GET = frozenset({"GET"})
_POST = frozenset({"POST"})
_GET_POST = frozenset({"GET", "POST"})
_ALLOW = {_GET: "GET, HEAD", _POST: "POST", _GET_POST: "GET, HEAD, POST"}
_NO_ROUTE: tuple[RouteHandler | None, frozenset[str], str, str] = (None, frozenset(), "", "")

#: Routes by their fixed segments after '/v2'.
_FIXED: dict[tuple[str, ...], tuple[RouteHandler, frozenset[str]]] = {
    (): (RestApi.server_metadata, _GET),
    ("health", "live"): (RestApi.health_live, _GET),
    ("health", "ready"): (RestApi.health_ready, _GET),
    ("models", "stats"): (RestApi.model_stats, _GET),
    ("repository", "index"): (RestApi.repository_index, _POST),
    ("systemsharedmemory", "status"): (RestApi.system_shm_status, _GET),
    ("systemsharedmemory", "register"): (RestApi.system_shm_register, _POST),  # no name: Triton's 400
    ("systemsharedmemory", "unregister"): (RestApi.system_shm_unregister, _POST),
    ("cudasharedmemory", "status"): (RestApi.cuda_shm_status, _GET),
    ("cudasharedmemory", "register"): (RestApi.cuda_shm_register, _POST),
    ("cudasharedmemory", "unregister"): (RestApi.cuda_shm_unregister, _POST),
    ("trace", "setting"): (RestApi.trace_setting, _GET_POST),
    ("logging",): (RestApi.logging, _GET_POST),
}
#: Routes by what follows '/v2/{systemsharedmemory|cudasharedmemory}/region/{name}'.
_REGION: dict[tuple[str, str], tuple[RouteHandler, frozenset[str]]] = {
    ("systemsharedmemory", "status"): (RestApi.system_shm_status, _GET),
    ("systemsharedmemory", "register"): (RestApi.system_shm_register, _POST),
    ("systemsharedmemory", "unregister"): (RestApi.system_shm_unregister, _POST),
    ("cudasharedmemory", "status"): (RestApi.cuda_shm_status, _GET),
    ("cudasharedmemory", "register"): (RestApi.cuda_shm_register, _POST),
    ("cudasharedmemory", "unregister"): (RestApi.cuda_shm_unregister, _POST),
}
#: Routes by what follows '/v2/models/{model}[/versions/{version}]'.
_MODEL: dict[str, tuple[RouteHandler, frozenset[str]]] = {
    "": (RestApi.model_metadata, _GET),
    "ready": (RestApi.model_ready, _GET),
    "config": (RestApi.model_config, _GET),
    "stats": (RestApi.model_stats, _GET),
    "infer": (RestApi.infer, _POST),
    "generate": (RestApi.generate, _POST),
    "generate_stream": (RestApi.generate_stream, _POST),
}
_REPOSITORY: dict[str, tuple[RouteHandler, frozenset[str]]] = {
    "load": (RestApi.repository_load, _POST),
    "unload": (RestApi.repository_unload, _POST),
}


#: Routes by path: a client asks the same few paths again and again, and a route depends on the
#: path alone. Bounded; it starts again empty when full.
_ROUTED: dict[str, tuple[RouteHandler | None, frozenset[str], str, str]] = {}
_ROUTED_MAX = 1024


def _match(segments: list[str]) -> tuple[RouteHandler | None, frozenset[str], str, str]:
    """(endpoint, its methods, model, version) for a path split at '/', or no endpoint."""
    if len(segments) < 2 or segments[0] or segments[1] != "v2":
        return _NO_ROUTE
    rest = segments[2:]
    fixed = _FIXED.get(tuple(rest))
    if fixed is not None:
        return fixed[0], fixed[1], "", ""
    count = len(rest)
    if count >= 2 and rest[0] == "models" and rest[1]:
        model = rest[1]
        if count >= 4 and rest[2] == "versions" and rest[3]:
            version, tail = rest[3], rest[4:]
        else:
            version, tail = "", rest[2:]
        route = _MODEL[""] if not tail else _MODEL.get(tail[0]) if len(tail) == 1 and tail[0] else None
        if tail == ["trace", "setting"]:
            route = (RestApi.trace_setting, _GET_POST)
        if route is not None:
            return route[0], route[1], model, version
    elif count == 4 and rest[0] == "repository" and rest[1] == "models" and rest[2]:
        route = _REPOSITORY.get(rest[3])
        if route is not None:
            return route[0], route[1], rest[2], ""
    elif count == 4 and rest[1] == "region" and rest[2]:
        region = _REGION.get((rest[0], rest[3]))
        if region is not None:
            return region[0], region[1], rest[2], ""
    return _NO_ROUTE


def _json(payload: Any) -> HttpResponse:
    return HttpResponse(200, json.dumps(payload, separators=(",", ":")).encode(), _JSON)


def _status(ok: bool) -> HttpResponse:
    return HttpResponse(200 if ok else 400)


def _json_object(body: bytes) -> dict[str, Any]:
    """An optional JSON object body (repository calls): empty means {}."""
    if not body.strip():
        return {}
    try:
        payload = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidArgument(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(payload, dict):
        raise InvalidArgument("request body must be a JSON object")
    return payload


def _settings_body(request: HttpRequest) -> Any:
    """A settings update's JSON body (empty: no change), refused in Triton's words when it is no JSON."""
    if not request.body.strip():
        return {}
    try:
        return json.loads(request.body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InternalError(f"failed to parse the request JSON buffer: {exc}") from None


def _field(body: dict[str, Any], name: str, kind: type, default: Any = None) -> Any:
    """A field of a shared-memory register request, in Triton's words when it is missing."""
    value = body.get(name, default)
    if value is None:
        raise InvalidArgument(f"Shared memory register request has no '{name}' field")
    bad = not isinstance(value, kind)
    if kind is int and isinstance(value, int):
        bad = isinstance(value, bool) or value < 0
    if bad:
        wanted = {str: "a string", int: "an integer >= 0", dict: "a JSON object"}[kind]
        raise InvalidArgument(f"shared memory register request: field '{name}' must be {wanted}, got {value!r:.40}")
    return value


def _parameters(body: bytes) -> dict[str, Any]:
    parameters = _json_object(body).get("parameters", {})
    if not isinstance(parameters, dict):
        raise InvalidArgument("field 'parameters' must be a JSON object")
    return parameters


def _load_parameters(body: bytes) -> dict[str, Any]:
    """A load request's parameters, each `file:` override's base64 text decoded to the file's bytes.

    Whitespace (line breaks of MIME-style base64) is skipped, as Triton's decoder skips it; any other
    character outside the base64 alphabet is refused, where Triton's decoder would drop it silently
    and load a corrupt file."""
    parameters = _parameters(body)
    for key, value in parameters.items():
        if key.startswith(FILE_PREFIX) and isinstance(value, str):
            try:
                parameters[key] = base64.b64decode("".join(value.split()), validate=True)
            except (binascii.Error, ValueError) as exc:
                raise InvalidArgument(
                    f"load parameter '{key}' is not valid base64 ({exc}); send the file's content base64-encoded"
                ) from None
    return parameters


def build_rest_server(
    plane: Plane,
    *,
    max_request_bytes: int,
    token: Token | None = None,
    read_gate: ReadGate | None = None,
    body_timeout_s: float = 60.0,
    access_log: logging.Logger | None = None,
    limits: HttpLimits = DEFAULT_LIMITS,
    header_forward: HeaderForwarding | None = None,
    restricted: Restrictions | None = None,
) -> HttpServer:
    """The KServe v2 REST front end over `plane`, not yet listening (`HttpServer.listen`)."""
    if read_gate is not None:
        plane.inflight_listeners.append(read_gate.inflight_changed)
    # Content codings wrap the API: a compressed body is inflated (within the same limit) before it is routed.
    api = ContentCodings(
        RestApi(plane, token, header_forward, restricted),
        max_body_bytes=max_request_bytes,
        compresses=frozenset({"/infer"}),
    )
    return HttpServer(
        api,
        max_body_bytes=max_request_bytes,
        body_timeout_s=body_timeout_s,
        admission=plane,
        needs_slot=is_infer,
        refusal=_refusal,
        read_gate=read_gate,
        access_log=access_log,
        limits=limits,
    )
