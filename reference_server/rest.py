"""KServe v2 over HTTP/REST (aiohttp): decode, call the data plane, encode. No business logic here."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from perfkit import v2
from reference_server.auth import OPEN_HTTP_PATHS, Token, Unauthenticated
from reference_server.dataplane import DataPlane
from reference_server.errors import BodyTimeout, InvalidArgument, ServerError
from reference_server.read_gate import ReadGate

log = logging.getLogger(__name__)

DATAPLANE = web.AppKey("dataplane", DataPlane)
READ_GATE = web.AppKey("read_gate", ReadGate)
BODY_TIMEOUT_S = web.AppKey("body_timeout_s", float)
HEADER_LENGTH = "Inference-Header-Content-Length"
_JSON = "application/json"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def error_response(message: str, status: int) -> web.Response:
    return web.Response(body=v2.error_body(message), status=status, content_type=_JSON)


@web.middleware
async def kserve_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure leaves as a KServe error JSON with the status its error class names."""
    try:
        return await handler(request)
    except Unauthenticated as exc:
        response = error_response(exc.message, exc.http_status)
        response.headers["WWW-Authenticate"] = 'Bearer realm="perfkit-reference-server"'
        return response
    except BodyTimeout as exc:
        response = error_response(exc.message, exc.http_status)
        response.force_close()  # the rest of the body may still come: never read it as a request
        return response
    except ServerError as exc:
        return error_response(exc.message, exc.http_status)
    except v2.CodecError as exc:
        return error_response(str(exc), 400)
    except web.HTTPRequestEntityTooLarge as exc:
        return error_response(
            f"request body too large: {exc.text or ''} (raise the limit with --http-max-input-size)".strip(), 413
        )
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        reason = exc.reason or "error"
        return error_response(f"{reason}: {request.method} {request.path}", exc.status)
    except Exception as exc:
        log.exception("internal error serving %s %s", request.method, request.path)
        return error_response(f"internal error: {type(exc).__name__}: {exc}", 500)


def bearer_auth(token: Token) -> Callable[[web.Request, Handler], Awaitable[web.StreamResponse]]:
    """Middleware (inside `kserve_errors`): every route but the health probes wants the token."""

    @web.middleware
    async def check_token(request: web.Request, handler: Handler) -> web.StreamResponse:
        # The matched route's pattern, not the path: no spelling of a path (%2F, '..') reaches a
        # protected handler through an open name. Unmatched paths want the token too (no probing).
        resource = request.match_info.route.resource
        if resource is None or resource.canonical not in OPEN_HTTP_PATHS:
            token.check(request.headers.get("Authorization"))
        return await handler(request)

    return check_token


def _plane(request: web.Request) -> DataPlane:
    return request.app[DATAPLANE]


def _json(payload: Any) -> web.Response:
    return web.Response(body=json.dumps(payload, separators=(",", ":")).encode(), content_type=_JSON)


def _status(ok: bool) -> web.Response:
    return web.Response(status=200 if ok else 400)


async def _read_body(request: web.Request) -> bytes:
    """The whole body, within the app's body timeout: a client that stops sending mid-body would
    otherwise hold its in-flight slot, and its memory, for as long as it likes."""
    if request.content.is_eof():  # all of it came with the headers, as small requests do: no timer
        return await request.read()
    timeout_s = request.app.get(BODY_TIMEOUT_S, 60.0)
    try:
        async with asyncio.timeout(timeout_s):
            return await request.read()
    except TimeoutError:
        raise BodyTimeout(
            f"the request body did not all arrive within {timeout_s:g} s (--http-body-timeout-secs)"
        ) from None


async def _read_json_object(request: web.Request) -> dict[str, Any]:
    """An optional JSON object body (repository calls): empty means {}."""
    body = await _read_body(request)
    if not body.strip():
        return {}
    try:
        payload = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidArgument(f"request body is not valid JSON: {exc}") from exc
    if not isinstance(payload, dict):
        raise InvalidArgument("request body must be a JSON object")
    return payload


def _version(request: web.Request) -> str:
    return request.match_info.get("version", "")


async def health_live(request: web.Request) -> web.Response:
    return _status(_plane(request).live())


async def health_ready(request: web.Request) -> web.Response:
    return _status(_plane(request).ready())


async def server_metadata(request: web.Request) -> web.Response:
    return _json(_plane(request).server_metadata())


