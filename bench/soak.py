"""Soak: minutes of closed-loop load on the reference server, with model reloads in the middle, and
proof that nothing was lost, duplicated, mixed up or leaked.

    python bench/soak.py                      # 180 s at concurrency 32, a reload every 15 s
    python bench/soak.py --duration 60 --concurrency 16 --reload-every 10 --json soak.json
    python bench/soak.py --frontend-workers 2  # the same across front-end worker processes

The server runs in its own process (explicit model control, the demo `identity` model). The load is
split across HTTP (binary tensors), gRPC ModelInfer and gRPC ModelStreamInfer (long-lived streams
that live through every reload). Each request carries a unique id and a payload that encodes it;
`identity` echoes the payload, so every answer is checked against the request it claims to answer.
Meanwhile the model is reloaded with alternating configs (1, 2 or 4 instances, batching on or off):
with two front-end workers, the configs of 2 and 4 instances run in the workers, the others in the
core, so each reload moves the model's requests from one to the other.

Figures: requests sent and answered, errors by kind, lost (no answer) and duplicated (answered
twice) requests, mismatches (an answer with another request's payload), reloads, and the resident
memory of server and client at the start of the steady state (once every config has loaded, or
after --warmup-share of the run, whichever is later), at the end, and at most. Exit 0 when
nothing was lost, duplicated, mismatched or failed, and neither side grew past --max-growth-mb.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import numpy as np
import psutil
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from perfkit.target import reference_server_process
from v2kit import codec as v2
from v2kit.demo import ensure_demo_repository
from v2kit.grpc_proto import request_to_proto, response_from_proto

MODEL = "identity"
WIDTH = 16
REQUEST_TIMEOUT_S = 30.0
CONFIGS = [  # identity's config overrides, in turn
    {"max_batch_size": 8, "instance_group": [{"count": 2, "kind": "KIND_CPU"}], "dynamic_batching": {}},
    {"max_batch_size": 8, "instance_group": [{"count": 1, "kind": "KIND_CPU"}]},
    {"max_batch_size": 8, "instance_group": [{"count": 1, "kind": "KIND_CPU"}], "dynamic_batching": {}},
    {"max_batch_size": 8, "instance_group": [{"count": 4, "kind": "KIND_CPU"}]},
]


@dataclass(slots=True)
class Tally:
    sent: int = 0
    answered: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    mismatched: int = 0
    duplicated: int = 0
    # One byte per sequence number (they are dense): the bookkeeping must not look like a leak.
    seen: bytearray = field(default_factory=lambda: bytearray(1 << 20))
    by_protocol: Counter[str] = field(default_factory=Counter)

    def _first(self, sequence: int) -> bool:
        while sequence >= len(self.seen):
            self.seen.extend(bytes(len(self.seen)))
        if self.seen[sequence]:
            self.duplicated += 1
            return False
        self.seen[sequence] = 1
        return True

    def answer(self, sequence: int, echoed: np.ndarray | None, protocol: str) -> None:
        if not self._first(sequence):
            return
        self.answered += 1
        self.by_protocol[protocol] += 1
        if echoed is None or not np.array_equal(echoed.reshape(-1), _payload(sequence)):
            self.mismatched += 1

    def fail(self, sequence: int, kind: str) -> None:
        if self._first(sequence):
            self.errors[kind] += 1


def _payload(sequence: int) -> np.ndarray:
    # Exact in float32 for sequences below 2**24 (about 16.7 million requests).
    return (np.arange(WIDTH, dtype=np.float32) + np.float32(sequence)).astype(np.float32)


def _request(sequence: int) -> v2.InferRequest:
    data = _payload(sequence).reshape(1, WIDTH)
    return v2.InferRequest(MODEL, id=str(sequence), inputs=[v2.InferTensor("INPUT0", "FP32", [1, WIDTH], data)])


# --- load ----------------------------------------------------------------------------------------------


async def http_worker(url: str, counter: itertools.count[int], tally: Tally, stop: asyncio.Event) -> None:
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        while not stop.is_set():
            sequence = next(counter)
            body, length = v2.encode_infer_request(_request(sequence))
            tally.sent += 1
            try:
                async with session.post(
                    f"http://{url}/v2/models/{MODEL}/infer",
                    data=body,
                    headers={"Inference-Header-Content-Length": str(length)},
                ) as response:
                    payload = await response.read()
                    if response.status != 200:
                        tally.fail(sequence, f"HTTP {response.status}: {v2.decode_error(payload)[:80]}")
                        continue
                    header = response.headers.get("Inference-Header-Content-Length")
                    decoded = v2.decode_infer_response(payload, int(header) if header else None)
            except asyncio.TimeoutError:
                tally.fail(sequence, "http timeout (lost)")
                continue
            except (aiohttp.ClientError, v2.CodecError) as exc:
                tally.fail(sequence, f"http {type(exc).__name__}")
                continue
            ok = decoded.id == str(sequence) and decoded.outputs
            tally.answer(sequence, decoded.outputs[0].data if ok else None, "http")


async def grpc_worker(stub: Any, counter: itertools.count[int], tally: Tally, stop: asyncio.Event) -> None:
    while not stop.is_set():
        sequence = next(counter)
        tally.sent += 1
        try:
            reply = await stub.ModelInfer(request_to_proto(_request(sequence)), timeout=REQUEST_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            kind = (
                "grpc timeout (lost)" if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED else f"grpc {exc.code().name}"
            )
            tally.fail(sequence, kind)
            continue
        decoded = response_from_proto(reply)
        ok = decoded.id == str(sequence) and decoded.outputs
        tally.answer(sequence, decoded.outputs[0].data if ok else None, "grpc")


async def stream_worker(
    stub: Any, counter: itertools.count[int], tally: Tally, stop: asyncio.Event, outstanding: int
) -> None:
    """One long-lived ModelStreamInfer call with `outstanding` requests in flight, matched by id."""
    queue: asyncio.Queue[pb.ModelInferRequest | None] = asyncio.Queue()
    pending: set[int] = set()

    async def requests() -> Any:
        while (item := await queue.get()) is not None:
            yield item

    def send_next() -> None:
        if stop.is_set():
            return
        sequence = next(counter)
        pending.add(sequence)
        tally.sent += 1
        queue.put_nowait(request_to_proto(_request(sequence)))

    for _ in range(outstanding):
        send_next()
    call = stub.ModelStreamInfer(requests())
    try:
        async for reply in call:
            sequence = int(reply.infer_response.id)
            if sequence not in pending:
                tally.duplicated += 1  # an answer to nothing outstanding
                continue
            pending.discard(sequence)
            if reply.error_message:
                tally.fail(sequence, f"stream error: {reply.error_message[:80]}")
            else:
                tally.answer(sequence, response_from_proto(reply.infer_response).outputs[0].data, "stream")
            send_next()
            if stop.is_set() and not pending:
                queue.put_nowait(None)  # half-close: the server ends the call with OK
    except grpc.aio.AioRpcError as exc:
        for sequence in pending:
            tally.fail(sequence, f"stream {exc.code().name}")
        pending.clear()
    for sequence in pending:
        tally.fail(sequence, "stream ended (lost)")


async def reloader(url: str, every_s: float, stop: asyncio.Event, log: list[dict[str, Any]]) -> None:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        for turn in itertools.count():
            try:
                await asyncio.wait_for(stop.wait(), every_s)
                return
            except asyncio.TimeoutError:
                pass
            config = CONFIGS[turn % len(CONFIGS)]
            body = {"parameters": {"config": json.dumps(config)}}
            start = time.perf_counter()
            async with session.post(f"http://{url}/v2/repository/models/{MODEL}/load", json=body) as response:
                text = await response.text()
            log.append(
                {"status": response.status, "seconds": round(time.perf_counter() - start, 3), "config": config}
                | ({} if response.status == 200 else {"error": text[:200]})
            )


def tree_rss(process: psutil.Process) -> int:
    """The resident memory of a process and its children (front-end workers, python-backend stubs)."""
    total = 0
    for member in [process, *process.children(recursive=True)]:
        try:
            total += member.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


async def memory_sampler(server_pid: int, stop: asyncio.Event, samples: list[tuple[float, int, int]]) -> None:
    server, client = psutil.Process(server_pid), psutil.Process()
    start = time.monotonic()
    while not stop.is_set():
        samples.append((time.monotonic() - start, tree_rss(server), client.memory_info().rss))
        try:
            await asyncio.wait_for(stop.wait(), 2.0)
        except asyncio.TimeoutError:
            pass
    samples.append((time.monotonic() - start, tree_rss(server), client.memory_info().rss))


# --- the run -------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Memory:
    warm_mb: float  # at the start of the steady state (after the warmup share of the run)
    end_mb: float
    max_mb: float

    @property
    def growth_mb(self) -> float:
        return self.end_mb - self.warm_mb


def _memory(samples: list[tuple[float, int, int]], column: int, warm_s: float) -> Memory:
    steady = [s for s in samples if s[0] >= warm_s] or samples
    mb = [s[column] / 2**20 for s in steady]
    return Memory(round(mb[0], 1), round(mb[-1], 1), round(max(mb), 1))


async def soak(http_url: str, grpc_url: str, server_pid: int, args: argparse.Namespace) -> dict[str, Any]:
    tally, stop, counter = Tally(), asyncio.Event(), itertools.count()
    reloads: list[dict[str, Any]] = []
    samples: list[tuple[float, int, int]] = []
    streams = max(1, args.concurrency // 8)
    per_stream = max(1, args.concurrency // 4 // streams)
    unary = max(1, args.concurrency // 4)
    http = args.concurrency - unary - streams * per_stream
    async with grpc.aio.insecure_channel(grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        tasks = [asyncio.create_task(http_worker(http_url, counter, tally, stop)) for _ in range(http)]
        tasks += [asyncio.create_task(grpc_worker(stub, counter, tally, stop)) for _ in range(unary)]
        tasks += [asyncio.create_task(stream_worker(stub, counter, tally, stop, per_stream)) for _ in range(streams)]
        tasks += [asyncio.create_task(reloader(http_url, args.reload_every, stop, reloads))]
        tasks += [asyncio.create_task(memory_sampler(server_pid, stop, samples))]
        started = time.monotonic()
        while time.monotonic() - started < args.duration:
            await asyncio.sleep(min(10.0, args.duration - (time.monotonic() - started)))
            elapsed = time.monotonic() - started
            print(
                f"{elapsed:6.0f} s  answered {tally.answered:>9,}  errors {sum(tally.errors.values()):>5}  "
                f"reloads {len(reloads)}  server RSS {samples[-1][1] / 2**20:6.1f} MiB",
                flush=True,
            )
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), REQUEST_TIMEOUT_S + 30)
        elapsed = time.monotonic() - started
    # Steady state begins once every config has been loaded and served: a process's first
    # onnxruntime session (a front-end worker's, when a config first puts instances there) takes its
    # thread pools and allocator once, which is no growth of a long run.
    every_config_s = args.reload_every * (len(CONFIGS) + 0.5)
    warm_s = max(args.duration * args.warmup_share, every_config_s if every_config_s < 0.8 * args.duration else 0.0)
    lost = tally.sent - tally.answered - sum(tally.errors.values())
    return {
        "duration_s": round(elapsed, 1),
        "concurrency": {"http": http, "grpc": unary, "stream": streams * per_stream},
        "sent": tally.sent,
        "answered": tally.answered,
        "answered_by_protocol": dict(tally.by_protocol),
        "throughput_rps": round(tally.answered / elapsed, 1),
        "errors": dict(tally.errors),
        "lost": lost + sum(n for kind, n in tally.errors.items() if "lost" in kind),
        "duplicated": tally.duplicated,
        "mismatched": tally.mismatched,
        "reloads": len(reloads),
        "failed_reloads": [r for r in reloads if r["status"] != 200],
        "reload_seconds_max": max((r["seconds"] for r in reloads), default=0.0),
        "steady_from_s": round(warm_s, 1),
        "server_memory_mb": asdict(_memory(samples, 1, warm_s)),
        "client_memory_mb": asdict(_memory(samples, 2, warm_s)),
    }


def verdict(figures: dict[str, Any], max_growth_mb: float) -> list[str]:
    problems = []
    for key in ("lost", "duplicated", "mismatched"):
        if figures[key]:
            problems.append(f"{figures[key]} {key}")
    if figures["errors"]:
        problems.append(f"errors: {figures['errors']}")
    if figures["failed_reloads"]:
        problems.append(f"{len(figures['failed_reloads'])} failed reloads")
    for side in ("server", "client"):
        memory = figures[f"{side}_memory_mb"]
        growth = memory["end_mb"] - memory["warm_mb"]
        if growth > max_growth_mb:
            problems.append(f"{side} memory grew {growth:.1f} MiB (limit {max_growth_mb} MiB)")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=180.0, metavar="SECONDS")
    parser.add_argument("--concurrency", type=int, default=32, help="requests in flight, all protocols together")
    parser.add_argument("--reload-every", type=float, default=15.0, metavar="SECONDS")
    parser.add_argument(
        "--warmup-share",
        type=float,
        default=0.2,
        help="memory growth is measured from this share of the run on, or once every config has loaded if later",
    )
    parser.add_argument("--max-growth-mb", type=float, default=50.0, help="largest RSS growth accepted, each side")
    parser.add_argument("--json", type=Path, metavar="OUT.json", help="also write the figures here")
    parser.add_argument("--frontend-workers", type=int, default=1, help="the server's --frontend-workers")
    args = parser.parse_args(argv)
    if args.concurrency < 4:
        parser.error("--concurrency must be at least 4 (HTTP, gRPC and stream workers)")
    extra = ["--model-control-mode", "explicit", "--load-model", MODEL, "--frontend-workers", str(args.frontend_workers)]
    with reference_server_process(ensure_demo_repository(), extra) as server:
        print(f"soak: {args.duration:.0f} s at concurrency {args.concurrency} against {server.http_url}", flush=True)
        figures = asyncio.run(soak(server.http_url, server.grpc_url, server.process.pid, args))
    problems = verdict(figures, args.max_growth_mb)
    figures["verdict"] = "PASS" if not problems else "FAIL: " + "; ".join(problems)
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
