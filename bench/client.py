"""What does perfkit's Python client cost next to NVIDIA's C++ perf_analyzer? Both measure the same
model on one reference server, over HTTP and gRPC, at each concurrency, one after the other, with
the same flags; the tables give throughput, p50/p99 and client CPU per request side by side, the
agreement of throughput (5%) and p50 (10%) with perf_analyzer's (issue #7 target 3), and each
tool's highest throughput over the levels (target 2, concurrency half; bench/request_rate.py has
the request-rate half).

    PERFKIT_PEERS=DIR python bench/client.py [--model identity] [--concurrency 1,2,4,8] [--window-ms 2000] [--repeats 1]

How client CPU is measured: each tool runs as a child process of this script (perfkit as
`python -m perfkit sweep`), alone, and its user + system CPU is the RUSAGE_CHILDREN delta around the
run. The server is a separate process (started here, still running, so not in RUSAGE_CHILDREN).
Requests are counted by the server (its statistics extension, successful requests of the model,
before and after each run), so every request a tool sent counts, warm-up and unstable windows
included, whatever the tool reports. A run's CPU also holds a fixed start-up cost (perfkit: the
interpreter, imports and report files; perf_analyzer: little), so per tool and protocol a short
and a long run at concurrency 1 give the fixed cost (the intercept of CPU against requests), and
"CPU us/req" is (run CPU - fixed cost) / requests; the raw table keeps whole-run figures.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import itertools
import os
import re
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import TimedRun, machine, peers_dir, ratio, served_run

from perfkit.target import ServerProcess, reference_server_process
from v2kit.demo import build_demo_repository

TOOLS = ("perfkit", "perf_analyzer")
# --pin-cores: on a small machine the tools otherwise take CPU from the server, and the cheaper tool
# leaves it more, so their throughputs differ for a reason that is not measurement.
SERVER_CORE, TOOL_CORE = 0, 1
PINNED = False
SHAPES = {"identity": ("--shape", "INPUT0:256")}  # the identity's input is FP32 [-1]: 1 KiB per request


@dataclass(frozen=True, slots=True)
class Run:
    tool: str
    protocol: str
    concurrency: int
    window_ms: int
    exit_code: int
    infer_per_s: float
    p50_us: float
    p99_us: float
    reported_requests: int  # what the tool counted in the windows it reports
    server_requests: int  # what the server served during the whole run
    cpu_s: float
    wall_s: float
    server_cpu_s: float


def tool_command(
    tool: str, peers: Path, url: str, protocol: str, model: str, concurrency: int, window: list[str], out: Path
) -> list[str]:
    common = ["-m", model, "-u", url, "-i", protocol, *SHAPES.get(model, ()), "--concurrency-range", str(concurrency)]
    pin = ["taskset", "-c", str(TOOL_CORE)] if PINNED else []
    if tool == "perf_analyzer":
        return [*pin, str(peers / "bin" / "perf_analyzer"), *common, *window, "-f", str(out / "pa.csv")]
    return [
        *pin, sys.executable, "-m", "perfkit", "sweep", *common, *window,
        "-f", str(out / "perfkit.csv"), "--report-dir", str(out / "reports"), "--quiet",
    ]  # fmt: skip


def pin_process(pid: int, core: int) -> None:
    """Every thread of `pid` (and so the threads it starts later) on `core` alone."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        os.sched_setaffinity(int(task.name), {core})


def reported_requests(tool: str, timed: TimedRun, out: Path) -> int:
    if tool == "perf_analyzer":
        match = re.search(r"Request count: (\d+)", timed.result.stdout)
        return int(match.group(1)) if match else 0
    from perfkit.results.model import read_sweep

    paths = sorted((out / "reports").glob("sweep-*.json"))
    return sum(level.request_count for level in read_sweep(paths[-1]).levels) if paths else 0


