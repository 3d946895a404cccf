"""Does NVIDIA's model_analyzer profile a model on perfkit-server, as it does on tritonserver? Its
local launch mode (`triton_launch_mode: local`) starts `triton_server_path` with tritonserver's own
command line (`--model-repository R --model-control-mode explicit --http-port P --grpc-port P
--metrics-port P --metrics-interval-ms 1000 --strict-model-config false`), here a shim that only
runs `exec python -m reference_server "$@"`, loads each model-config variant it writes through the
repository API, measures it with perf_analyzer (reading the server's statistics and `nv_*` metrics),
restarts the server between variants, and writes its results (CSV) and reports (HTML, or PDF with
wkhtmltopdf).

model_analyzer pins its own dependencies, so it lives in a virtual environment of its own:

    python3 -m venv /tmp/ma && /tmp/ma/bin/pip install triton-model-analyzer
    PERFKIT_PEERS=DIR python bench/model_analyzer.py [--model-analyzer /tmp/ma/bin/model-analyzer]
        [--model identity] [--keep DIR]

It profiles the demo `identity` (or `--model`) over instance counts 1, max batch sizes 1 and the
default, concurrency 1-2, and prints what model_analyzer wrote; it exits non-zero if model_analyzer
does, or wrote no results.
"""

from __future__ import annotations

import argparse
import csv
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import machine, peers_dir

from v2kit.demo import build_demo_repository

#: The tensor shapes perf_analyzer needs for the demo models with a variable dimension.
SHAPES = {"identity": "INPUT0:16"}


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    return ports


def write_run(work: Path, model: str, perf_analyzer: Path) -> Path:
    """The repository, the server shim and model_analyzer's config, in `work`; the config's path."""
    repository = build_demo_repository(work / "models")
    shim = work / "perfkit-server"
    shim.write_text(f'#!/bin/sh\nexec {sys.executable} -m reference_server "$@"\n')
    shim.chmod(0o755)
    http, grpc, metrics = free_ports(3)
    shape = SHAPES.get(model)
    profile = f"\n  {model}:\n    perf_analyzer_flags:\n      shape: {shape}" if shape else f" {model}"
    config = work / "config.yaml"
    config.write_text(
        f"model_repository: {repository}\n"
        f"profile_models:{profile}\n"
        "triton_launch_mode: local\n"
        f"triton_server_path: {shim}\n"
        f"triton_output_path: {work / 'server.log'}\n"
        f"perf_analyzer_path: {perf_analyzer}\n"
        f"output_model_repository_path: {work / 'output_models'}\n"
        "override_output_model_repository: true\n"
        f"export_path: {work / 'results'}\n"
        f"checkpoint_directory: {work / 'checkpoints'}\n"
        f"triton_http_endpoint: localhost:{http}\n"
        f"triton_grpc_endpoint: localhost:{grpc}\n"
        f"triton_metrics_url: http://localhost:{metrics}/metrics\n"
        "run_config_search_max_concurrency: 2\n"
        "run_config_search_max_instance_count: 1\n"
        "run_config_search_max_model_batch_size: 1\n"
        "collect_cpu_metrics: true\n"
    )
    return config


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-analyzer", type=Path, default=Path("/tmp/ma/bin/model-analyzer"))
    parser.add_argument("--model", default="identity", help="a demo model")
    parser.add_argument("--keep", type=Path, help="work in DIR and keep it (default: a temporary folder)")
    args = parser.parse_args()
    if not args.model_analyzer.exists():
        parser.error(f"--model-analyzer {args.model_analyzer}: not found; see this script's docstring to install it")
    peers = peers_dir()
    work = args.keep or Path(tempfile.mkdtemp(prefix="perfkit-model-analyzer-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        config = write_run(work, args.model, peers / "bin" / "perf_analyzer")
        started = time.monotonic()
        run = subprocess.run(
            [str(args.model_analyzer), "profile", "-f", str(config)],
            cwd=work, capture_output=True, text=True, timeout=1800,
            env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"},
        )  # fmt: skip
        took = time.monotonic() - started
        results = work / "results" / "results" / "metrics-model-inference.csv"
        print(f"## model_analyzer profile on perfkit-server ({machine(peers)})\n")
        print(f"model_analyzer exit {run.returncode} after {took:.0f} s; server starts: ", end="")
        log = work / "server.log"
        print(log.read_text().count("Server ready") if log.exists() else 0)
        if results.exists():
            rows = list(csv.reader(results.open()))
            print("\n| " + " | ".join(rows[0]) + " |\n|" + " --- |" * len(rows[0]))
            for row in filter(None, rows[1:]):
                print("| " + " | ".join(row) + " |")
        reports = sorted(str(p.relative_to(work)) for p in (work / "results" / "reports").rglob("*.*"))
        print("\nreports: " + (", ".join(reports) or "none"))
        if run.returncode != 0 or not results.exists():
            print(run.stdout[-4000:], run.stderr[-4000:], sep="\n", file=sys.stderr)
            return 1
        return 0
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
