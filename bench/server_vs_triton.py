"""The reference server next to real Triton 2.51 on the same ONNX MLP, measured by real perf_analyzer.

    PERFKIT_PEERS=DIR python bench/server_vs_triton.py [-i http|grpc] [--concurrency 1,2,4,8]
        [--window-ms 2000] [--instances 1] [--max-batch-size 64] [--queue-delay-us 100]
        [--intra-op-threads N] [--allow-spinning 0|1] [--frontend-workers N] [--server-cpus 0[,1...]]
        [--repeats N]

(`--intra-op-threads 1` is the fastest setting for both servers on a 2-core box; see bench/README.md.
`--server-cpus` pins both servers, their threads and child processes to those CPUs, for a scaling
table by cores; perf_analyzer is not pinned.)

One invocation builds the demo MLP (256-1024-1024-10, fp32), writes two model folders for each
server from the same settings, `mlp_batching` (dynamic batching, `max_queue_delay_microseconds`
from --queue-delay-us) and `mlp_plain` (no dynamic batching), both with `max_batch_size`
--max-batch-size and --instances KIND_CPU instances, starts both servers on free loopback ports,
and runs perf_analyzer against each variant at each concurrency, alternating which server goes
first. Both servers keep running during the whole run; the idle one costs next to nothing.
`--repeats N` measures the whole grid N times over, round after round, and reports for each
server and line the round with the median infer/s (the column "ratio per round" keeps each
round's own ratio): on a small shared box either server's figure moves by up to a third between
minutes, and a median of rounds taken minutes apart is steadier than one window.

How Triton serves it: its peers build bundles only the python backend, so the ONNX file is run by
onnxruntime inside a python-backend model (`perfkit.testing.models.write_onnx_wrapper`): one stub
process per instance, and every request crosses from tritonserver to the stub through shared
memory. That is how Triton 2.51 serves this model on this machine; a build with the onnxruntime
backend would not pay the stub crossing.

What is the same for both: the ONNX file, max_batch_size, instance count, dynamic batching and its
queue delay, and onnxruntime's session settings: intra-op threads (--intra-op-threads, default the
usable cores / instances, the wrapper's own rule), 1 inter-op thread, sequential execution, and
thread spinning (--allow-spinning, default 0, our server's own default; the wrapper is told the
same). What differs: Triton runs the session in a separate Python process and converts tensors with
pb_utils; ours runs it in a worker thread of the server process, or, for a lone instance whose
session has one intra-op thread, on the event loop for short batches (reference_server/scheduling/scheduler.py,
"Short runs on the loop").

Columns:

- infer/s, p50, p99: perf_analyzer's CSV (`-p` windows, `-s 25 -r 10`; it runs again, twice at
  most, when it finds no stable measurement).
- overhead us/req (fair): (success.ns - session.run ns) / success.count, the same formula for both
  servers, where "session.run ns" is onnxruntime's `InferenceSession.run` time summed per request
  (a batch's run counted once for each request in it), and success.ns is the statistics
  extension's request time (from the core receiving the parsed request to the response leaving
  it). Everything that is not onnxruntime computing is overhead: queueing (and so the batcher's
  delay), moving tensors to and from the session, the hand-offs between threads or processes.
  Where the run time comes from: ours books exactly `OnnxInstance.run` (session.run and a dict of
  its outputs) as compute_infer, so its statistics extension has it; Triton's python backend books
  the whole stub `execute` call as compute_infer (the shared-memory crossing, pb_utils, numpy and
  the run), so the wrapper times its own `session.run` calls and publishes running totals in a
  file per stub (`write_onnx_wrapper(ort_time_dir=...)`, `read_ort_times`). Both are read before
  and after the whole perf_analyzer run (warm-up and every window).
- overhead us/req (PA): perf_analyzer's own "overhead" formula (its `Avg request latency ...
  (overhead O usec + queue ...)` line) over the same statistics: (success.ns - queue.ns -
  compute_input.ns - compute_infer.ns - compute_output.ns) / success.count, floored at 0. It is
  not comparable between these two servers: Triton's python backend counts the stub crossing as
  compute_infer, which leaves it 0-2 us by construction. Kept for continuity with earlier runs.
  Each server starts its clock when its core has the parsed request, so HTTP/gRPC parsing is in
  neither figure, under either definition.
- server CPU us/req: user + system CPU of the server process and its children (Triton's stubs)
  over the run, per request the server counted.
- batching: our server's infer/s with dynamic batching over without, at the highest concurrency
  (target >= 1.5), and Triton's beside it.
"""

