"""Python-backend models and ensembles: the reference server next to real Triton 2.51 on the same
model folders, measured by real perf_analyzer in one invocation.

    PERFKIT_PEERS=DIR python bench/python_backend_vs_triton.py [-i http|grpc] [--concurrency 1,8]
        [--window-ms 2000] [--elements 16]

One repository, served by both servers unchanged:

- `py_identity` / `py_identity_plain`: a python-backend identity (`model.py` copying INPUT0 to OUTPUT0
  through pb_utils), FP32 [--elements], max_batch_size 64, with and without dynamic batching
  (max_queue_delay_microseconds 100).
- `ensemble` / `ensemble_plain`: two steps, each the identity above (with and without batching).
- `mlp_ensemble` / `mlp_ensemble_plain` (measured at the highest concurrency only): a compute-bound
  pair, the identity on FP32 [256] then the demo MLP (256-1024-1024-10) run by onnxruntime inside a
  python model (`perfkit.testing.models.write_onnx_wrapper`), both steps with and without dynamic
  batching: whether batching the composing models pays through an ensemble when there is work to
  batch.

Per model and concurrency: infer/s, p50 and p99 (perf_analyzer's CSV), the server's request time per
request (statistics extension: success.ns / success.count, from the core receiving the parsed request to
the response leaving it; for an ensemble, the ensemble's own entry), and server CPU per request (the
server process and its children: both servers run one stub process per python instance). The model does
no work, so all of these are per-request overhead: the stub crossing, pb_utils, and for the ensemble the
step hand-off. Goal: ours no more than Triton's. The last table is the batching gain through the
ensemble: infer/s with dynamic batching of the composing model over without, at the highest concurrency.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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

from perfkit.testing.models import write_onnx_wrapper
from v2kit.demo import build_demo_repository

SERVERS = ("ours", "triton")
MODELS = ("py_identity", "py_identity_plain", "ensemble", "ensemble_plain")
MLP_MODELS = ("mlp_ensemble", "mlp_ensemble_plain")
MLP_ELEMENTS = 256

_IDENTITY_PY = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", data)]))
        return responses
"""


def _identity_config(name: str, elements: int, batching: bool) -> str:
    lines = [
        f'name: "{name}"',
        'backend: "python"',
        "max_batch_size: 64",
        f'input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {elements} ] }} ]',
        f'output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {elements} ] }} ]',
        "instance_group [ { count: 1 kind: KIND_CPU } ]",
    ]
    if batching:
        lines.append("dynamic_batching { max_queue_delay_microseconds: 100 }")
    return "\n".join(lines) + "\n"


def _ensemble_config(name: str, steps: tuple[str, str], elements: int, out_elements: int | None = None) -> str:
    def step(model: str, source: str, target: str) -> str:
        return (
            f'{{ model_name: "{model}" model_version: -1 '
            f'input_map {{ key: "INPUT0" value: "{source}" }} output_map {{ key: "OUTPUT0" value: "{target}" }} }}'
        )

    first, second = steps
    return (
        f'name: "{name}"\nplatform: "ensemble"\nmax_batch_size: 64\n'
        f'input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {elements} ] }} ]\n'
        f'output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {out_elements or elements} ] }} ]\n'
        f"ensemble_scheduling {{ step [ {step(first, 'INPUT0', 'middle')}, {step(second, 'middle', 'OUTPUT0')} ] }}\n"
    )


def write_repository(root: Path, elements: int, mlp_onnx: Path) -> Path:
    for name, width, batching in (
        ("py_identity", elements, True),
        ("py_identity_plain", elements, False),
        ("pre", MLP_ELEMENTS, True),
        ("pre_plain", MLP_ELEMENTS, False),
    ):
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(_IDENTITY_PY)
        (root / name / "config.pbtxt").write_text(_identity_config(name, width, batching))
    for name, batching in (("mlp_py", True), ("mlp_py_plain", False)):
        write_onnx_wrapper(
            root, name, mlp_onnx, max_batch_size=64, dynamic_batching=batching, max_queue_delay_us=100,
            allow_spinning=False,
        )  # fmt: skip
    ensembles = {
        "ensemble": (("py_identity", "py_identity"), elements, None),
        "ensemble_plain": (("py_identity_plain", "py_identity_plain"), elements, None),
        "mlp_ensemble": (("pre", "mlp_py"), MLP_ELEMENTS, 10),
        "mlp_ensemble_plain": (("pre_plain", "mlp_py_plain"), MLP_ELEMENTS, 10),
    }
    for name, (steps, width, out_width) in ensembles.items():
        (root / name / "1").mkdir(parents=True)
        (root / name / "config.pbtxt").write_text(_ensemble_config(name, steps, width, out_width))
    return root


