"""A probe of a server: is it up, what does it serve, and does inference work on each model?

What `perfkit probe` runs, a quick check before a long measurement: health, server metadata, the
repository index, then a few sequential requests per model with inputs built from the model's
metadata (variable dimensions get a size of 16). A sequence model (`sequence_batching`) gets
each request as a sequence of its own, one request long: an id (1, 2, ...) with START and END, so
that the server accepts it and frees the sequence's slot at once. A server without Triton's model
configuration (MLServer, KServe) gets requests built from the metadata alone, and one note saying
so (`perfkit.measure.served`). `check_credentials` is shared with the tuner.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from perfkit.errors import PerfkitError, TargetError
from perfkit.load.inputs import batch_dimension, build_requests
from perfkit.measure.served import describe_models, no_config_note, read_model, ready_models
from perfkit.target import BINARY_TENSOR_EXTENSION, TargetSpec, TlsSpec, lists_extension
from perfkit.wire.client import InferClient, make_client
from perfkit.wire.prepared import Prepared
from perfkit.wire.replies import failure_line
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
    notes: tuple[str, ...] = ()  # what the server lacks and what that leaves unknown, each said once

    @property
    def ok(self) -> bool:
        return self.live and bool(self.models) and all(m.errors == 0 and not m.error for m in self.models)


def variable_shapes(metadata: dict[str, Any], batched: bool) -> dict[str, list[int]]:
    """--shape values for every input with variable dimensions (the batch dimension excluded)."""
    shapes = {}
    for spec in metadata.get("inputs") or ():
        shape = spec.get("shape") if isinstance(spec, dict) else None
        if not isinstance(shape, list):
            continue  # build_requests names the malformed input
        dims = shape[1:] if batched else shape
        if -1 in dims:
            shapes[str(spec.get("name"))] = [VARIABLE_DIM if d == -1 else d for d in dims]
    return shapes


async def _model_names(client: InferClient) -> list[str]:
    try:
        index = await client.repository_index()
    except Exception as exc:
        raise TargetError(f"{client.url} does not list its models ({exc}); name them with -m") from None
    ready = ready_models(index)
    if not ready:  # rather than an empty table: what it has, and why none is probed
        found = f"lists {describe_models(index)}" if index else "lists no model"
        raise TargetError(f"{client.url} has no ready model to probe: it {found}; load one, or name one with -m")
    return ready


def failure_text(client: InferClient, kind: str, message: str, binary_listed: bool = False) -> str:
    """A failed request's kind, the server's words, and the flag that may help (replies.failure_line)."""
    inputs, outputs = getattr(client, "binary", (False, False))  # gRPC: raw contents, no choice
    return failure_line(kind, message, protocol=client.protocol, binary_inputs=inputs, binary_outputs=outputs,
                        binary_listed=binary_listed)  # fmt: skip


def probe_requests(
    client: InferClient, request: v2.InferRequest, config: dict[str, Any] | None, count: int
) -> list[Prepared]:
    """The `count` requests a probe sends: the same one, or for a sequence model each a one-request
    sequence (ids 1..count, START and END), as a sequence batcher accepts. `config` None: the server
    gives none, and the model is taken for one without sequences."""
    if config is None or "sequence_batching" not in config:
        return [client.prepare(request)] * count
    template = client.prepare_sequence(request)
    return [template.make(sequence_id, True, True) for sequence_id in range(1, count + 1)]


async def _probe_model(
    client: InferClient, model: str, count: int, seed: int, notes: dict[str, str], binary_listed: bool = False
) -> ModelProbe:
    """A few requests to `model`; the row's error says why it failed. A model the server does not
    have is a usage error (exit 2, -m is what to change); a missing extension, a note in `notes`."""
    try:
        served = await read_model(client, model, "", client.url)
    except TargetError as exc:
        return ModelProbe(model, "", {}, 0, 0, 0.0, 0.0, str(exc))
    metadata, config = served.metadata, served.config
    if served.missing is not None:
        notes.setdefault(served.missing.extension, no_config_note(client.url, served.missing))
    try:
        batched = int(config.get("max_batch_size", 0)) > 0 if config is not None else batch_dimension(metadata)
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
            last_error = failure_text(client, outcome.error, outcome.message, binary_listed)
        else:
            latencies.append(time.perf_counter_ns() - start)
    lat_ms = np.array(latencies, dtype=np.float64) / 1e6
    return ModelProbe(
        model=model,
        versions=",".join(str(v) for v in metadata.get("versions") or ()),  # KServe: null
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
    tensor_format: tuple[bool | None, bool | None] = (None, None),
) -> ServerProbe:
    """Probe the server at `url`; `headers` (-H) go with every call, `tls` as for `make_client`;
    `tensor_format`: JSON inputs and outputs over HTTP, None for the server's extensions to decide."""
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
        notes: dict[str, str] = {}  # by missing extension: said once for the server
        settled, notes[BINARY_TENSOR_EXTENSION] = TargetSpec(
            url, protocol, json_tensors=tensor_format[0], json_outputs=tensor_format[1]
        ).with_tensor_format(meta)
        if settled.json_tensors or settled.json_outputs:  # a client that encodes requests so
            await client.close()
            client = make_client(url, protocol, headers=dict(headers), tls=tls, json_tensors=bool(settled.json_tensors),
                                 binary_outputs=not settled.json_outputs)  # fmt: skip
        listed = bool(lists_extension(meta, BINARY_TENSOR_EXTENSION))
        results = [await _probe_model(client, name, count, seed, notes, listed) for name in names]
    finally:
        await client.close()
    return ServerProbe(
        url=url,
        live=live,
        ready=ready,
        name=str(meta.get("name") or ""),
        version=str(meta.get("version") or ""),
        extensions=[str(e) for e in meta.get("extensions") or ()],
        models=results,
        notes=tuple(note for note in notes.values() if note),
    )