def measure(
    tool: str,
    peers: Path,
    server: ServerProcess,
    protocol: str,
    model: str,
    concurrency: int,
    window_ms: int,
    tmp: Path,
) -> Run:
    """One run of `tool`; again, up to twice, when it reported nothing (perf_analyzer exits 2
    without a CSV row when it finds no stable measurement, where perfkit reports the level flagged)."""
    http_url = server.http_url
    url = http_url if protocol == "http" else server.grpc_url
    # Same flags for both: -s 50 so that a noisy shared machine still stabilises within -r 5.
    window = ["-p", str(window_ms), "-s", "50", "-r", "5"]
    for _ in range(3):
        out = Path(tempfile.mkdtemp(dir=tmp))
        command = tool_command(tool, peers, url, protocol, model, concurrency, window, out)
        served = served_run(command, http_url, model, server.process.pid, timeout_s=300)
        timed, server_requests, server_cpu_s = served.timed, served.server_requests, served.server_cpu_s
        csv_path = out / ("pa.csv" if tool == "perf_analyzer" else "perfkit.csv")
        row: dict[str, str] = {}
        if csv_path.exists():
            with csv_path.open(newline="") as handle:
                rows = list(csv.DictReader(handle))
            row = rows[0] if rows else {}
        if row:
            break
        print(f"{tool} {protocol} c={concurrency} exited {timed.result.returncode}:\n"
              f"{timed.result.stdout[-1500:]}\n{timed.result.stderr[-1500:]}", file=sys.stderr)  # fmt: skip
    return Run(
        tool=tool,
        protocol=protocol,
        concurrency=concurrency,
        window_ms=window_ms,
        exit_code=timed.result.returncode,
        infer_per_s=float(row.get("Inferences/Second", "nan")),
        p50_us=float(row.get("p50 latency", "nan")),
        p99_us=float(row.get("p99 latency", "nan")),
        reported_requests=reported_requests(tool, timed, out),
        server_requests=server_requests,
        cpu_s=timed.cpu_s,
        wall_s=timed.wall_s,
        server_cpu_s=server_cpu_s,
    )