from __future__ import annotations

import argparse
import math
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import (
    Endpoint,
    ServerTimes,
    both_servers,
    machine,
    peers_dir,
    perf_analyzer,
    ratio,
    server_times,
    tree_cpu_s,
)

from perfkit.testing.models import read_ort_times, write_onnx_wrapper
from v2kit.demo import build_demo_repository
from v2kit.runtime.cpus import affinity_cpus

SERVERS = ("ours", "triton")
VARIANTS = {"mlp_batching": True, "mlp_plain": False}


@dataclass(frozen=True, slots=True)
class Settings:
    max_batch_size: int
    instances: int
    queue_delay_us: int
    intra_op_threads: int
    allow_spinning: int


@dataclass(frozen=True, slots=True)
class Run:
    server: str
    model: str
    concurrency: int
    infer_per_s: float
    p50_us: float
    p99_us: float
    times: ServerTimes  # statistics extension delta over the whole perf_analyzer run
    run_ns: int  # onnxruntime session.run time summed per request, same span
    server_cpu_s: float
    round: int = 0

    @property
    def cpu_us(self) -> float:
        """Server CPU per request the server counted."""
        return self.server_cpu_s / self.times.success_count * 1e6 if self.times.success_count else math.nan

    @property
    def run_us(self) -> float:
        """onnxruntime session.run time per request."""
        return self.run_ns / self.times.success_count / 1000 if self.times.success_count else math.nan

    @property
    def fair_overhead_us(self) -> float:
        """Request time minus session.run time, per request: the same formula for both servers."""
        return self.times.per_request_us("request_ns") - self.run_us


def our_config(name: str, batching: bool, settings: Settings) -> str:
    lines = [
        f'name: "{name}"',
        'backend: "onnxruntime"',
        f"max_batch_size: {settings.max_batch_size}",
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 256 ] } ]',
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 10 ] } ]',
        f"instance_group [ {{ count: {settings.instances} kind: KIND_CPU }} ]",
    ]
    if batching:
        lines.append(f"dynamic_batching {{ max_queue_delay_microseconds: {settings.queue_delay_us} }}")
    params = {
        "intra_op_thread_count": settings.intra_op_threads,
        "inter_op_thread_count": 1,
        "allow_spinning": settings.allow_spinning,
    }
    lines += [f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}' for k, v in params.items()]
    return "\n".join(lines) + "\n"


def write_repositories(tmp: Path, settings: Settings) -> tuple[Path, Path]:
    """Our repository and Triton's, each with `mlp_batching` and `mlp_plain` over the same ONNX file.

    Triton's stubs publish their session.run totals under `tmp / "ort_times"`.
    """
    demo = build_demo_repository(tmp / "demo")
    onnx_path = demo / "mlp" / "1" / "model.onnx"
    ours, triton = tmp / "ours", tmp / "triton"
    for name, batching in VARIANTS.items():
        (ours / name / "1").mkdir(parents=True)
        shutil.copyfile(onnx_path, ours / name / "1" / "model.onnx")
        (ours / name / "config.pbtxt").write_text(our_config(name, batching, settings))
        write_onnx_wrapper(
            triton,
            name,
            onnx_path,
            max_batch_size=settings.max_batch_size,
            dynamic_batching=batching,
            instances=settings.instances,
            max_queue_delay_us=settings.queue_delay_us,
            intra_op_threads=settings.intra_op_threads,
            allow_spinning=bool(settings.allow_spinning),
            ort_time_dir=tmp / "ort_times",
        )
    return ours, triton


def run_ns(server: str, times: ServerTimes, tmp: Path, model: str) -> int:
    """Cumulative session.run ns summed per request: ours books exactly that as compute_infer."""
    if server == "ours":
        return times.compute_infer_ns
    return read_ort_times(tmp / "ort_times", model)[1]


