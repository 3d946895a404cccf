"""A probe of a server: is it up, what does it serve, and does inference work on each model?

What `perfkit probe` runs, a quick check before a long measurement: health, server metadata, the
repository index, then a few sequential requests per model with inputs built from the model's
metadata (variable dimensions get a size of 16). A sequence model (`sequence_batching`) gets
each request as a sequence of its own, one request long: an id (1, 2, ...) with START and END, so
that the server accepts it and frees the sequence's slot at once. `check_credentials` is shared
with the tuner.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from perfkit.errors import PerfkitError, TargetError
from perfkit.load.inputs import build_requests
from perfkit.target import TlsSpec
from perfkit.wire.client import InferClient, make_client
from perfkit.wire.prepared import Prepared
from v2kit import codec as v2

VARIABLE_DIM = 16  # size given to a variable (-1) non-batch dimension

#: How the clients word a server's refusal of the request's credentials (HTTP and gRPC). The health
#: probes need no credentials, so a missing token shows first on the next call, as one of these.
_REFUSALS = ("HTTP 401", "HTTP 403", "UNAUTHENTICATED", "PERMISSION_DENIED")


def check_credentials(error: TargetError) -> None:
    """Raise a TargetError naming -H when `error` is the server refusing the credentials: every
    other call would be refused too, so it is the run's end, not a failure of one model or variant."""
    if any(mark in str(error) for mark in _REFUSALS):
        raise TargetError(
            f"{error}; give the server's credentials with -H, e.g. -H 'Authorization: Bearer TOKEN'"
        ) from None


@dataclass(frozen=True, slots=True)
class ModelProbe:
    model: str
    versions: str
    input_shapes: dict[str, list[int]]
    requests: int
    errors: int
    p50_ms: float
    max_ms: float
    error: str = ""


@dataclass(frozen=True, slots=True)
class ServerProbe:
    url: str
    live: bool
    ready: bool
    name: str
    version: str
    extensions: list[str]
    models: list[ModelProbe]

    @property
    def ok(self) -> bool:
        return self.live and bool(self.models) and all(m.errors == 0 and not m.error for m in self.models)


def variable_shapes(metadata: dict[str, Any], batched: bool) -> dict[str, list[int]]:
    """--shape values for every input with variable dimensions (the batch dimension excluded)."""
    shapes = {}
    for spec in metadata["inputs"]:
        dims = list(spec["shape"])[1:] if batched else list(spec["shape"])
        if -1 in dims:
            shapes[spec["name"]] = [VARIABLE_DIM if d == -1 else d for d in dims]
    return shapes


async def _model_names(client: InferClient) -> list[str]:
    try:
        index = await client.repository_index()
    except Exception as exc:
        raise TargetError(f"{client.url} does not list its models ({exc}); name them with -m") from None
    return sorted({entry["name"] for entry in index if entry.get("state", "READY") == "READY"})


def probe_requests(client: InferClient, request: v2.InferRequest, config: dict[str, Any], count: int) -> list[Prepared]:
    """The `count` requests a probe sends: the same one, or for a sequence model each a one-request
    sequence (ids 1..count, START and END), as a sequence batcher accepts."""
    if "sequence_batching" not in config:
        return [client.prepare(request)] * count
    template = client.prepare_sequence(request)
    return [template.make(sequence_id, True, True) for sequence_id in range(1, count + 1)]


async def _probe_model(client: InferClient, model: str, count: int, seed: int) -> ModelProbe:
    try:
        metadata = await client.model_metadata(model)
        config = await client.model_config(model)
        batched = int(config.get("max_batch_size", 0)) > 0
        (request, *_) = build_requests(
            metadata, config, model=model, shapes=variable_shapes(metadata, batched), seed=seed
        )
    except (TargetError, PerfkitError) as exc:
        return ModelProbe(model, "", {}, 0, 0, 0.0, 0.0, str(exc))
    latencies: list[int] = []
    errors, last_error = 0, ""
    for prepared in probe_requests(client, request, config, count):
        start = time.perf_counter_ns()
        outcome = await client.send(prepared)
        if outcome.error:
            errors += 1
            last_error = f"{outcome.error}: {outcome.message}" if outcome.message else outcome.error
        else:
            latencies.append(time.perf_counter_ns() - start)
    lat_ms = np.array(latencies, dtype=np.float64) / 1e6
    return ModelProbe(
        model=model,
        versions=",".join(metadata.get("versions", [])),
        input_shapes={t.name: t.shape for t in request.inputs},
        requests=count,
        errors=errors,
        p50_ms=float(np.percentile(lat_ms, 50)) if len(lat_ms) else 0.0,
        max_ms=float(lat_ms.max()) if len(lat_ms) else 0.0,
        error=last_error,
    )


async def probe(
    url: str,
    models: list[str],
    count: int = 20,
    seed: int = 0,
    protocol: str = "http",
    *,
    headers: tuple[tuple[str, str], ...] = (),
    tls: TlsSpec | None = None,
) -> ServerProbe:
    """Probe the server at `url`; `headers` (-H) go with every call, `tls` as for `make_client`."""
    client = make_client(url, protocol, headers=dict(headers), tls=tls)
    try:
        live = await client.live()  # TargetError says what could not be reached, and how
        ready = await client.ready()
        try:
            meta = await client.server_metadata()
            names = models or await _model_names(client)
        except TargetError as exc:
            check_credentials(exc)
            raise
        results = [await _probe_model(client, name, count, seed) for name in names]
    finally:
        await client.close()
    return ServerProbe(
        url=url,
        live=live,
        ready=ready,
        name=str(meta.get("name", "")),
        version=str(meta.get("version", "")),
        extensions=list(meta.get("extensions", [])),
        models=results,
    )
