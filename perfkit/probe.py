"""`perfkit probe`: is the server up, what does it serve, and does one inference per model work?

A quick check before a long measurement: health, server metadata, the repository index, then a few
sequential requests per model with inputs built from the model's metadata.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
import numpy as np

from perfkit import v2
from perfkit.errors import TargetError

VARIABLE_DIM = 16  # size given to a variable (-1) non-batch dimension


@dataclass(frozen=True, slots=True)
class ModelProbe:
    model: str
    version: str
    input_shapes: dict[str, list[int]]
    output_shapes: dict[str, list[int]]
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
        return self.live and all(m.errors == 0 and not m.error for m in self.models) and bool(self.models)


def build_inputs(metadata: dict[str, Any], rng: np.random.Generator) -> list[v2.InferTensor]:
    """Random inputs of batch size 1 matching the model's metadata."""
    tensors = []
    for spec in metadata["inputs"]:
        shape = [1 if i == 0 and d == -1 else (VARIABLE_DIM if d == -1 else d) for i, d in enumerate(spec["shape"])]
        datatype = spec["datatype"]
        if datatype == "BYTES":
            data = np.full(shape, b"perfkit", dtype=object)
        elif datatype == "BOOL":
            data = rng.integers(0, 2, size=shape).astype(bool)
        else:
            dtype = v2.datatype_to_numpy(datatype)
            data = (rng.standard_normal(size=shape) if dtype.kind == "f" else rng.integers(0, 100, size=shape)).astype(
                dtype
            )
        tensors.append(v2.InferTensor(spec["name"], datatype, shape, data))
    return tensors


async def _get_json(session: aiohttp.ClientSession, url: str) -> Any:
    async with session.get(url) as response:
        body = await response.read()
        if response.status != 200:
            raise TargetError(f"GET {url}: HTTP {response.status}: {v2.decode_error(body)}")
        return v2_json(body, url)


def v2_json(body: bytes, url: str) -> Any:
    try:
        return json.loads(body)
    except ValueError as exc:
        raise TargetError(f"{url}: response is not JSON ({exc})") from exc


async def _status(session: aiohttp.ClientSession, url: str) -> bool:
    async with session.get(url) as response:
        await response.read()
        return response.status == 200


async def _model_names(session: aiohttp.ClientSession, base: str) -> list[str]:
    async with session.post(f"{base}/v2/repository/index", json={"ready": True}) as response:
        body = await response.read()
        if response.status != 200:
            raise TargetError(
                f"{base} does not list its models (repository index: HTTP {response.status}); name them with -m"
            )
    return sorted({entry["name"] for entry in v2_json(body, base) if entry.get("state", "READY") == "READY"})


async def _probe_model(session: aiohttp.ClientSession, base: str, model: str, count: int, seed: int) -> ModelProbe:
    try:
        metadata = await _get_json(session, f"{base}/v2/models/{model}")
    except TargetError as exc:
        return ModelProbe(model, "", {}, {}, 0, 0, 0.0, 0.0, str(exc))
    inputs = build_inputs(metadata, np.random.default_rng(seed))
    body, header_length = v2.encode_infer_request(v2.InferRequest(model, inputs=inputs))
    headers = {"Content-Type": "application/octet-stream"}
    if header_length is not None:
        headers["Inference-Header-Content-Length"] = str(header_length)
    latencies: list[int] = []
    errors, last_error, outputs = 0, "", {}
    version = ""
    for _ in range(count):
        start = time.perf_counter_ns()
        async with session.post(f"{base}/v2/models/{model}/infer", data=body, headers=headers) as response:
            payload = await response.read()
            done = time.perf_counter_ns()
            if response.status != 200:
                errors += 1
                last_error = f"HTTP {response.status}: {v2.decode_error(payload)}"
                continue
            length = response.headers.get("Inference-Header-Content-Length")
            decoded = v2.decode_infer_response(payload, int(length) if length is not None else None)
        latencies.append(done - start)
        version = decoded.model_version
        outputs = {t.name: list(t.shape) for t in decoded.outputs}
    lat_ms = np.array(latencies, dtype=np.float64) / 1e6
    return ModelProbe(
        model=model,
        version=version,
        input_shapes={t.name: t.shape for t in inputs},
        output_shapes=outputs,
        requests=count,
        errors=errors,
        p50_ms=float(np.percentile(lat_ms, 50)) if len(lat_ms) else 0.0,
        max_ms=float(lat_ms.max()) if len(lat_ms) else 0.0,
        error=last_error,
    )


async def probe(url: str, models: list[str], count: int = 20, seed: int = 0) -> ServerProbe:
    base = url if url.startswith(("http://", "https://")) else f"http://{url}"
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        try:
            live = await _status(session, f"{base}/v2/health/live")
        except aiohttp.ClientError as exc:
            raise TargetError(f"cannot reach {base}: {exc}; is the server running? (-u HOST:PORT)") from exc
        ready = await _status(session, f"{base}/v2/health/ready")
        meta = await _get_json(session, f"{base}/v2")
        names = models or await _model_names(session, base)
        results = [await _probe_model(session, base, name, count, seed) for name in names]
    return ServerProbe(
        url=base,
        live=live,
        ready=ready,
        name=str(meta.get("name", "")),
        version=str(meta.get("version", "")),
        extensions=list(meta.get("extensions", [])),
        models=results,
    )


def render_probe(result: ServerProbe) -> list[str]:
    lines = [
        f"server   {result.name} {result.version} at {result.url}",
        f"health   live={result.live} ready={result.ready}",
        f"features {', '.join(result.extensions) or '-'}",
        "",
        f"{'model':<16} {'ver':>3} {'inputs':<28} {'outputs':<22} {'ok':>5} {'p50 ms':>8} {'max ms':>8}",
    ]
    for m in result.models:
        ins = " ".join(f"{k}{v}" for k, v in m.input_shapes.items())
        outs = " ".join(f"{k}{v}" for k, v in m.output_shapes.items())
        ok = f"{m.requests - m.errors}/{m.requests}"
        lines.append(f"{m.model:<16} {m.version:>3} {ins:<28} {outs:<22} {ok:>5} {m.p50_ms:>8.3f} {m.max_ms:>8.3f}")
        if m.error:
            lines.append(f"  error: {m.error}")
    return lines
