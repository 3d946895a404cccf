"""What does perfkit's streaming client (`--streaming`, gRPC ModelStreamInfer, every response timed)
cost next to perf_analyzer's? Both stream to the same decoupled models on one reference server, one
after the other, with the same flags, at each concurrency; the table gives throughput, responses per
second, p50 and client CPU per request and per response side by side.

    PERFKIT_PEERS=DIR python bench/streaming.py [--concurrency 1,4] [--window-ms 2000]

Models: `identity_decoupled`, the demo ONNX identity made decoupled (one response per request, then
the final flag alone: the server does almost nothing, so the client's cost per stream message shows),
and `repeat` (tests/decoupled_models.py, a python-backend model: IN of 8 zeros gives 8 responses
per request). CPU is measured as in bench/client.py: each tool is a child process run alone, its
user + system CPU the RUSAGE_CHILDREN delta around it, requests counted by the server's statistics
extension; a short and a long run at concurrency 1 give each tool's fixed cost (interpreter, start-up,
report files), subtracted before dividing by the requests.
"""

from __future__ import annotations

import argparse
import csv
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.decoupled_models

from _harness import machine, peers_dir, perfkit_command, ratio, served_run

from perfkit.target import ServerProcess, reference_server_process
from tests.decoupled_models import write_decoupled_models
from v2kit.demo import build_demo_repository

TOOLS = ("perfkit", "perf_analyzer")
MODELS = {"identity_decoupled": ("--shape", "INPUT0:256"), "repeat": ("--shape", "IN:8", "--input-data", "zero")}
RESPONSES = {"identity_decoupled": 1, "repeat": 8}


@dataclass(frozen=True, slots=True)
class Run:
    tool: str
    model: str
    concurrency: int
    infer_per_s: float
    responses_per_s: float
    p50_us: float
    requests: int  # counted by the server
    cpu_s: float


def repository(root: Path) -> Path:
    models = build_demo_repository(root)
    for unused in ("mlp", "convnet", "mlp_pipeline", "preprocess", "python_linear"):
        shutil.rmtree(models / unused, ignore_errors=True)
    decoupled = models / "identity_decoupled"
    shutil.copytree(models / "identity", decoupled)
    config = (models / "identity" / "config.pbtxt").read_text().replace('"identity"', '"identity_decoupled"')
    (decoupled / "config.pbtxt").write_text(config + "\nmodel_transaction_policy { decoupled: true }\n")
    write_decoupled_models(models)
    return models


def measure(
    tool: str, peers: Path, server: ServerProcess, model: str, concurrency: int, window_ms: int, tmp: Path
) -> Run:
    out = Path(tempfile.mkdtemp(dir=tmp))
    flags = [*MODELS[model], "--streaming", "--concurrency-range", str(concurrency), "-p", str(window_ms), "-s", "50",
             "-r", "5"]  # fmt: skip
    if tool == "perf_analyzer":
        command = [str(peers / "bin" / "perf_analyzer"), "-m", model, "-u", server.grpc_url, "-i", "grpc", *flags,
                   "-f", str(out / "pa.csv")]  # fmt: skip
    else:
        command = perfkit_command(server.grpc_url, model, "grpc", flags, out)
    served = served_run(command, server.http_url, model, server.process.pid, timeout_s=300)
    csv_path = out / ("pa.csv" if tool == "perf_analyzer" else "perfkit.csv")
    row = next(csv.DictReader(csv_path.open(newline="")), {}) if csv_path.exists() else {}
    if not row:
        print(f"{tool} {model} c={concurrency}: no figures\n{served.timed.result.stdout[-800:]}", file=sys.stderr)
    return Run(
        tool, model, concurrency, float(row.get("Inferences/Second", "nan")),
        float(row.get("Response Throughput", "nan")), float(row.get("p50 latency", "nan")),
        served.server_requests, served.timed.cpu_s,
    )  # fmt: skip


def fixed_cost_s(short: Run, long: Run) -> float:
    """CPU that does not grow with requests: the intercept of the line through two runs."""
    if long.requests <= short.requests:
        return 0.0
    per_request = (long.cpu_s - short.cpu_s) / (long.requests - short.requests)
    return max(0.0, short.cpu_s - per_request * short.requests)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", default="1,4", help="comma-separated levels")
    parser.add_argument("--window-ms", type=int, default=2000, help="-p for both tools")
    args = parser.parse_args(argv)
    peers = peers_dir()
    levels = [int(c) for c in args.concurrency.split(",")]
    runs: list[Run] = []
    fixed: dict[tuple[str, str], float] = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        with reference_server_process(repository(tmp / "models")) as server:
            for model in MODELS:
                measure("perf_analyzer", peers, server, model, 1, 300, tmp)  # warm the server
                for tool in TOOLS:
                    print(f"fixed cost: {tool} {model} ...", file=sys.stderr, flush=True)
                    short = measure(tool, peers, server, model, 1, max(100, args.window_ms // 10), tmp)
                    fixed[(tool, model)] = fixed_cost_s(
                        short, measure(tool, peers, server, model, 1, args.window_ms, tmp)
                    )
                for concurrency in levels:
                    for tool in TOOLS if concurrency % 2 else TOOLS[::-1]:
                        print(f"measuring: {tool} {model} concurrency {concurrency} ...", file=sys.stderr, flush=True)
                        runs.append(measure(tool, peers, server, model, concurrency, args.window_ms, tmp))
    print(f"streaming client cost ({machine(peers)}; -p {args.window_ms} -s 50 -r 5, gRPC --streaming):\n")
    print(
        "| model | concurrency | tool | infer/s | responses/s | p50 us | CPU us/req | CPU us/response | perfkit/PA CPU |"
    )
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    per_request: dict[tuple[str, str, int], float] = {}
    for run in runs:
        cost = (run.cpu_s - fixed[(run.tool, run.model)]) / run.requests * 1e6 if run.requests else float("nan")
        per_request[(run.tool, run.model, run.concurrency)] = cost
    for run in runs:
        cost = per_request[(run.tool, run.model, run.concurrency)]
        versus = (
            ratio(cost, per_request[("perf_analyzer", run.model, run.concurrency)]) if run.tool == "perfkit" else ""
        )
        print(f"| {run.model} | {run.concurrency} | {run.tool} | {run.infer_per_s:.0f} | {run.responses_per_s:.0f} | "
              f"{run.p50_us:.0f} | {cost:.0f} | {cost / RESPONSES[run.model]:.0f} | {versus} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