@dataclass(frozen=True, slots=True)
class Run:
    server: str
    model: str
    concurrency: int
    infer_per_s: float
    p50_us: float
    p99_us: float
    times: ServerTimes
    server_cpu_s: float

    @property
    def cpu_us(self) -> float:
        return self.server_cpu_s / self.times.success_count * 1e6 if self.times.success_count else math.nan


def measure(
    peers: Path,
    endpoint: Endpoint,
    server: str,
    model: str,
    protocol: str,
    concurrency: int,
    window_ms: int,
    tmp: Path,
    stability: int = 25,
) -> Run:
    url = endpoint.http_url if protocol == "http" else endpoint.grpc_url
    args = [
        "-i",
        protocol,
        "--concurrency-range",
        str(concurrency),
        "-p",
        str(window_ms),
        "-s",
        str(stability),
        "-r",
        "10",
    ]
    before = server_times(endpoint.http_url, model)
    cpu_before = tree_cpu_s(endpoint.pid)
    (row,) = perf_analyzer(peers, model, url, tmp / "pa.csv", args, attempts=3)
    cpu_s = tree_cpu_s(endpoint.pid) - cpu_before
    times = server_times(endpoint.http_url, model) - before
    return Run(
        server, model, concurrency, float(row["Inferences/Second"]), float(row["p50 latency"]),
        float(row["p99 latency"]), times, cpu_s,
    )  # fmt: skip


