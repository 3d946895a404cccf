"""The `/v1` routes over a DataPlane: `GET /v1/models`, `GET /v1/models/{model}`, `POST
/v1/completions`, `POST /v1/chat/completions` (`completions.py`) and `POST /v1/embeddings`
(`embeddings.py`). A model is listed as Triton's front end lists it: every ready model, owned by
the server's name."""

from __future__ import annotations

import time
from typing import Any

from reference_server.errors import ServerError
from reference_server.frontends.http.messages import HttpRequest, HttpResponse, Reply, reply_when_done
from reference_server.frontends.http.openai import completions, embeddings
from reference_server.frontends.http.openai.errors import (
    JSON,
    OpenAiError,
    dumps,
    failure,
    from_server,
    json_object,
    openai_error,
    require_model,
)
from reference_server.frontends.plane import Plane

__all__ = ["OpenAiApi"]


class OpenAiApi:
    """The /v1 routes over a DataPlane. `respond` takes the path's segments after '/v1'."""

    def __init__(self, plane: Plane, owner: str = "perfkit-reference-server") -> None:
        self.plane = plane
        self.owner = owner
        self.created = int(time.time())

    def respond(self, request: HttpRequest, route: list[str], reply: Reply) -> None:
        try:
            self._route(request, route, reply)
        except OpenAiError as exc:
            reply(openai_error(exc))
        except ServerError as exc:
            reply(openai_error(from_server(exc)))

    def _route(self, request: HttpRequest, route: list[str], reply: Reply) -> None:
        method = request.method
        if route == ["models"] or (len(route) == 2 and route[0] == "models" and route[1]):
            _allow(method, "GET", request.path)
            reply(self._json(self.models() if len(route) == 1 else self.model(route[1])))
        elif route in (["completions"], ["chat", "completions"]):
            _allow(method, "POST", request.path)
            answer = completions.answer(self.plane, json_object(request.body), chat=len(route) == 2)
            reply_when_done(answer, reply, failure)
        elif route == ["embeddings"]:
            _allow(method, "POST", request.path)
            reply_when_done(embeddings.answer(self.plane, json_object(request.body)), reply, failure)
        else:
            raise OpenAiError(f"Not Found: {method} {request.path}", 404)

    def _json(self, payload: Any) -> HttpResponse:
        return HttpResponse(200, dumps(payload), JSON)

    def models(self) -> dict[str, Any]:
        names = sorted({entry["name"] for entry in self.plane.repository_index(ready_only=True)})
        return {"object": "list", "data": [self._model(name) for name in names]}

    def model(self, name: str) -> dict[str, Any]:
        require_model(self.plane, name)
        return self._model(name)

    def _model(self, name: str) -> dict[str, Any]:
        return {"id": name, "object": "model", "created": self.created, "owned_by": self.owner}


def _allow(method: str, allowed: str, path: str) -> None:
    if method != allowed and not (method == "HEAD" and allowed == "GET"):
        raise OpenAiError(
            f"Method Not Allowed: {method} {path}", 405, allow="GET, HEAD" if allowed == "GET" else allowed
        )
