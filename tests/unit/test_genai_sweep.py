"""`perfkit sweep --endpoint-type ...` end to end against the fake generative server: the token
figures in the result files, the goodput, the output-length check, and the flags' errors."""

from __future__ import annotations

import asyncio
import csv
from pathlib import Path

import pytest

from perfkit.cli import build_parser, main
from perfkit.cli.sweep import spec_from_args
from perfkit.errors import ExitCode, PerfkitError
from perfkit.results.model import read_sweep
from perfkit.sweep.run import resolve_model
from perfkit.testing.genai_server import FIRST_S, serving_in_thread

WINDOWS = ["--concurrency-range", "2", "-p", "250", "-r", "3", "-s", "1000", "--quiet", "--no-report"]


def _sweep(tmp_path: Path, url: str, model: str, *extra: str) -> tuple[int, Path]:
    out = tmp_path / model
    code = main(["sweep", "-u", url, "-m", model, "--endpoint-type", "chat", "--streaming", *WINDOWS,
                 "--report-dir", str(out), "-f", str(tmp_path / f"{model}.csv"), "--num-prompts", "3", *extra])  # fmt: skip
    return code, next(out.glob("sweep-*.json"))


def test_a_streaming_chat_sweep_writes_token_figures_goodput_and_the_length_check(tmp_path: Path) -> None:
    with serving_in_thread() as url:
        code, path = _sweep(tmp_path, url, "ok", "--output-tokens-mean", "5", "--output-tokens-mean-deterministic",
                            "--goodput", "ttft_ms<=2000,itl_ms<=1", "--synthetic-input-tokens-mean", "16")  # fmt: skip
        short_code, short_path = _sweep(tmp_path, url, "short", "--output-tokens-mean", "5", "--ignore-eos")
    # 0.75 s of windows hold too few requests for a p90: the level is measured, and not valid
    assert code == ExitCode.UNSTABLE
    level = read_sweep(path).levels[0]
    assert {c.name for c in level.checks if not c.passed} <= {"sample_count", "duration"}
    [samples] = [c for c in level.checks if c.name == "sample_count"]
    assert "with a TTFT" in samples.detail and "a p90 needs 64" in samples.detail  # its token figures judged
    tokens = level.tokens
    assert tokens is not None and level.ok_count == tokens.output_tokens.count > 0
    assert (tokens.input_tokens.mean, tokens.output_tokens.mean, tokens.token_source) == (16.0, 5.0, "bytes")
    assert FIRST_S * 1e3 * 0.9 <= tokens.ttft_ms.p50 < level.latency.p50_us / 1e3
    assert 0 < tokens.itl_ms.p50 < tokens.ttft_ms.p50
    assert tokens.goodput_slo == "ttft_ms<=2000,itl_ms<=1" and tokens.goodput_pct == 0.0  # no itl within 1 ms
    assert {c.name: c.passed for c in level.checks}["output_lengths"]
    # an OpenAI-compatible endpoint has no statistics extension by design: not asked, nothing said
    assert level.server is None and not [note for note in level.resources.notes if "statistics" in note]
    with (tmp_path / "ok_long.csv").open() as f:
        row = next(csv.DictReader(f))
    assert float(row["ttft_p50_ms"]) == pytest.approx(tokens.ttft_ms.p50)
    assert float(row["output_tokens_per_s"]) == pytest.approx(tokens.output_tokens_per_s)
    # a server that answers 3 tokens when 5 were asked with ignore_eos: the check says so
    short = read_sweep(short_path).levels[0]
    assert short_code == ExitCode.UNSTABLE and short.tokens is not None
    assert short.tokens.not_honoured_count == short.tokens.asked_count > 0 and not short.valid


def test_chat_without_streaming_says_on_the_console_that_ttft_and_itl_need_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with serving_in_thread() as url:
        code = main(["sweep", "-u", url, "-m", "ok", "--endpoint-type", "chat", *WINDOWS, "--report-dir",
                     str(tmp_path), "--num-prompts", "3"])  # fmt: skip
    assert code == ExitCode.UNSTABLE  # 0.75 s of windows: too few requests for a valid p90
    err = capsys.readouterr().err
    assert "note: --endpoint-type chat without --streaming" in err and "(they need --streaming)" in err
    tokens = read_sweep(next(tmp_path.glob("sweep-*.json"))).levels[0].tokens
    assert tokens is not None and tokens.ttft_ms.count == 0 and tokens.output_tokens.count > 0


