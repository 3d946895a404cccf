"""A generative sweep is judged on what it reports, measured in windows that suit LLM speeds, ends
3 when a level is not valid, and its report and console speak of requests and tokens: the
validity rule, the default windows, the exit code, the per-request sample in the result file,
the generative figures of the HTML report and the console's units. No server: synthetic results."""

from __future__ import annotations

import dataclasses
import io

import pytest

from perfkit.analysis.stats import token_sample_check, validity_checks
from perfkit.cli import build_parser
from perfkit.cli.sweep import spec_from_args
from perfkit.errors import ExitCode
from perfkit.genai.records import SAMPLE_CAP, per_request_figures, token_sample, unstreamed_note
from perfkit.load.samples import SampleBuffer
from perfkit.progress import Progress
from perfkit.report.export import render_summary_table
from perfkit.report.figures import generative
from perfkit.report.html import render_html
from perfkit.report.html import sweep as sweep_section
from perfkit.report.summary import exit_line
from perfkit.results.files import ReportItem
from perfkit.results.model import Check, LevelResult, sweep_from_json, sweep_to_json
from perfkit.sweep.run import exit_code
from perfkit.sweep.spec import SweepSpec
from tests.synthetic import make_level, make_sweep, make_token_figures

MS = 1_000_000


def _generative(requests: int, *, streaming: bool = True, level: float = 1.0) -> LevelResult:
    """A stable level of `requests` successful generative requests (each with a TTFT and an ITL
    when streamed), with the checks a sweep gives it."""
    tokens = make_token_figures()
    counts = dataclasses.replace(tokens.ttft_ms, count=requests if streaming else 0)
    tokens = dataclasses.replace(tokens, streaming=streaming, ttft_ms=counts, ttst_ms=counts,
                                 itl_ms=dataclasses.replace(tokens.itl_ms, count=requests if streaming else 0))  # fmt: skip
    lv = make_level(level, [requests / 3] * 3)
    lv = dataclasses.replace(lv, ok_count=requests, request_count=requests, tokens=tokens,
                             latency=dataclasses.replace(lv.latency, count=requests))  # fmt: skip
    return dataclasses.replace(lv, checks=tuple(token_sample_check(lv) if c.name == "sample_count" else c
                                                for c in validity_checks(lv)))  # fmt: skip


def test_a_generative_level_is_judged_on_the_p90_of_its_token_figures_not_a_request_p99() -> None:
    ok = token_sample_check(_generative(100))
    assert ok.passed and "100 with a TTFT; 100 with an ITL" in ok.detail and "a p90 needs 64" in ok.detail
    short = token_sample_check(_generative(40))
    assert not short.passed and "too few for the latency, TTFT, ITL p90" in short.detail
    assert "--measurement-request-count" in short.advice
    # --percentile 99 asks for a p99: 662 requests
    p99 = _generative(100)
    p99 = dataclasses.replace(p99, latency=dataclasses.replace(p99.latency, custom_percentile=99.0))
    assert "a p99 needs 662" in token_sample_check(p99).detail and not token_sample_check(p99).passed
    # not streamed: latency only, and no TTFT or ITL to fall short
    unstreamed = token_sample_check(_generative(70, streaming=False))
    assert unstreamed.passed and "TTFT" not in unstreamed.detail
    # a tensor level of as many requests is still held to a request p99
    tensor = dataclasses.replace(make_level(1, [100 / 3] * 3), ok_count=100)
    [samples] = [c for c in validity_checks(tensor) if c.name == "sample_count"]
    assert not samples.passed and "a p99 needs 662" in samples.detail


def test_any_invalid_level_ends_the_sweep_3_whatever_its_endpoint_type() -> None:
    valid, short = _generative(100), _generative(40, level=2)
    assert valid.stable and short.stable and valid.valid and not short.valid
    assert exit_code(make_sweep([valid])) == ExitCode.OK
    assert exit_code(make_sweep([valid, short])) == ExitCode.UNSTABLE
    few = Check("sample_count", False, "40 successful requests measured; a p99 needs 662")
    tensor = make_level(1, [100.0] * 3, checks=(Check("stable", True, ""), few))
    assert tensor.stable and exit_code(make_sweep([tensor])) == ExitCode.UNSTABLE


def _spec(*flags: str) -> SweepSpec:
    return spec_from_args(build_parser().parse_args(["sweep", "--endpoint-type", "chat", "--streaming", *flags]))


def test_a_generative_sweep_without_window_flags_measures_count_windows_sized_for_its_level() -> None:
    spec = _spec("--concurrency-range", "1:16:15")
    one, sixteen = spec.windows_at(1.0), spec.windows_at(16.0)
    assert (one.mode, one.request_count, sixteen.request_count) == ("count_windows", 100, 160)
    assert _spec("--percentile", "99").windows_at(1.0).request_count == 221  # three windows hold 662
    assert _spec("--request-rate-range", "40").windows_at(40.0).request_count == 200  # 5 s of arrivals
    # a window flag given keeps perf_analyzer's windows; so does a tensor sweep
    assert _spec("-p", "2000").windows_at(1.0).mode == "time_windows"
    assert _spec("--measurement-request-count", "30").windows_at(4.0).request_count == 30
    tensor = spec_from_args(build_parser().parse_args(["sweep"]))
    assert (tensor.windows_at(1.0).mode, tensor.windows_at(1.0).interval_ms) == ("time_windows", 5000.0)