def render(
    runs: list[Run], protocol: str, levels: list[int], window_ms: int, elements: int, host: str, stability: int
) -> str:
    by_key = {(r.server, r.model, r.concurrency): r for r in runs}
    lines = [
        f"python-backend identity (FP32 [{elements}]) and a two-step ensemble of it, reference server vs Triton "
        f"2.51, same model folders, perf_analyzer -i {protocol} -p {window_ms} -s {stability} -r 10; {host}",
        "",
        "| model | concurrency | infer/s ours | infer/s Triton | p50 us ours | p50 us Triton | p99 us ours "
        "| p99 us Triton | request us/req ours | request us/req Triton | ratio (<= 1) | server CPU us/req ours "
        "| server CPU us/req Triton | ratio (<= 1) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for model in MODELS:
        for concurrency in levels:
            if ("ours", model, concurrency) not in by_key:
                continue  # not chosen (--models)
            ours, triton = by_key[("ours", model, concurrency)], by_key[("triton", model, concurrency)]
            request_ours = ours.times.per_request_us("request_ns")
            request_triton = triton.times.per_request_us("request_ns")
            lines.append(
                f"| {model} | {concurrency} | {ours.infer_per_s:.0f} | {triton.infer_per_s:.0f} | "
                f"{ours.p50_us:.0f} | {triton.p50_us:.0f} | {ours.p99_us:.0f} | {triton.p99_us:.0f} | "
                f"{request_ours:.0f} | {request_triton:.0f} | {ratio(request_ours, request_triton)} | "
                f"{ours.cpu_us:.0f} | {triton.cpu_us:.0f} | {ratio(ours.cpu_us, triton.cpu_us)} |"
            )
    top = max(levels)
    gains = (
        ("ensemble", "ensemble_plain", "dynamic batching of the composing model, through the ensemble", False),
        (
            "mlp_ensemble",
            "mlp_ensemble_plain",
            "the same through a compute-bound ensemble (identity [256], then the demo MLP in onnxruntime)",
            True,
        ),
    )
    for batching, plain, title, with_p50 in gains:
        if all((server, model, top) in by_key for server in SERVERS for model in (batching, plain)):
            lines += _gain_table(by_key, top, batching, plain, title, with_p50)
    return "\n".join(lines)


def _gain_table(
    by_key: dict[tuple[str, str, int], Any], top: int, batching: str, plain: str, title: str, with_p50: bool
) -> list[str]:
    """Each server's throughput through `batching` over `plain` at concurrency `top`."""
    p50_head, p50_rule = (" p50 us batching | p50 us plain |", "---:|---:|") if with_p50 else ("", "")
    lines = [
        "",
        f"{title}, concurrency {top}:",
        "",
        f"| server | infer/s {batching} (batching) | infer/s {plain} | gain |{p50_head}",
        f"|---|---:|---:|---:|{p50_rule}",
    ]
    for server in SERVERS:
        with_batching, without = by_key[(server, batching, top)], by_key[(server, plain, top)]
        p50 = f" {with_batching.p50_us:.0f} | {without.p50_us:.0f} |" if with_p50 else ""
        lines.append(
            f"| {server} | {with_batching.infer_per_s:.0f} | {without.infer_per_s:.0f} | "
            f"{ratio(with_batching.infer_per_s, without.infer_per_s)} |{p50}"
        )
    return lines



def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-i", "--protocol", choices=("http", "grpc"), default="http")
    parser.add_argument("--concurrency", default="1,8", help="comma-separated levels")
    parser.add_argument("--window-ms", type=int, default=2000, help="perf_analyzer -p")
    parser.add_argument("--elements", type=int, default=16, help="FP32 elements per request")
    parser.add_argument(
        "--stability", type=int, default=25, help="perf_analyzer -s: a loaded machine may need more (percent)"
    )
    parser.add_argument(
        "--models", default=",".join((*MODELS, *MLP_MODELS)), help="comma-separated subset of the models (default: all)"
    )
    args = parser.parse_args(argv)
    chosen = set(args.models.split(","))
    unknown = chosen - {*MODELS, *MLP_MODELS}
    if unknown:
        parser.error(f"unknown model(s) {sorted(unknown)}; choose from {', '.join((*MODELS, *MLP_MODELS))}")
    models = [m for m in MODELS if m in chosen]
    mlp_models = [m for m in MLP_MODELS if m in chosen]
    peers = peers_dir()
    levels = [int(c) for c in args.concurrency.split(",")]
    runs: list[Run] = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        mlp_onnx = build_demo_repository(tmp / "demo") / "mlp" / "1" / "model.onnx"
        repository = write_repository(tmp / "repository", args.elements, mlp_onnx)
        with both_servers(peers, repository, repository) as endpoints:
            for server in SERVERS:  # warm-up: stubs, sessions, connections
                for model in (*models, *mlp_models):
                    try:
                        measure(peers, endpoints[server], server, model, args.protocol, max(levels), 500, tmp, 100)
                    except RuntimeError:
                        pass  # a warm-up needs no stable figure, only the requests
            step = 0
            for model in models:
                for concurrency in levels:
                    # Alternate which server goes first, so that neither always follows the same one.
                    for server in SERVERS if step % 2 == 0 else SERVERS[::-1]:
                        print(f"measuring: {server} {model} c={concurrency} ...", file=sys.stderr, flush=True)
                        runs.append(
                            measure(
                                peers,
                                endpoints[server],
                                server,
                                model,
                                args.protocol,
                                concurrency,
                                args.window_ms,
                                tmp,
                                args.stability,
                            )  # fmt: skip
                        )
                    step += 1
            for model in mlp_models:
                for server in SERVERS if step % 2 == 0 else SERVERS[::-1]:
                    print(f"measuring: {server} {model} c={max(levels)} ...", file=sys.stderr, flush=True)
                    runs.append(
                        measure(
                            peers,
                            endpoints[server],
                            server,
                            model,
                            args.protocol,
                            max(levels),
                            args.window_ms,
                            tmp,
                            args.stability,
                        )  # fmt: skip
                    )
                step += 1
    print()
    print(render(runs, args.protocol, levels, args.window_ms, args.elements, machine(peers), args.stability))
    return 0


if __name__ == "__main__":
    sys.exit(main())