def fixed_cost_s(short: Run, long: Run) -> float:
    """CPU that does not grow with requests: the intercept of the line through two runs."""
    if long.server_requests <= short.server_requests:
        return 0.0
    per_request = (long.cpu_s - short.cpu_s) / (long.server_requests - short.server_requests)
    return max(0.0, short.cpu_s - per_request * short.server_requests)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="identity", help="a demo model: identity (default) or mlp")
    parser.add_argument("--concurrency", default="1,2,4,8", help="comma-separated levels")
    parser.add_argument("--protocols", default="http,grpc")
    parser.add_argument("--window-ms", type=int, default=2000, help="-p for both tools")
    parser.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="measure every level this many times, alternating tools; tables take medians",
    )
    parser.add_argument(
        "--pin-cores",
        action="store_true",
        help=f"the server on CPU {SERVER_CORE}, each tool on CPU {TOOL_CORE}: no CPU shared between them",
    )
    args = parser.parse_args(argv)
    global PINNED
    PINNED = args.pin_cores
    peers = peers_dir()
    levels = [int(c) for c in args.concurrency.split(",")]
    protocols = args.protocols.split(",")
    runs: list[Run] = []
    fixed: dict[tuple[str, str], float] = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        repository = build_demo_repository(tmp / "models")
        with reference_server_process(repository) as server:
            if PINNED:
                pin_process(server.process.pid, SERVER_CORE)
            # Warm the server (sessions, connections) before anything is measured.
            measure("perf_analyzer", peers, server, "http", args.model, max(levels), 500, tmp)
            for protocol in protocols:
                for tool in TOOLS:
                    print(f"fixed cost: {tool} {protocol} ...", file=sys.stderr, flush=True)
                    short = measure(tool, peers, server, protocol, args.model, 1, max(100, args.window_ms // 10), tmp)
                    long = measure(tool, peers, server, protocol, args.model, 1, args.window_ms, tmp)
                    fixed[(tool, protocol)] = fixed_cost_s(short, long)
                    runs += [short, long]
                for repeat, (index, concurrency) in itertools.product(range(args.repeats), enumerate(levels)):
                    # Alternate which tool goes first, so that neither always meets a warmer server.
                    for tool in TOOLS if (index + repeat) % 2 else TOOLS[::-1]:
                        if concurrency == 1 and repeat == 0:
                            continue  # measured above
                        print(
                            f"measuring: {tool} {protocol} concurrency {concurrency} ...", file=sys.stderr, flush=True
                        )
                        runs.append(
                            measure(tool, peers, server, protocol, args.model, concurrency, args.window_ms, tmp)
                        )
    print_tables(runs, fixed, args, levels, protocols)
    return 0


def markdown_table(title: str, headings: list[str], align: str, rows: list[list[str]]) -> list[str]:
    """`title`, a blank line, then a Markdown table; `align` has an l (left) or r (right) per column."""
    return [
        title,
        "",
        "| " + " | ".join(headings) + " |",
        "|" + "".join("---:|" if a == "r" else "---|" for a in align),
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


def agreement_table(main_runs: dict[tuple[str, str, int], Run], levels: list[int], protocols: list[str]) -> list[str]:
    """Issue #7 target 3: perfkit's throughput within 5% of perf_analyzer's and its p50 within 10%."""
    rows: list[list[str]] = []
    for protocol in protocols:
        for concurrency in levels:
            pk, pa = main_runs[("perfkit", protocol, concurrency)], main_runs[("perf_analyzer", protocol, concurrency)]
            rows.append([
                protocol, str(concurrency), f"{pk.infer_per_s:.0f}", f"{pa.infer_per_s:.0f}",
                ratio(pk.infer_per_s, pa.infer_per_s), verdict(pk.infer_per_s, pa.infer_per_s, 0.05),
                f"{pk.p50_us / 1000:.3f}", f"{pa.p50_us / 1000:.3f}", ratio(pk.p50_us, pa.p50_us),
                verdict(pk.p50_us, pa.p50_us, 0.10),
            ])  # fmt: skip
    return markdown_table(
        "agreement (target: throughput within 5%, p50 within 10% of perf_analyzer's):",
        ["protocol", "concurrency", "infer/s perfkit", "infer/s PA", "ratio", "within 5%", "p50 ms perfkit",
         "p50 ms PA", "ratio", "within 10%"],
        "lrrrrlrrrl",
        rows,
    )  # fmt: skip


def capacity_table(main_runs: dict[tuple[str, str, int], Run], levels: list[int], protocols: list[str]) -> list[str]:
    """Issue #7 target 2, concurrency half: perfkit's highest throughput at least perf_analyzer's."""
    rows: list[list[str]] = []
    for protocol in protocols:
        best = {}
        for tool in TOOLS:
            candidates = [main_runs[(tool, protocol, c)] for c in levels]
            best[tool] = max(candidates, key=lambda run: run.infer_per_s if run.infer_per_s == run.infer_per_s else 0)
        pk, pa = best["perfkit"], best["perf_analyzer"]
        met = "PASS" if pk.infer_per_s >= pa.infer_per_s else "FAIL"
        ahead = sum(
            main_runs[("perfkit", protocol, c)].infer_per_s >= main_runs[("perf_analyzer", protocol, c)].infer_per_s
            for c in levels
        )
        rows.append([
            protocol, f"{pk.infer_per_s:.0f}", str(pk.concurrency), f"{pa.infer_per_s:.0f}", str(pa.concurrency),
            ratio(pk.infer_per_s, pa.infer_per_s), met, f"{ahead}/{len(levels)}",
        ])  # fmt: skip
    return markdown_table(
        "client capacity (target: perfkit's highest infer/s >= perf_analyzer's at the same concurrency):",
        ["protocol", "highest infer/s perfkit", "at concurrency", "highest infer/s PA", "at concurrency", "ratio",
         "met", "levels where perfkit >= PA"],
        "lrrrrrlr",
        rows,
    )  # fmt: skip


def median_runs(runs: list[Run]) -> dict[tuple[str, str, int], Run]:
    """Per tool, protocol and concurrency, the repeat with the median throughput, carrying the median
    throughput and the median p50/p99 of all repeats (--repeats): one noisy run on a shared machine
    then moves no verdict."""
    groups: dict[tuple[str, str, int], list[Run]] = {}
    for run in runs:
        groups.setdefault((run.tool, run.protocol, run.concurrency), []).append(run)
    chosen = {}
    for key, group in groups.items():
        ordered = sorted(group, key=lambda run: run.infer_per_s if run.infer_per_s == run.infer_per_s else 0)
        chosen[key] = dataclasses.replace(
            ordered[len(ordered) // 2],
            p50_us=statistics.median(run.p50_us for run in group),
            p99_us=statistics.median(run.p99_us for run in group),
        )
    return chosen


def verdict(value: float, reference: float, tolerance: float) -> str:
    if not (value == value and reference == reference and reference):
        return "n/a"
    return "PASS" if abs(value / reference - 1) <= tolerance else "FAIL"


def print_tables(runs: list[Run], fixed: dict[tuple[str, str], float], args: argparse.Namespace,
                 levels: list[int], protocols: list[str]) -> None:  # fmt: skip
    def steady(run: Run) -> float:
        requests = run.server_requests
        return (run.cpu_s - fixed[(run.tool, run.protocol)]) / requests * 1e6 if requests else float("nan")

    main_runs = median_runs([r for r in runs if r.window_ms == args.window_ms])
    pinning = f"; server pinned to CPU {SERVER_CORE}, tools to CPU {TOOL_CORE}" if PINNED else ""
    print(f"\nreference server, demo `{args.model}`, concurrency mode, -p {args.window_ms} -s 50 -r 5"
          f"{pinning}; {machine(peers_dir())} (at the end)\n")  # fmt: skip
    print("| protocol | concurrency | infer/s perfkit | infer/s PA | ratio | p50 ms perfkit | p50 ms PA | "
          "p99 ms perfkit | p99 ms PA | CPU us/req perfkit | CPU us/req PA | ratio |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for protocol in protocols:
        for concurrency in levels:
            pk = main_runs[("perfkit", protocol, concurrency)]
            pa = main_runs[("perf_analyzer", protocol, concurrency)]
            print(
                f"| {protocol} | {concurrency} | {pk.infer_per_s:.0f} | {pa.infer_per_s:.0f} | "
                f"{ratio(pk.infer_per_s, pa.infer_per_s)} | {pk.p50_us / 1000:.2f} | {pa.p50_us / 1000:.2f} | "
                f"{pk.p99_us / 1000:.2f} | {pa.p99_us / 1000:.2f} | {steady(pk):.0f} | {steady(pa):.0f} | "
                f"{ratio(steady(pk), steady(pa))} |"
            )
    print(
        "\n".join(
            ["", *agreement_table(main_runs, levels, protocols), "", *capacity_table(main_runs, levels, protocols)]
        )
    )
    print("\nfixed CPU per run (start-up, and perfkit's report files), from the short and long runs at concurrency 1:")
    print("\n| tool | " + " | ".join(protocols) + " |\n|---|" + "---:|" * len(protocols))
    for tool in TOOLS:
        print(f"| {tool} | " + " | ".join(f"{fixed[(tool, p)] * 1000:.0f} ms" for p in protocols) + " |")
    print("\nraw figures, every run (server requests: counted by the server over the whole run):\n")
    print("| tool | protocol | concurrency | -p ms | exit | wall s | client CPU s | server requests | "
          "reported requests | whole-run client CPU us/req | server CPU us/req |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for run in runs:
        n = run.server_requests or 1
        print(
            f"| {run.tool} | {run.protocol} | {run.concurrency} | {run.window_ms} | {run.exit_code} | "
            f"{run.wall_s:.1f} | {run.cpu_s:.2f} | {run.server_requests} | {run.reported_requests} | "
            f"{run.cpu_s / n * 1e6:.0f} | {run.server_cpu_s / n * 1e6:.0f} |"
        )


if __name__ == "__main__":
    sys.exit(main())