def test_each_level_keeps_a_bounded_even_sample_of_its_requests_that_survives_the_result_file() -> None:
    n = 3 * SAMPLE_CAP
    buffer = SampleBuffer()
    for i in range(n):
        out = 1 if i % 10 == 0 else 20  # one request in ten answers one token: no ITL
        buffer.record(i * MS, i * MS, i * MS + 100 * MS, "", 1, 1, 0, 0, tokens=(30 * MS, 5 * MS, 64 + i % 7, out, 0))
    ok = buffer.arrays()
    assert ok.tokens is not None
    sample = token_sample(per_request_figures(ok), ok.tokens)
    assert sample.total == n and len(sample.ttft_ms) == len(sample.input_tokens) == SAMPLE_CAP
    assert sample.ttft_ms[0] == 30.0 and sample.latency_ms[-1] == 100.0 and sample.itl_ms[0] is None
    assert sample.itl_ms[1] == pytest.approx(70 / 19, abs=1e-3)
    tokens = dataclasses.replace(make_token_figures(), sample=sample)
    result = make_sweep([dataclasses.replace(make_level(1, [100.0] * 3), tokens=tokens)])
    text = sweep_to_json(result)
    assert sweep_from_json(text) == result and len(text) < 120_000


def test_the_generative_report_draws_the_token_figures_and_no_empty_latency_breakdown() -> None:
    levels = [dataclasses.replace(make_level(c, [50.0 * c] * 3), server=None, tokens=make_token_figures(1 + c / 8))
              for c in (1, 4, 8)]  # fmt: skip
    page = render_html([ReportItem("chat", "sweep", make_sweep(levels, model="sim_llm"), "chat.json")])
    for alt in ("TTFT distribution per level", "ITL distribution per level", "TTFT, ITL and end-to-end latency vs load",
                "output tokens/s, total and per user, vs latency", "TTFT vs input length, per request",
                "goodput vs load"):  # fmt: skip
        assert f'alt="{alt}"' in page, alt
    assert "<h3>Generative figures</h3>" in page
    assert 'alt="latency breakdown"' not in page  # no server statistics: nothing to break down
    assert "enough samples for p90 of TTFT, ITL and latency" in page
    # a result file from before the request samples: the figures it can draw, none that would be empty
    unsampled = make_sweep([dataclasses.replace(lv, tokens=dataclasses.replace(lv.tokens, sample=None, goodput_per_s=None))
                            for lv in levels if lv.tokens is not None])  # fmt: skip
    assert [alt for alt, *_ in generative.figures_of(unsampled)] == [
        "TTFT, ITL and end-to-end latency vs load", "output tokens/s, total and per user, vs latency"]  # fmt: skip


def test_chat_without_streaming_says_ttft_and_itl_need_it(monkeypatch: pytest.MonkeyPatch) -> None:
    note = unstreamed_note("chat", False)
    assert "TTFT, TTST and ITL are not measured (they need --streaming)" in note
    assert unstreamed_note("chat", True) == unstreamed_note("embeddings", False) == ""
    tokens = dataclasses.replace(make_token_figures(), streaming=False)
    monkeypatch.setattr(generative, "figures_of", lambda run: [])  # the note, not the figures, is the point here
    section = sweep_section._token_section(make_sweep([dataclasses.replace(make_level(1, [10.0] * 3), tokens=tokens)]))
    assert '<div class="verdict warn">' in section and "they need --streaming" in section


def test_the_console_counts_requests_and_tokens_for_generative_levels() -> None:
    level = _generative(100)
    header = render_summary_table([level])[0].split()
    assert header[1] == "req/s" and "infer/s" not in header and "tokens/s" in header
    assert render_summary_table([make_level(1, [100.0] * 3)])[0].split()[1] == "infer/s"
    stream = io.StringIO()
    progress = Progress(stream=stream, force_terminal=False, unit="req/s")
    progress.level_started("concurrency", 1.0)
    progress.window_done(1.0, 0, 10, 5.5, 180_000.0, False)
    progress.level_done(level)
    lines = stream.getvalue().splitlines()
    assert "5.5 req/s" in lines[1] and "infer/s" not in "".join(lines)
    assert "req/s, 6,400.0 output tokens/s, TTFT p90 48.00 ms, ITL p90 12.00 ms" in lines[2]



def test_an_unstable_generative_level_is_told_to_count_more_requests_not_to_lengthen_p() -> None:
    unstable = dataclasses.replace(make_level(1, [5.0, 3.0, 4.0], stable=False), tokens=make_token_figures())
    spec = {"auto_windows": True, "genai": {"endpoint_type": "chat"}, "windows": {"mode": "time_windows"}}
    line = exit_line(make_sweep([unstable], spec=spec), ExitCode.UNSTABLE)
    assert line is not None and "raise --measurement-request-count or --window-lengthenings" in line
    tensor = exit_line(make_sweep([make_level(1, [5.0, 3.0, 4.0], stable=False)]), ExitCode.UNSTABLE)
    assert tensor is not None and "raise -p / --measurement-interval" in tensor
