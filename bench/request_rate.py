"""Does each client keep its request-rate schedule? perfkit and NVIDIA's perf_analyzer, one after the
other, send a ladder of constant request rates to the demo identity model on one reference server
(the server does almost nothing, so the client is what can fall behind), and the table gives each
tool's achieved throughput, send rate and share of late sends side by side.

    PERFKIT_PEERS=DIR python bench/request_rate.py [-i http|grpc] [--rates 500,1000,2000,4000,8000]
        [--window-ms 2000] [--pa-args "--max-threads 16"]

A send is late when it leaves more than 1 ms after its intended time, for both tools (perf_analyzer's
`delay_tolerance_`, perfkit's `delayed_pct`). Where each figure comes from:

- perfkit: `delayed_pct`, `send_rate_per_s` and `throughput_infer_per_s` of the level in its JSON
  result.
- perf_analyzer: it reports lateness only above 1%: then it prints "Avg send request rate: X
  infer/sec" and "[WARNING] Perf Analyzer was not able to keep up with the desired request rate. P%
  of the requests were delayed." (src/inference_profiler.cc). Without that line its late share is
  under 1% (printed as "< 1"). It runs in its default synchronous mode with its default 4 worker
  threads unless --pa-args says otherwise. It runs again, twice at most, when it finds no stable
  measurement (exit 2); if it still does not, it reports nothing, and the row says "unstable", "?"
  and "n/a".

A tool keeps its schedule at a rate when its late share is under 1% (issue #7 target 2: perfkit
should keep it at every rate perf_analyzer keeps). Both run `-p WINDOW -s 50 -r 5`; which tool goes
first alternates from rate to rate.
"""

from __future__ import annotations

import argparse
import csv
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _harness import machine, peers_dir, perfkit_command, perfkit_levels, ratio

from perfkit.target import reference_server_process
from v2kit.demo import build_demo_repository

TOOLS = ("perfkit", "perf_analyzer")
MODEL = "identity"
SHAPE = ("--shape", "INPUT0:256")  # 1 KiB per request
_DELAYED = re.compile(r"([\d.]+)% of the requests were delayed")
_SEND_RATE = re.compile(r"Avg send request rate: ([\d.]+)")


@dataclass(frozen=True, slots=True)
class RateRun:
    tool: str
    rate: int
    exit_code: int
    infer_per_s: float
    send_rate_per_s: float  # nan where the tool does not say
    delayed_pct: float  # nan: under 1% (perf_analyzer prints nothing then) or unknown
    stable: bool

    @property
    def delayed_known(self) -> bool:
        """perf_analyzer says nothing about lateness when it finds no stable measurement."""
        return self.tool == "perfkit" or self.stable or self.delayed_pct == self.delayed_pct

    @property
    def keeps_schedule(self) -> bool:
        return self.delayed_known and not self.delayed_pct >= 1.0


def run_perfkit(url: str, protocol: str, rate: int, window: list[str], out: Path) -> RateRun:
    args = [*SHAPE, "--request-rate-range", str(rate), *window]
    result = subprocess.run(perfkit_command(url, MODEL, protocol, args, out), capture_output=True, text=True)
    levels = perfkit_levels(out)
    if not levels:
        print(f"perfkit at {rate}/s exited {result.returncode}:\n{result.stderr[-1500:]}", file=sys.stderr)
        return RateRun("perfkit", rate, result.returncode, float("nan"), float("nan"), float("nan"), False)
    level = levels[0]
    return RateRun(
        "perfkit",
        rate,
        result.returncode,
        float(level["throughput_infer_per_s"]),  # type: ignore[arg-type]
        float(level["send_rate_per_s"]),  # type: ignore[arg-type]
        float(level["delayed_pct"]),  # type: ignore[arg-type]
        bool(level["stable"]),
    )