def test_a_server_without_the_endpoint_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with serving_in_thread() as url:
        code = main(["sweep", "-u", url, "-m", "ok", "--endpoint-type", "kserve-generate", *WINDOWS,
                     "--report-dir", str(tmp_path)])  # fmt: skip
    assert code == ExitCode.FAILED
    assert "GET /v2/health/live failed" in capsys.readouterr().err


def test_a_trace_is_replayed_at_its_own_times_with_its_lengths(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(f'{{"timestamp": {20 * i}, "input_length": {10 + i}, "output_length": {1 + i % 3}}}\n'
                             for i in range(10)))  # fmt: skip
    with serving_in_thread() as url:
        code = main(["sweep", "-u", url, "-m", "ok", "--endpoint-type", "completions", "--streaming",
                     "--trace-file", str(trace), *WINDOWS[2:], "--report-dir", str(tmp_path)])  # fmt: skip
    assert code == ExitCode.UNSTABLE  # measured; 0.75 s of windows are too few requests for a valid level
    level = read_sweep(next(tmp_path.glob("sweep-*.json"))).levels[0]
    assert level.mode == "custom_intervals" and level.level == pytest.approx(50.0)  # one request per 20 ms
    assert level.send_rate_per_s == pytest.approx(50.0, rel=0.2) and level.tokens is not None
    assert 1.0 <= level.tokens.output_tokens.min and level.tokens.output_tokens.max <= 3.0
    assert level.tokens.input_tokens.min >= 10.0 and level.tokens.input_tokens.max <= 19.0


def test_a_scenario_gates_on_goodput(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with serving_in_thread() as url:
        path = tmp_path / "chat.toml"
        path.write_text(f"""command = "sweep"
[server]
url = "{url}"
[sweep]
model_name = "ok"
endpoint_type = "chat"
streaming = true
concurrency_range = "2"
measurement_interval = 250
max_trials = 3
stability_percentage = 1000
output_tokens_mean = 3
goodput = "ttft_ms<=5000"
[gates]
min_goodput_per_s = 100000
""")
        code = main(["run", str(path), "--report-dir", str(tmp_path), "--quiet"])
    out = capsys.readouterr().out
    assert code == ExitCode.FAILED
    assert "goodput ttft_ms<=5000: best " in out and "gate FAILED (needs 100,000.0 req/s)" in out
    assert "held (90% of requests within) up to concurrency 2" in out


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--endpoint-type", "chat", "-b", "2", "-u", "h:1"], "one prompt per request"),
        (["-u", "h:1", "--endpoint-type", "embeddings", "--streaming"], "embeddings answer once"),
        (["-u", "h:1", "--endpoint-type", "chat", "--ignore-eos"], "need --output-tokens-mean"),
        (["-u", "h:1", "--endpoint-type", "chat", "--goodput", "ttft_ms<=1"], "need --streaming"),
        (["-u", "h:1", "--goodput", "latency_ms<=1"], "needs a generative --endpoint-type"),
        (["-u", "h:1", "--endpoint-type", "chat", "-i", "grpc"], "drop -i grpc"),
        (
            ["-u", "h:1", "--endpoint-type", "chat", "--trace-file", "t", "--concurrency-range", "2"],
            "drop --concurrency",
        ),
        (["-u", "h:1", "--endpoint-type", "chat", "--binary-search", "--concurrency-range", "1:8"], "or --goodput"),
        (
            [
                "-u",
                "h:1",
                "--endpoint-type",
                "chat",
                "--streaming",
                "--goodput",
                "ttft_ms<=9",
                "--goodput-attainment",
                "0",
            ],
            "--goodput-attainment must be in (0, 100]",
        ),
    ],
)
def test_generative_flags_name_what_to_change(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["sweep", *flags]) == ExitCode.USAGE
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("endpoint_type", "default"),
    [("kserve-infer", "mlp"), ("chat", "sim_llm"), ("kserve-generate", "sim_llm"), ("embeddings", "tiny_embedder")],
)
def test_the_embedded_server_is_measured_on_its_model_for_the_endpoint(endpoint_type: str, default: str) -> None:
    class Index:
        async def repository_index(self) -> list[dict[str, str]]:
            return [{"name": name, "state": "READY"} for name in ("mlp", "sim_llm", "tiny_decoder", "tiny_embedder")]

    args = ["sweep", "--endpoint-type", endpoint_type]
    spec = spec_from_args(build_parser().parse_args(args))
    assert asyncio.run(resolve_model(Index(), spec, embedded=True)) == default  # type: ignore[arg-type]
    with pytest.raises(PerfkitError, match="4 ready models"):
        asyncio.run(resolve_model(Index(), spec, embedded=False))  # type: ignore[arg-type]