def measure(
    peers: Path, endpoint: Endpoint, server: str, model: str, protocol: str, concurrency: int, window_ms: int, tmp: Path,
    round_: int = 0,
) -> Run:  # fmt: skip
    url = endpoint.http_url if protocol == "http" else endpoint.grpc_url
    args = ["-i", protocol, "--concurrency-range", str(concurrency), "-p", str(window_ms), "-s", "25", "-r", "10"]
    times_before = server_times(endpoint.http_url, model)
    run_before = run_ns(server, times_before, tmp, model)
    cpu_before = tree_cpu_s(endpoint.pid)
    (row,) = perf_analyzer(peers, model, url, tmp / "pa.csv", args, attempts=3)
    cpu_s = tree_cpu_s(endpoint.pid) - cpu_before
    times_after = server_times(endpoint.http_url, model)
    times = times_after - times_before
    return Run(
        server=server,
        model=model,
        concurrency=concurrency,
        infer_per_s=float(row["Inferences/Second"]),
        p50_us=float(row["p50 latency"]),
        p99_us=float(row["p99 latency"]),
        times=times,
        run_ns=run_ns(server, times_after, tmp, model) - run_before,
        server_cpu_s=cpu_s,
        round=round_,
    )


def median_runs(runs: list[Run]) -> dict[tuple[str, str, int], Run]:
    """Per (server, model, concurrency), its run with the median infer/s (the lower of two middles)."""
    grouped: dict[tuple[str, str, int], list[Run]] = {}
    for run in runs:
        grouped.setdefault((run.server, run.model, run.concurrency), []).append(run)
    return {key: sorted(group, key=lambda r: r.infer_per_s)[(len(group) - 1) // 2] for key, group in grouped.items()}


def round_ratios(runs: list[Run], model: str, concurrency: int) -> str:
    """Ours over Triton in each round, in round order."""
    by_round = {(r.server, r.round): r.infer_per_s for r in runs if r.model == model and r.concurrency == concurrency}
    rounds = sorted({round_ for _, round_ in by_round})
    return " / ".join(
        ratio(by_round[("ours", n)], by_round[("triton", n)])
        if ("ours", n) in by_round and ("triton", n) in by_round
        else "-"  # a window that never stabilised (skipped)
        for n in rounds
    )


def render(runs: list[Run], settings: Settings, protocol: str, levels: list[int], window_ms: int, host: str) -> str:
    by_key = median_runs(runs)
    rounds = len({r.round for r in runs})
    lines = [
        f"reference server vs Triton 2.51 (python backend running onnxruntime), demo MLP 256-1024-1024-10 fp32, "
        f"perf_analyzer -i {protocol} -p {window_ms} -s 25 -r 10; max_batch_size {settings.max_batch_size}, "
        f"{settings.instances} instance(s), intra-op threads {settings.intra_op_threads}, "
        f"spinning {settings.allow_spinning}; {host}"
        + (f"; the median of {rounds} rounds" if rounds > 1 else ""),
        "",
        "| model | concurrency | infer/s ours | infer/s Triton | ratio (>= 1.5) | ratio per round | p50 ms ours | p50 ms Triton "
        "| p99 ms ours | p99 ms Triton | overhead (fair) us/req ours | overhead (fair) us/req Triton "
        "| ratio (<= 1) | overhead (PA) us/req ours | overhead (PA) us/req Triton | session.run us/req ours "
        "| session.run us/req Triton | compute infer us ours | compute infer us Triton "
        "| server CPU us/req ours | server CPU us/req Triton |",
        "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for model in VARIANTS:
        for concurrency in levels:
            if ("ours", model, concurrency) not in by_key or ("triton", model, concurrency) not in by_key:
                lines.append(f"| {model} | {concurrency} | no stable measurement in any round |")
                continue
            ours, triton = by_key[("ours", model, concurrency)], by_key[("triton", model, concurrency)]
            lines.append(
                f"| {model} | {concurrency} | {ours.infer_per_s:.0f} | {triton.infer_per_s:.0f} | "
                f"{ratio(ours.infer_per_s, triton.infer_per_s)} | {round_ratios(runs, model, concurrency)} | "
                f"{ours.p50_us / 1000:.2f} | "
                f"{triton.p50_us / 1000:.2f} | {ours.p99_us / 1000:.2f} | {triton.p99_us / 1000:.2f} | "
                f"{ours.fair_overhead_us:.0f} | {triton.fair_overhead_us:.0f} | "
                f"{ratio(ours.fair_overhead_us, triton.fair_overhead_us)} | "
                f"{ours.times.overhead_us:.0f} | {triton.times.overhead_us:.0f} | "
                f"{ours.run_us:.0f} | {triton.run_us:.0f} | "
                f"{ours.times.per_request_us('compute_infer_ns'):.0f} | "
                f"{triton.times.per_request_us('compute_infer_ns'):.0f} | {ours.cpu_us:.0f} | {triton.cpu_us:.0f} |"
            )
    top = max(levels)
    lines += [
        "",
        f"dynamic batching over none, concurrency {top} (target for ours >= 1.5):",
        "",
        "| server | infer/s batching | infer/s plain | ratio | queue us/req batching | queue us/req plain |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for server in SERVERS:
        if (server, "mlp_batching", top) not in by_key or (server, "mlp_plain", top) not in by_key:
            continue
        batching, plain = by_key[(server, "mlp_batching", top)], by_key[(server, "mlp_plain", top)]
        lines.append(
            f"| {server} | {batching.infer_per_s:.0f} | {plain.infer_per_s:.0f} | "
            f"{ratio(batching.infer_per_s, plain.infer_per_s)} | {batching.times.per_request_us('queue_ns'):.0f} | "
            f"{plain.times.per_request_us('queue_ns'):.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-i", "--protocol", choices=("http", "grpc"), default="http")
    parser.add_argument("--concurrency", default="1,2,4,8", help="comma-separated levels")
    parser.add_argument("--window-ms", type=int, default=2000, help="perf_analyzer -p")
    parser.add_argument("--instances", type=int, default=1)
    parser.add_argument("--max-batch-size", type=int, default=64)
    parser.add_argument("--queue-delay-us", type=int, default=100, help="max_queue_delay_microseconds")
    parser.add_argument("--intra-op-threads", type=int, help="default: usable cores / instances")
    parser.add_argument("--allow-spinning", type=int, choices=(0, 1), default=0)
    parser.add_argument("--frontend-workers", type=int, default=1, help="our server's --frontend-workers")
    parser.add_argument("--server-cpus", help="comma-separated CPUs both servers may use (default: all)")
    parser.add_argument("--repeats", type=int, default=1, help="rounds over the whole grid; medians are reported")
    args = parser.parse_args(argv)
    cpus = None if args.server_cpus is None else [int(c) for c in args.server_cpus.split(",")]
    peers = peers_dir()
    levels = [int(c) for c in args.concurrency.split(",")]
    intra = args.intra_op_threads or max(1, affinity_cpus() // args.instances)
    settings = Settings(args.max_batch_size, args.instances, args.queue_delay_us, intra, args.allow_spinning)
    runs: list[Run] = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        ours, triton = write_repositories(tmp, settings)
        our_args = ["--frontend-workers", str(args.frontend_workers)]
        with both_servers(peers, ours, triton, our_args=our_args, cpus=cpus) as endpoints:
            for server in SERVERS:  # warm-up: sessions, stubs, connections
                for model in VARIANTS:
                    try:
                        measure(peers, endpoints[server], server, model, args.protocol, max(levels), 500, tmp)
                    except RuntimeError:  # no stable 500 ms windows on a loaded box: warm all the same
                        print(f"warm-up of {server} {model}: no stable measurement", file=sys.stderr)
            step = 0
            for round_ in range(max(1, args.repeats)):
                for model in VARIANTS:
                    for concurrency in levels:
                        # Alternate which server goes first, so that neither always follows the same one.
                        for server in SERVERS if step % 2 == 0 else SERVERS[::-1]:
                            print(f"measuring: round {round_ + 1}, {server} {model} c={concurrency} ...",
                                  file=sys.stderr, flush=True)  # fmt: skip
                            endpoint = endpoints[server]
                            try:
                                runs.append(measure(peers, endpoint, server, model, args.protocol, concurrency,
                                                    args.window_ms, tmp, round_))  # fmt: skip
                            except RuntimeError as exc:  # never stable on a loaded box: the other rounds stand
                                print(f"skipped: {str(exc).splitlines()[0]}", file=sys.stderr, flush=True)
                        step += 1
    print()
    placement = f"our front-end workers {args.frontend_workers}; server CPUs {args.server_cpus or 'all'}"
    print(render(runs, settings, args.protocol, levels, args.window_ms, f"{placement}; {machine(peers)}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