async def model_metadata(request: web.Request) -> web.Response:
    return _json(_plane(request).model_metadata(request.match_info["model"], _version(request)))


async def model_ready(request: web.Request) -> web.Response:
    return _status(_plane(request).model_ready(request.match_info["model"], _version(request)))


async def model_config(request: web.Request) -> web.Response:
    return _json(_plane(request).model_config(request.match_info["model"], _version(request)))


async def model_stats(request: web.Request) -> web.Response:
    return _json(_plane(request).statistics(request.match_info.get("model", ""), _version(request)))


async def infer(request: web.Request) -> web.Response:
    plane = _plane(request)
    model, version = request.match_info["model"], _version(request)
    with plane.admit():  # before the body is read: an overload costs no memory
        gate = request.app.get(READ_GATE)
        if gate is None:
            return await _infer(plane, request, model, version)
        with gate.serving(request.transport):
            return await _infer(plane, request, model, version)


async def _infer(plane: DataPlane, request: web.Request, model: str, version: str) -> web.Response:
    body = await _read_body(request)
    raw_length = request.headers.get(HEADER_LENGTH)
    if raw_length is None:
        header_length = None
    else:
        try:
            header_length = int(raw_length)
        except ValueError:
            raise InvalidArgument(f"{HEADER_LENGTH} must be an integer, got '{raw_length}'") from None
    if header_length == 0:
        infer_request = plane.decode_raw_request(model, version, body)
    else:
        infer_request = v2.decode_infer_request(body, header_length, model, version)
    response = await plane.infer(infer_request)
    payload, json_length = v2.encode_infer_response(response, infer_request)
    if json_length is None:
        return web.Response(body=payload, content_type=_JSON)
    return web.Response(
        body=payload,
        content_type="application/octet-stream",
        headers={HEADER_LENGTH: str(json_length)},
    )


async def repository_index(request: web.Request) -> web.Response:
    payload = await _read_json_object(request)
    ready = payload.get("ready", False)
    if not isinstance(ready, bool):
        raise InvalidArgument("repository index field 'ready' must be a boolean")
    return _json(_plane(request).repository_index(ready))


async def _parameters(request: web.Request) -> dict[str, Any]:
    parameters = (await _read_json_object(request)).get("parameters", {})
    if not isinstance(parameters, dict):
        raise InvalidArgument("field 'parameters' must be a JSON object")
    return parameters


async def repository_load(request: web.Request) -> web.Response:
    await _plane(request).load_model(request.match_info["model"], await _parameters(request))
    return web.Response(status=200)


async def repository_unload(request: web.Request) -> web.Response:
    await _plane(request).unload_model(request.match_info["model"], await _parameters(request))
    return web.Response(status=200)


def build_rest_app(
    plane: DataPlane,
    *,
    max_request_bytes: int,
    token: Token | None = None,
    read_gate: ReadGate | None = None,
    body_timeout_s: float = 60.0,
) -> web.Application:
    """The KServe v2 REST app. With `read_gate`, the caller also lets the gate watch the app's
    server (`ReadGate.watch`), so that it hears of connections."""
    middlewares: list[Any] = [kserve_errors] if token is None else [kserve_errors, bearer_auth(token)]
    app = web.Application(middlewares=middlewares, client_max_size=max_request_bytes)
    app[DATAPLANE] = plane
    app[BODY_TIMEOUT_S] = body_timeout_s
    if read_gate is not None:
        app[READ_GATE] = read_gate
        plane.inflight_listeners.append(read_gate.inflight_changed)
    model = "/v2/models/{model}"
    versioned = "/v2/models/{model}/versions/{version}"
    app.router.add_get("/v2/health/live", health_live)
    app.router.add_get("/v2/health/ready", health_ready)
    app.router.add_get("/v2", server_metadata)
    # Registered before "{model}" so that a model route does not swallow it.
    app.router.add_get("/v2/models/stats", model_stats)
    for prefix in (model, versioned):
        app.router.add_get(prefix, model_metadata)
        app.router.add_get(prefix + "/ready", model_ready)
        app.router.add_get(prefix + "/config", model_config)
        app.router.add_get(prefix + "/stats", model_stats)
        app.router.add_post(prefix + "/infer", infer)
    app.router.add_post("/v2/repository/index", repository_index)
    app.router.add_post("/v2/repository/models/{model}/load", repository_load)
    app.router.add_post("/v2/repository/models/{model}/unload", repository_unload)
    return app
