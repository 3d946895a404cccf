"""Soak: minutes of closed-loop load on the reference server, with model reloads and faults at
random times in the middle, and proof that nothing was lost, duplicated, mixed up, hung or leaked.

    python bench/soak.py                      # 180 s at concurrency 32, a reload every 15 s, a fault every ~10 s
    python bench/soak.py --duration 60 --concurrency 16 --reload-every 10 --json soak.json
    python bench/soak.py --frontend-workers 2 --kill-core-at-end  # workers killed too; the core last
    python bench/soak.py --no-faults          # reloads alone

The server runs in its own process (explicit model control; the demo `identity` model and a
python-backend echo model, `pyecho`, whose stub gives a batch up after --stub-timeout). The load
alternates between the two models, request by request, and is split across HTTP (binary tensors),
gRPC ModelInfer and gRPC ModelStreamInfer (long-lived streams; one a fault ends is followed by a
new one). Each request carries a unique id and a payload that encodes it; both models echo the
payload, so every answer is checked against the request it claims to answer.
Meanwhile `identity` is reloaded with alternating configs (1, 2 or 4 instances, batching on or off):
with two front-end workers, the configs of 2 and 4 instances run in the workers, the others in the
core, so each reload moves the model's requests from one to the other. And, unless --no-faults,
soak_faults.py throws faults at random times (seeded by --seed, printed): kill -9 or SIGSTOP of the
echo model's stub, kill -9 of a front-end worker, an unload and load of a model; with
--kill-core-at-end, kill -9 of the core under load as the last.

Figures: requests sent and answered, errors by kind, lost (no answer by REQUEST_TIMEOUT_S),
duplicated (answered twice), mismatched (an answer with another request's payload) and hung (a
load task still running REQUEST_TIMEOUT_S + 30 s after the load stopped) requests; per fault kind
how many were thrown, the requests they failed (by kind) and their recovery times; reloads; the
server's processes and /dev/shm files left once it stopped; and the resident memory of server
and client at the start of the steady state (once every config has loaded, or after
--warmup-share of the run, whichever is later), at the end, and at most. Exit 0 when nothing was
lost, duplicated, mismatched or hung, every error came in a fault's window, every fault was
recovered (a stalled stub killed by the server itself), nothing was left behind, and neither side
grew past --max-growth-mb. SIGINT (Ctrl-C) ends the run at once, the server stopped, with the
figures so far under an INTERRUPTED verdict: exit 130.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import signal
import sys
import tempfile
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

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script: its sibling module
from soak_faults import (
    KINDS,
    PY_MODEL,
    RECOVERY_GIVE_UP_S,
    FaultInjector,
    Recoveries,
    alive,
    attribute,
    fault_figures,
    leftovers,
    soak_repository,
)

MODEL = "identity"  # the model the reloads reconfigure
MODELS = (MODEL, PY_MODEL)  # the load alternates between them, request by request
WIDTH = 16
REQUEST_TIMEOUT_S = 30.0
INTERRUPTED_EXIT = 130  # a shell's code for a run SIGINT ended (128 + 2)
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
    error_log: list[tuple[float, str]] = field(default_factory=list)  # (monotonic, kind), for attribution
    recoveries: Recoveries = field(default_factory=Recoveries)

    def _first(self, sequence: int) -> bool:
        while sequence >= len(self.seen):
            self.seen.extend(bytes(len(self.seen)))
        if self.seen[sequence]:
            self.duplicated += 1
            return False
        self.seen[sequence] = 1
        return True

    def answer(self, sequence: int, response: v2.InferResponse, protocol: str, sent_at: float) -> None:
        if not self._first(sequence):
            return
        self.answered += 1
        self.by_protocol[protocol] += 1
        outputs = {t.name: t.data for t in response.outputs} if response.id == str(sequence) else {}
        echoed = outputs.get("OUTPUT0")
        if echoed is None or not np.array_equal(np.asarray(echoed).reshape(-1), _payload(sequence)):
            self.mismatched += 1
            return
        pid = outputs.get("PID")  # the echo model's stub: shows a restarted one answering
        self.recoveries.seen(_model(sequence), None if pid is None else int(np.asarray(pid).flat[0]), sent_at)

    def fail(self, sequence: int, kind: str) -> None:
        if self._first(sequence):
            self.errors[kind] += 1
            self.error_log.append((time.monotonic(), kind))


def _payload(sequence: int) -> np.ndarray:
    # Exact in float32 for sequences below 2**24 (about 16.7 million requests).
    return (np.arange(WIDTH, dtype=np.float32) + np.float32(sequence)).astype(np.float32)


def _model(sequence: int) -> str:
    return MODELS[sequence % len(MODELS)]


def _request(sequence: int) -> v2.InferRequest:
    data = _payload(sequence).reshape(1, WIDTH)
    inputs = [v2.InferTensor("INPUT0", "FP32", [1, WIDTH], data)]
    return v2.InferRequest(_model(sequence), id=str(sequence), inputs=inputs)


def probe_request() -> tuple[bytes, dict[str, str], np.ndarray]:
    """An `identity` request over HTTP (body, headers) and the payload it must echo."""
    body, length = v2.encode_infer_request(_request(0))
    return body, {"Inference-Header-Content-Length": str(length)}, _payload(0)


# --- load ----------------------------------------------------------------------------------------------


async def http_worker(url: str, counter: itertools.count[int], tally: Tally, stop: asyncio.Event) -> None:
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        while not stop.is_set():
            sequence = next(counter)
            body, length = v2.encode_infer_request(_request(sequence))
            tally.sent += 1
            sent_at = time.monotonic()
            try:
                async with session.post(
                    f"http://{url}/v2/models/{_model(sequence)}/infer",
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
            tally.answer(sequence, decoded, "http", sent_at)


async def grpc_worker(stub: Any, counter: itertools.count[int], tally: Tally, stop: asyncio.Event) -> None:
    while not stop.is_set():
        sequence = next(counter)
        tally.sent += 1
        sent_at = time.monotonic()
        try:
            reply = await stub.ModelInfer(request_to_proto(_request(sequence)), timeout=REQUEST_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            # With the server's words, as the HTTP and stream kinds have them.
            kind = (
                "grpc timeout (lost)"
                if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED
                else f"grpc {exc.code().name}: {(exc.details() or '')[:80]}"
            )
            tally.fail(sequence, kind)
            continue
        tally.answer(sequence, response_from_proto(reply), "grpc", sent_at)


async def stream_worker(
    stub: Any, counter: itertools.count[int], tally: Tally, stop: asyncio.Event, outstanding: int
) -> None:
    """Long-lived ModelStreamInfer calls: a call a fault ends (a worker killed) is followed by a new one."""
    while not stop.is_set():
        await _stream_call(stub, counter, tally, stop, outstanding)


async def _stream_call(
    stub: Any, counter: itertools.count[int], tally: Tally, stop: asyncio.Event, outstanding: int
) -> None:
    """One ModelStreamInfer call with `outstanding` requests in flight, matched by id."""
    queue: asyncio.Queue[pb.ModelInferRequest | None] = asyncio.Queue()
    pending: dict[int, float] = {}  # sequence -> monotonic send time

    async def requests() -> Any:
        while (item := await queue.get()) is not None:
            yield item

    def send_next() -> None:
        if stop.is_set():
            return
        sequence = next(counter)
        pending[sequence] = time.monotonic()
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
            sent_at = pending.pop(sequence)
            if reply.error_message:
                tally.fail(sequence, f"stream error: {reply.error_message[:80]}")
            else:
                tally.answer(sequence, response_from_proto(reply.infer_response), "stream", sent_at)
            send_next()
            if stop.is_set() and not pending:
                queue.put_nowait(None)  # half-close: the server ends the call with OK
    except grpc.aio.AioRpcError as exc:
        for sequence in pending:
            tally.fail(sequence, f"stream {exc.code().name}")
        pending.clear()
    # Ends the request generator of a call a fault ended: grpc's task that reads it would otherwise
    # be left waiting, and destroyed pending.
    queue.put_nowait(None)
    for sequence in pending:
        tally.fail(sequence, "stream ended (lost)")


async def reloader(
    url: str, every_s: float, stop: asyncio.Event, log: list[dict[str, Any]], lock: asyncio.Lock
) -> None:
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
            async with lock:  # not while a fault unloads the model
                try:
                    async with session.post(f"http://{url}/v2/repository/models/{MODEL}/load", json=body) as response:
                        status, text = response.status, await response.text()
                except aiohttp.ClientError as exc:  # the core killed at the end
                    status, text = 0, f"{type(exc).__name__}: {exc}"
            log.append(
                {"status": status, "seconds": round(time.perf_counter() - start, 3), "config": config}
                | {"at": time.monotonic()}
                | ({} if status == 200 else {"error": text[:200]})
            )


def tree_rss(process: psutil.Process) -> int:
    """The resident memory of a process and its children (front-end workers, python-backend stubs)."""
    total = 0
    try:
        members = [process, *process.children(recursive=True)]
    except psutil.NoSuchProcess:  # the core killed at the end
        return 0
    for member in members:
        try:
            total += member.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


async def memory_sampler(server_pid: int, stop: asyncio.Event, samples: list[tuple[float, int, int]]) -> None:
    server, client = psutil.Process(server_pid), psutil.Process()
    start = time.monotonic()
    while True:
        if rss := tree_rss(server):  # 0 once the core is killed at the end
            samples.append((time.monotonic() - start, rss, client.memory_info().rss))
        if stop.is_set():
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), 2.0)


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


async def soak(
    http_url: str, grpc_url: str, server_pid: int, args: argparse.Namespace
) -> tuple[dict[str, Any], FaultInjector]:
    tally, stop, counter = Tally(), asyncio.Event(), itertools.count()
    reloads: list[dict[str, Any]] = []
    samples: list[tuple[float, int, int]] = []
    streams = max(1, args.concurrency // 8)
    per_stream = max(1, args.concurrency // 4 // streams)
    unary = max(1, args.concurrency // 4)
    http = args.concurrency - unary - streams * per_stream
    repository_lock, faults_stop = asyncio.Lock(), asyncio.Event()
    interrupted = _on_sigint()
    injector = FaultInjector(
        server_pid, http_url, args.fault_kinds if args.faults else [], args.fault_every if args.faults else 1.0,
        random.Random(args.seed), args.stub_timeout, tally.recoveries, repository_lock, probe_request,
    )  # fmt: skip
    async with grpc.aio.insecure_channel(grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        load = [asyncio.create_task(http_worker(http_url, counter, tally, stop)) for _ in range(http)]
        load += [asyncio.create_task(grpc_worker(stub, counter, tally, stop)) for _ in range(unary)]
        load += [asyncio.create_task(stream_worker(stub, counter, tally, stop, per_stream)) for _ in range(streams)]
        tasks = [asyncio.create_task(reloader(http_url, args.reload_every, stop, reloads, repository_lock))]
        sampling_stop = asyncio.Event()  # before the core's kill: the memory is the server's, not its ruins
        sampling = asyncio.create_task(memory_sampler(server_pid, sampling_stop, samples))
        faulting = asyncio.create_task(injector.run(faults_stop))
        started = time.monotonic()
        while time.monotonic() - started < args.duration:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(interrupted.wait(), min(10.0, args.duration - (time.monotonic() - started)))
            if interrupted.is_set():
                break
            elapsed = time.monotonic() - started
            print(
                f"{elapsed:6.0f} s  answered {tally.answered:>9,}  errors {sum(tally.errors.values()):>5}  "
                f"reloads {len(reloads)}  faults {len(injector.faults)}  server RSS {samples[-1][1] / 2**20:6.1f} MiB",
                flush=True,
            )
        orphans: list[int] = []
        hung: set[asyncio.Task[None]] = set()
        ended_at = time.monotonic()  # an interrupted run's faults after ended_at - RECOVERY_GIVE_UP_S were cut short
        if interrupted.is_set():
            print(f"soak: interrupted (SIGINT) after {time.monotonic() - started:.0f} s: stopping", flush=True)
            await _end_at_once(injector, (faults_stop, sampling_stop, stop), [faulting, sampling, *load, *tasks])
        else:
            # The fault in progress runs to its recovery (bounded) under load; then the last, if asked.
            faults_stop.set()
            await faulting
            injector.note_processes()
            sampling_stop.set()
            await sampling
            core_kill = injector.kill_core() if args.kill_core_at_end else None
            stop.set()
            orphans = await injector.orphans(core_kill) if core_kill is not None else []
            # Every request ends, answered or failed, by its timeout: a task still running is hung.
            _, hung = await asyncio.wait(load, timeout=REQUEST_TIMEOUT_S + 30)
            for task in hung:
                task.cancel()
            await asyncio.gather(*tasks)
        elapsed = time.monotonic() - started
    # Steady state begins once every config has been loaded and served: a process's first
    # onnxruntime session (a front-end worker's, when a config first puts instances there) takes its
    # thread pools and allocator once, which is no growth of a long run.
    every_config_s = args.reload_every * (len(CONFIGS) + 0.5)
    warm_s = max(args.duration * args.warmup_share, every_config_s if every_config_s < 0.8 * args.duration else 0.0)
    # Interrupted, the requests in flight were cancelled: not lost, and counted apart.
    unended = tally.sent - tally.answered - sum(tally.errors.values())
    lost = 0 if interrupted.is_set() else unended
    unrecovered = [f for f in injector.faults if f.recovery_s is None and f.kind != "core-kill"]
    # Interrupted, the faults still within their recovery time had no chance to recover.
    cut_short = [f for f in unrecovered if interrupted.is_set() and f.at > ended_at - RECOVERY_GIVE_UP_S]
    failed_reloads = [r for r in reloads if r["status"] != 200]
    unexplained = attribute(
        injector.faults, tally.error_log + [(r["at"], f"reload answered {r['status']}") for r in failed_reloads]
    )
    return {
        "duration_s": round(elapsed, 1),
        **({"interrupted": True, "cancelled_in_flight": unended} if interrupted.is_set() else {}),
        "concurrency": {"http": http, "grpc": unary, "stream": streams * per_stream},
        "sent": tally.sent,
        "answered": tally.answered,
        "answered_by_protocol": dict(tally.by_protocol),
        "throughput_rps": round(tally.answered / elapsed, 1),
        "errors": dict(tally.errors),
        "unexplained_errors": dict(unexplained),
        "lost": lost + sum(n for kind, n in tally.errors.items() if kind.endswith("(lost)")),
        "duplicated": tally.duplicated,
        "mismatched": tally.mismatched,
        "hung": len(hung),
        "seed": args.seed,
        "faults": fault_figures(injector.faults),
        "faults_skipped": dict(injector.skipped),  # none of the kind could be thrown at that moment
        "faults_not_recovered": [f"{f.kind} {f.target}" for f in unrecovered if f not in cut_short],
        **({"faults_cut_short": [f"{f.kind} {f.target}" for f in cut_short]} if interrupted.is_set() else {}),
        "outlived_core": orphans,
        "reloads": len(reloads),
        "failed_reloads": failed_reloads,
        "reload_seconds_max": max((r["seconds"] for r in reloads), default=0.0),
        "steady_from_s": round(warm_s, 1),
        "server_memory_mb": asdict(_memory(samples, 1, warm_s)),
        "client_memory_mb": asdict(_memory(samples, 2, warm_s)),
    }, injector


def _on_sigint() -> asyncio.Event:
    """An event SIGINT (Ctrl-C, or kill -INT, even when the shell that started the run in the
    background made it ignore SIGINT) sets, so that the run ends at once with its figures so far; a
    second SIGINT raises KeyboardInterrupt as usual."""
    interrupted, loop = asyncio.Event(), asyncio.get_running_loop()

    def on_sigint() -> None:
        interrupted.set()
        loop.remove_signal_handler(signal.SIGINT)  # back to KeyboardInterrupt

    loop.add_signal_handler(signal.SIGINT, on_sigint)
    return interrupted


async def _end_at_once(
    injector: FaultInjector, stops: tuple[asyncio.Event, ...], running: list[asyncio.Task[Any]]
) -> None:
    """An interrupted run: no more faults, load, reloads or samples, without waiting for a fault's
    recovery or the requests in flight; a stub a stall left stopped runs again, so that the server
    can stop it."""
    for event in stops:
        event.set()
    for task in running:
        task.cancel()
    await asyncio.wait(running, timeout=10)
    for pid in injector.stub_pids:
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def verdict(figures: dict[str, Any], max_growth_mb: float) -> list[str]:
    problems = []
    for key in ("lost", "duplicated", "mismatched", "hung"):
        if figures[key]:
            problems.append(f"{figures[key]} {key}")
    if figures["unexplained_errors"]:
        problems.append(f"errors outside every fault's window: {figures['unexplained_errors']}")
    if figures["faults_not_recovered"]:
        problems.append(f"not recovered within {RECOVERY_GIVE_UP_S:.0f} s: {figures['faults_not_recovered']}")
    for kind, fault in figures["faults"].items():
        problems += [f"{kind}: {failure}" for failure in fault["server_failures"]]
    left = figures.get("left_behind", {})
    if left.get("processes") or left.get("shm_files"):
        problems.append(f"left behind once the server stopped: {left}")
    for side in ("server", "client"):
        memory = figures[f"{side}_memory_mb"]
        growth = memory["end_mb"] - memory["warm_mb"]
        if growth > max_growth_mb:
            problems.append(f"{side} memory grew {growth:.1f} MiB (limit {max_growth_mb} MiB)")
    return problems


def judge(figures: dict[str, Any], max_growth_mb: float) -> int:
    """The run's exit code, and its verdict put in `figures`: 0 PASS, 1 FAIL (why), 130 for a run
    SIGINT ended, whose verdict says so before what its figures so far show."""
    problems = verdict(figures, max_growth_mb)
    figures["verdict"] = "PASS" if not problems else "FAIL: " + "; ".join(problems)
    if figures.get("interrupted"):
        figures["verdict"] = f"INTERRUPTED after {figures['duration_s']:g} s: the figures so far; " + figures["verdict"]
        return INTERRUPTED_EXIT
    return 0 if not problems else 1


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
    parser.add_argument(
        "--faults",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="throw faults at random times (default: on; --no-faults for reloads alone)",
    )
    parser.add_argument(
        "--fault-kinds",
        type=lambda text: [kind.strip() for kind in text.split(",") if kind.strip()],
        default=list(KINDS),
        metavar="K1,K2",
        help=f"the faults to choose from (default: all of {','.join(KINDS)}; worker-kill needs --frontend-workers 2+)",
    )
    parser.add_argument(
        "--fault-every", type=float, default=10.0, metavar="SECONDS", help="mean gap between faults (0.5-1.5 x)"
    )
    parser.add_argument("--seed", type=int, help="the faults' random seed (default: a random one, printed)")
    parser.add_argument(
        "--stub-timeout",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="the python backend's execute-timeout-seconds: a stalled stub's batch is given up after this",
    )
    parser.add_argument(
        "--kill-core-at-end", action="store_true", help="kill -9 the server's core as the last fault, under load"
    )
    args = parser.parse_args(argv)
    # SIGINT interrupts the run even when it was started in the background by a shell, which starts
    # it ignored (the run then went on until SIGTERM, which leaves the server behind).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if args.concurrency < 4:
        parser.error("--concurrency must be at least 4 (HTTP, gRPC and stream workers)")
    unknown = sorted(set(args.fault_kinds) - set(KINDS))
    if unknown:
        parser.error(f"--fault-kinds: unknown {', '.join(unknown)}; choose from {', '.join(KINDS)}")
    if args.frontend_workers < 2 and "worker-kill" in args.fault_kinds:
        args.fault_kinds.remove("worker-kill")  # one process: no worker to kill
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(2**32)
    extra = [
        "--model-control-mode", "explicit", "--load-model", MODEL, "--load-model", PY_MODEL,
        "--frontend-workers", str(args.frontend_workers),
        "--backend-config", f"python,execute-timeout-seconds={args.stub_timeout}",
    ]  # fmt: skip
    try:
        with tempfile.TemporaryDirectory(prefix="perfkit-soak-") as tmp:
            repository = soak_repository(ensure_demo_repository(), Path(tmp) / "models")
            with reference_server_process(repository, extra) as server:
                faults = (
                    f"faults {','.join(args.fault_kinds)} every ~{args.fault_every:g} s" if args.faults else "no faults"
                )
                print(
                    f"soak: {args.duration:.0f} s at concurrency {args.concurrency} against {server.http_url}, "
                    f"{faults}, seed {args.seed}",
                    flush=True,
                )
                figures, injector = asyncio.run(soak(server.http_url, server.grpc_url, server.process.pid, args))
    except KeyboardInterrupt:  # before the load started, or a second SIGINT: the server is stopped
        print("soak: interrupted (SIGINT) before it had figures", file=sys.stderr)
        return INTERRUPTED_EXIT
    figures["left_behind"] = leftovers(injector)
    code = judge(figures, args.max_growth_mb)
    print(json.dumps(figures, indent=2))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2) + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
