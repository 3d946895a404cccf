"""perfkit's generative client next to AIPerf's, on the scripted generative server
(`perfkit/testing/genai_server.py`, a process of its own: first token after --first-ms, the next ones
--gap-ms apart, one byte each).

Two questions. Agreement: with the server's timing known, both tools should report TTFT ≈
first-ms, ITL ≈ gap-ms and request latency ≈ first + (tokens - 1) · gap, plus what each client adds.
Client CPU per request: each tool runs twice, a short and a long run, and the CPU of the longer
run minus the shorter one's, over the requests the server answered in between, is the marginal
cost of a request, start-up (imports, AIPerf's services, tokenizer loading) cancelled out.

    .venv/bin/python bench/genai_client.py [--aiperf /path/to/venv/bin/aiperf] [--concurrency 1,4,16]

AIPerf is not a dependency of perfkit (its requirements pin older pandas, pillow, psutil and rich
than ours): `peers/install.sh DIR` installs it into a virtual environment of its own; pass
DIR/bin/aiperf. AIPerf needs a Hugging Face tokenizer; this script writes a byte-level one (one
token per byte, as the server and perfkit's default `bytes` count; perfkit/testing/aiperf.py) into
a temporary folder, so nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _harness import machine, run_timed

from perfkit.testing.aiperf import aiperf_stat, write_byte_tokenizer

INPUT_TOKENS = 128
OUTPUT_TOKENS = 32


def _served(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=5) as r:
        return int(json.load(r)["requests"])


def _perfkit(port: int, concurrency: int, window_ms: int, out: Path) -> tuple[float, int, dict[str, Any]]:
    command = [
        sys.executable, "-m", "perfkit", "sweep", "-u", f"127.0.0.1:{port}", "-m", "ok", "--endpoint-type", "chat",
        "--streaming", "--concurrency-range", str(concurrency), "-p", str(window_ms), "-r", "3", "-s", "1000",
        "--synthetic-input-tokens-mean", str(INPUT_TOKENS), "--output-tokens-mean", str(OUTPUT_TOKENS),
        "--report-dir", str(out), "-f", str(out / "perfkit.csv"), "--quiet", "--no-report",
    ]  # fmt: skip
    before = _served(port)
    timed = run_timed(command, 600)
    if timed.result.returncode not in (0, 3):
        raise SystemExit(f"perfkit failed: {timed.result.stderr[-2000:]}")
    level = json.loads(sorted(out.glob("sweep-*.json"))[-1].read_text())["levels"][0]
    return timed.cpu_s, _served(port) - before, level


def _python_of(aiperf: Path) -> Path:
    """AIPerf's interpreter: beside its executable in a virtual environment, or peers/install.sh's."""
    beside = aiperf.parent / "python"
    return beside if beside.exists() else aiperf.parent.parent / "aiperf" / "bin" / "python"


def _aiperf(
    aiperf: Path, port: int, concurrency: int, requests: int, tokenizer: Path, out: Path
) -> tuple[float, int, dict[str, Any]]:
    command = [
        str(aiperf), "profile", "--model", "ok", "--url", f"http://127.0.0.1:{port}", "--endpoint-type", "chat",
        "--streaming", "--concurrency", str(concurrency), "--request-count", str(requests),
        "--prompt-input-tokens-mean", str(INPUT_TOKENS), "--prompt-input-tokens-stddev", "0",
        "--prompt-output-tokens-mean", str(OUTPUT_TOKENS), "--tokenizer", str(tokenizer), "--output-artifact-dir", str(out),
        "--ui-type", "none",
    ]  # fmt: skip
    before = _served(port)
    timed = run_timed(command, 600)
    if timed.result.returncode != 0:
        raise SystemExit(f"aiperf failed: {timed.result.stdout[-2000:]}\n{timed.result.stderr[-2000:]}")
    export = sorted(out.rglob("profile_export_aiperf.json"))[-1]
    return timed.cpu_s, _served(port) - before, json.loads(export.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--aiperf", type=Path, help="AIPerf's executable (in a virtual environment of its own)")
    parser.add_argument("--concurrency", default="1,4,16")
    parser.add_argument("--first-ms", type=float, default=40.0)
    parser.add_argument("--gap-ms", type=float, default=10.0)
    args = parser.parse_args()
    server = subprocess.Popen(
        [sys.executable, "-m", "perfkit.testing.genai_server", "--first-ms", str(args.first_ms),
         "--gap-ms", str(args.gap_ms)], stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert server.stdout is not None
    port = int(server.stdout.readline())
    expected_latency = args.first_ms + (OUTPUT_TOKENS - 1) * args.gap_ms
    print(f"{machine()}; server: first token {args.first_ms:g} ms, then {args.gap_ms:g} ms apart, "
          f"{OUTPUT_TOKENS} tokens (latency {expected_latency:g} ms)\n")  # fmt: skip
    rows = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            tmp_path = Path(tmp)
            tokenizer = None
            if args.aiperf is not None:
                tokenizer = write_byte_tokenizer(tmp_path / "tokenizer", _python_of(args.aiperf))
            for c in (int(x) for x in args.concurrency.split(",")):
                cpu_short, n_short, _ = _perfkit(port, c, 1000, tmp_path / f"pk-{c}-short")
                cpu_long, n_long, level = _perfkit(port, c, 3000, tmp_path / f"pk-{c}-long")
                tokens = level["tokens"]
                row = [f"perfkit c={c}", tokens["ttft_ms"]["p50"], tokens["itl_ms"]["p50"],
                       level["latency"]["p50_us"] / 1e3, (cpu_long - cpu_short) / max(n_long - n_short, 1) * 1e6]  # fmt: skip
                rows.append(row)
                if args.aiperf is not None and tokenizer is not None:
                    count = max(n_long - n_short, 50)
                    a_short = _aiperf(args.aiperf, port, c, count // 3, tokenizer, tmp_path / f"ai-{c}-short")
                    a_long = _aiperf(args.aiperf, port, c, count, tokenizer, tmp_path / f"ai-{c}-long")
                    export = a_long[2]
                    rows.append([f"AIPerf c={c}", aiperf_stat(export, "time_to_first_token"),
                                 aiperf_stat(export, "inter_token_latency"), aiperf_stat(export, "request_latency"),
                                 (a_long[0] - a_short[0]) / max(a_long[1] - a_short[1], 1) * 1e6])  # fmt: skip
    finally:
        server.terminate()
        server.wait(10)
    print("| client | TTFT p50 ms | ITL p50 ms | latency p50 ms | client CPU µs/request |")
    print("|---|---|---|---|---|")
    for name, ttft, itl, latency, cpu in rows:
        print(f"| {name} | {ttft:.2f} | {itl:.2f} | {latency:.2f} | {cpu:.0f} |")


if __name__ == "__main__":
    main()