def run_perf_analyzer(
    peers: Path, url: str, protocol: str, rate: int, window: list[str], extra: list[str], out: Path
) -> RateRun:
    command = [
        str(peers / "bin" / "perf_analyzer"), "-m", MODEL, "-u", url, "-i", protocol, *SHAPE,
        "--request-rate-range", str(rate), *window, *extra, "-f", str(out / "pa.csv"),
    ]  # fmt: skip
    for _ in range(3):  # again, twice at most, when it finds no stable measurement (exit 2)
        result = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
        if result.returncode != 2:
            break
    text = result.stdout + result.stderr
    delayed = _DELAYED.findall(text)
    send_rate = _SEND_RATE.findall(text)
    infer_per_s = float("nan")
    if (out / "pa.csv").exists():
        with (out / "pa.csv").open(newline="") as handle:
            rows = list(csv.DictReader(handle))
        if rows:
            infer_per_s = float(rows[0]["Inferences/Second"])
    return RateRun(
        "perf_analyzer",
        rate,
        result.returncode,
        infer_per_s,
        float(send_rate[-1]) if send_rate else float("nan"),
        float(delayed[-1]) if delayed else float("nan"),
        result.returncode == 0,
    )


def render(runs: list[RateRun], rates: list[int], protocol: str, window_ms: int, host: str) -> str:
    by_key = {(r.tool, r.rate): r for r in runs}

    def pct(run: RateRun) -> str:
        if not run.delayed_known:
            return "?"
        return "< 1" if run.delayed_pct != run.delayed_pct else f"{run.delayed_pct:.2f}"

    def keeps(run: RateRun) -> str:
        return "?" if not run.delayed_known else "yes" if run.keeps_schedule else "no"

    def rate_text(value: float) -> str:
        return "-" if value != value else f"{value:.0f}"

    lines = [
        f"request-rate mode, constant schedule, demo `identity` (1 KiB), -i {protocol}, -p {window_ms} -s 50 -r 5; "
        f"{host}",
        "",
        "| rate/s | infer/s perfkit | infer/s PA | ratio | send rate perfkit | send rate PA | late % perfkit "
        "| late % PA | keeps schedule perfkit | keeps schedule PA | met |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|",
    ]
    for rate in rates:
        pk, pa = by_key[("perfkit", rate)], by_key[("perf_analyzer", rate)]
        met = "PASS" if pk.keeps_schedule or not pa.keeps_schedule else "FAIL"
        if not pa.delayed_known:
            met = "n/a"
        note = "" if pa.stable else " (PA unstable)"
        lines.append(
            f"| {rate} | {pk.infer_per_s:.0f} | {pa.infer_per_s:.0f}{note} | "
            f"{ratio(pk.infer_per_s, pa.infer_per_s)} | "
            f"{rate_text(pk.send_rate_per_s)} | {rate_text(pa.send_rate_per_s)} | {pct(pk)} | {pct(pa)} | "
            f"{keeps(pk)} | {keeps(pa)} | {met} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-i", "--protocol", choices=("http", "grpc"), default="http")
    parser.add_argument("--rates", default="500,1000,2000,4000,8000", help="comma-separated requests per second")
    parser.add_argument("--window-ms", type=int, default=2000, help="-p for both tools")
    parser.add_argument("--pa-args", default="", help="extra perf_analyzer flags, e.g. '--max-threads 16'")
    args = parser.parse_args(argv)
    peers = peers_dir()
    rates = [int(r) for r in args.rates.split(",")]
    window = ["-p", str(args.window_ms), "-s", "50", "-r", "5"]
    runs: list[RateRun] = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        with reference_server_process(build_demo_repository(tmp / "models")) as server:
            url = server.http_url if args.protocol == "http" else server.grpc_url
            for index, rate in enumerate(rates):
                for tool in TOOLS if index % 2 else TOOLS[::-1]:
                    print(f"measuring: {tool} {rate}/s ...", file=sys.stderr, flush=True)
                    out = Path(tempfile.mkdtemp(dir=tmp))
                    if tool == "perfkit":
                        runs.append(run_perfkit(url, args.protocol, rate, window, out))
                    else:
                        extra = shlex.split(args.pa_args)
                        runs.append(run_perf_analyzer(peers, url, args.protocol, rate, window, extra, out))
    print()
    print(render(runs, rates, args.protocol, args.window_ms, machine(peers)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
