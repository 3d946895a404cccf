"""Pure parts of the generative endpoints: the SSE parser, prompts, goodput, and the token figures
from samples, through the catalogue, the tidy CSV, the result file and compare."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from perfkit.analysis.compare import Thresholds, compare_sweeps
from perfkit.analysis.metrics import find, metric
from perfkit.errors import PerfkitError
from perfkit.genai.goodput import Slo, check_goodput, goodput_holds, met_mask, parse_goodput
from perfkit.genai.records import output_length_check, response_tokens, token_figures, value_stats
from perfkit.genai.sse import SseError, SseEvent, SseParser
from perfkit.genai.tokenizer import ByteTokenizer, load_tokenizer
from perfkit.genai.trace import read_trace, trace_intervals_ns, trace_prompts
from perfkit.genai.workload import GenerativeSpec, WorkloadSpec, build_prompts
from perfkit.load.samples import SampleBuffer
from perfkit.report.export import render_pa_csv, render_summary_table
from perfkit.report.html import render_html
from perfkit.report.tidy import render_tidy_csv
from perfkit.results.files import ReportItem
from perfkit.results.model import LevelResult, SweepResult, TokenFigures, WindowResult, sweep_from_json, sweep_to_json
from tests.synthetic import make_level, make_sweep, make_token_figures

MS = 1_000_000

# --------------------------------------------------------------------------------------------------
# SSE


STREAM = (
    b'data: {"a": 1}\r\n\r\n: a comment\n\nevent: ping\n\nevent: usage\ndata: x\ndata: y\n\rdata:[DONE]\r\rid: 7\n\n'
)
EVENTS = [SseEvent('{"a": 1}'), SseEvent("x\ny", "usage"), SseEvent("[DONE]")]


@pytest.mark.parametrize("size", [1, 2, 3, 7, len(STREAM)])
def test_sse_events_do_not_depend_on_where_the_chunks_are_cut(size: int) -> None:
    parser = SseParser()
    events = [e for i in range(0, len(STREAM), size) for e in parser.feed(STREAM[i : i + size])]
    assert events == EVENTS and not parser.pending


def test_sse_a_cr_ending_one_chunk_and_its_lf_opening_the_next_end_one_line() -> None:
    parser = SseParser()
    assert parser.feed(b"data: a\r") == []
    assert parser.feed(b"\ndata: b\n\n") == [SseEvent("a\nb")]


def test_sse_bounds_lines_and_wants_utf8() -> None:
    parser = SseParser(max_line=16)
    parser.feed(b"data: " + b"x" * 8)
    with pytest.raises(SseError, match="longer than 16"):  # before its end arrives, so never held whole
        parser.feed(b"x" * 8)
    with pytest.raises(SseError, match="UTF-8"):
        SseParser().feed(b"data: \xff\n")


def test_sse_pending_says_the_stream_stopped_inside_an_event() -> None:
    parser = SseParser()
    parser.feed(b'data: {"choi')
    assert parser.pending
    parser = SseParser()
    parser.feed(b"data: x\n")
    assert parser.pending  # a data line without its blank line


# --------------------------------------------------------------------------------------------------
# prompts, goodput


def test_synthetic_prompts_follow_the_seeded_distributions_in_bytes() -> None:
    spec = WorkloadSpec(input_tokens_mean=200, input_tokens_stddev=20, output_tokens_mean=50,
                        output_tokens_stddev=5, prompt_count=400, seed=3)  # fmt: skip
    prompts = build_prompts(spec, ByteTokenizer())
    assert prompts == build_prompts(spec, ByteTokenizer())  # the seed decides
    assert prompts != build_prompts(dataclasses.replace(spec, seed=4), ByteTokenizer())
    lengths = np.array([p.input_tokens for p in prompts])
    assert all(len(p.text.encode()) == p.input_tokens for p in prompts)
    assert 195 < lengths.mean() < 205 and 15 < lengths.std() < 25
    asked = np.array([p.max_tokens for p in prompts])
    assert 48 < asked.mean() < 52 and asked.min() >= 1


def test_prompt_files_take_json_lines_and_plain_lines(tmp_path: Path) -> None:
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"text": "héllo"}\n\nplain prompt\n')
    prompts = build_prompts(WorkloadSpec(input_file=path, output_tokens_mean=8), ByteTokenizer())
    assert [(p.text, p.input_tokens, p.max_tokens) for p in prompts] == [("héllo", 6, 8), ("plain prompt", 12, 8)]
    path.write_text('{"prompt": "x"}\n')
    with pytest.raises(PerfkitError, match=r'prompts.jsonl:1: a JSON line needs a "text" string'):
        build_prompts(WorkloadSpec(input_file=path), ByteTokenizer())


def test_streamed_responses_become_token_records() -> None:
    # three requests: three responses (gaps 7 and 9), one response, none (it failed)
    buffer = SampleBuffer()
    buffer.record_streamed(0, 100, 0, "", 10, 10, 0, 0, response_ns=[150, 157, 166])
    buffer.record_streamed(0, 200, 0, "", 10, 10, 0, 0, response_ns=[230])
    buffer.record_streamed(0, 300, 400, "timeout", 10, 0, 0, 0, response_ns=[])
    tokens = response_tokens(buffer.arrays()).tokens
    assert tokens is not None
    assert tokens.tolist() == [[50, 7, 0, 3, 0], [30, -1, 0, 1, 0], [-1, -1, 0, 0, 0]]


def test_tokenizer_flag_names_the_fix() -> None:
    with pytest.raises(PerfkitError, match="--tokenizer nowhere.json: no such file"):
        load_tokenizer("nowhere.json")


def test_goodput_parses_bounds_and_names_the_mistake() -> None:
    assert parse_goodput("ttft_ms<=200, itl_ms:20,output_tokens_per_s>=10") == (
        Slo("ttft_ms", "<=", 200.0), Slo("itl_ms", "<=", 20.0), Slo("output_tokens_per_s", ">=", 10.0),
    )  # fmt: skip
    for text, message in [
        ("ttft<=200", "unknown figure 'ttft'"),
        ("ttft_ms>=200", "bounded with <="),
        ("ttft_ms<=fast", "is not a number"),
        ("ttft_ms<=1,ttft_ms<=2", "twice"),
        ("", "is empty"),
    ]:
        with pytest.raises(PerfkitError, match=message):
            parse_goodput(text)
    with pytest.raises(PerfkitError, match="need --streaming"):
        GenerativeSpec("chat", goodput=parse_goodput("itl_ms<=20")).validate()


def test_goodput_counts_requests_within_every_bound_and_a_missing_figure_meets_it() -> None:
    slos = parse_goodput("ttft_ms<=100,itl_ms<=10")
    figures = {"ttft_ms": np.array([50.0, 150.0, 50.0, 50.0]), "itl_ms": np.array([5.0, 5.0, 20.0, np.nan])}
    assert met_mask(slos, figures, 4).tolist() == [True, False, False, True]


# --------------------------------------------------------------------------------------------------
# token figures from samples


def _samples(rows: list[tuple[int, int, int, int, int, int, str]]) -> SampleBuffer:
    """(sent_ms, latency_ms, ttft_ms, ttst_ms, tokens_out, asked, error) per request; 10 input tokens."""
    buffer = SampleBuffer()
    for sent, latency, ttft, ttst, out, asked, error in rows:
        buffer.record(sent * MS, sent * MS, (sent + latency) * MS, error, 100, 50, 0, 0,
                      tokens=(ttft * MS if ttft >= 0 else -1, ttst * MS if ttst >= 0 else -1, 10, out, asked))  # fmt: skip
    return buffer


WINDOW = WindowResult(0, 1000 * MS, 0, 0, 0, 0.0, 0.0)
ROWS = [
    (0, 100, 20, 10, 9, 8, ""),  # itl (100-20)/8 = 10 ms; one token over max_tokens
    (10, 200, 40, 10, 9, 9, ""),  # itl 20 ms
    (20, 50, 50, 0, 1, 9, ""),  # one token: no itl; fewer than asked
    (30, 100, -1, -1, 0, 0, "HTTP 500"),  # failed: not counted
    (990, 100, 20, 10, 9, 9, ""),  # completes after the window
]


def test_token_figures_follow_aiperfs_definitions_over_the_window() -> None:
    spec = GenerativeSpec("chat", streaming=True, goodput=parse_goodput("itl_ms<=15"))
    figures = token_figures(_samples(ROWS).arrays(), [WINDOW], spec)
    assert figures.ttft_ms.count == 3 and figures.ttft_ms.mean == pytest.approx(110 / 3)
    assert figures.ttst_ms.p50 == 10.0
    assert (figures.itl_ms.count, figures.itl_ms.min, figures.itl_ms.max) == (2, 10.0, 20.0)
    assert sorted([figures.output_tokens_per_s_per_request.min, figures.output_tokens_per_s_per_request.max]) == [
        pytest.approx(50.0), pytest.approx(100.0)]  # fmt: skip
    assert figures.output_tokens_per_s == pytest.approx(19.0)  # 9 + 9 + 1 tokens in one second
    assert figures.total_tokens_per_s == pytest.approx(49.0)
    assert figures.input_tokens.mean == 10.0
    # goodput: the one-token request has no itl, so meets the bound; the 20 ms one does not
    assert (figures.goodput_per_s, figures.goodput_pct) == (pytest.approx(2.0), pytest.approx(200 / 3))
    # at most max_tokens: only the 9-for-8 request was not honoured; exactly: the 1-for-9 one too
    assert (figures.asked_count, figures.not_honoured_count) == (3, 1)
    exact = dataclasses.replace(spec, workload=WorkloadSpec(output_tokens_mean=9, ignore_eos=True))
    assert token_figures(_samples(ROWS).arrays(), [WINDOW], exact).not_honoured_count == 2
    check = output_length_check(figures, exact=False)
    assert check is not None and not check.passed and "1 of 3 requests" in check.detail


def test_value_stats_give_confidence_intervals_that_hold_the_estimate() -> None:
    stats = value_stats(np.random.default_rng(1).exponential(10.0, 2000))
    assert stats.mean_ci_low < stats.mean < stats.mean_ci_high and 9.0 < stats.mean < 11.0
    assert stats.p99_ci_low <= stats.p99 <= stats.p99_ci_high
    assert value_stats([np.nan]).count == 0


# --------------------------------------------------------------------------------------------------
# through the catalogue, the files and compare


def _with_tokens(itl_ms: float, seed: int) -> TokenFigures:
    rng = np.random.default_rng(seed)
    buffer = SampleBuffer()
    for i in range(300):
        itl = rng.normal(itl_ms, itl_ms / 20)
        ttft = 30.0
        latency = ttft + 9 * itl
        buffer.record(i * 3 * MS, i * 3 * MS, int((i * 3 + latency) * MS), "", 1, 1, 0, 0,
                      tokens=(int(ttft * MS), int(itl * MS), 10, 10, 10))  # fmt: skip
    windows = [WindowResult(0, 1000 * MS, 0, 0, 0, 1.0, 1.0)]
    return token_figures(buffer.arrays(), windows, GenerativeSpec("chat", streaming=True))


def _sweep(tokens: TokenFigures | None = None) -> SweepResult:
    return make_sweep([dataclasses.replace(make_level(2, [100.0, 100.0, 100.0]), tokens=tokens)])


def test_token_figures_flow_into_tidy_csv_json_and_gate_in_compare() -> None:
    base, slower = _sweep(_with_tokens(10.0, 1)), _sweep(_with_tokens(15.0, 2))
    assert find("ttft_p99") is None and find("itl_p99_ms") is metric("itl_p99_ms")
    assert metric("itl_mean_ms").value(base.levels[0]) == pytest.approx(10.0, rel=0.02)
    assert metric("ttft_p99_ms").value(_sweep().levels[0]) is None  # a tensor level has no token figures
    header, row = render_tidy_csv(base).splitlines()[:2]
    cells = dict(zip(header.split(","), row.split(",")))
    assert float(cells["itl_mean_ms"]) == pytest.approx(10.0, rel=0.02) and cells["token_source"] == "bytes"
    assert sweep_from_json(sweep_to_json(base)) == base
    old = json.loads(sweep_to_json(_sweep()))
    assert "tokens" in old["levels"][0]
    del old["levels"][0]["tokens"]  # a result file written before token figures still loads
    assert sweep_from_json(json.dumps(old)).levels[0].tokens is None
    comparison = compare_sweeps(base, slower, Thresholds(metrics=("itl_mean_ms", "ttft_p99_ms")))
    verdicts = {d.metric: d.verdict for d in comparison.deltas}
    assert verdicts == {"itl_mean_ms": "regression", "ttft_p99_ms": "ok"}


def test_the_console_table_the_pa_csv_and_the_html_report_show_token_figures() -> None:
    result = _sweep(make_token_figures())
    table = render_summary_table(result.levels)
    assert "ttft p50 ms  itl p50 ms  tokens/s  goodput/s" in table[0]
    assert table[2].split()[5:9] == ["40.00", "10.00", "6400.0", "90.0"]
    header, row = render_pa_csv(result.levels).splitlines()
    cells = dict(zip(header.split(","), row.split(",")))
    assert (cells["Time To First Token avg"], cells["Output Tokens/Second"], cells["Goodput/Second"]) == (
        "40000", "6400", "90")  # fmt: skip
    html = render_html([ReportItem("run", "sweep", result, "run.json")])
    assert "<h3>Tokens</h3>" in html and "ttft_ms&lt;=50" in html and "tokens counted with bytes" in html


def test_how_tokens_were_counted_is_kept_in_the_result_and_said_in_the_report() -> None:
    note = "--tokenizer usage: the server sent no usage figures in 5 of 5 answers; their tokens were counted ..."
    tokens = dataclasses.replace(make_token_figures(), token_source="bytes", token_notes=(note,))
    result = _sweep(tokens)
    assert sweep_from_json(sweep_to_json(result)) == result  # the notes survive the result file
    html = render_html([ReportItem("run", "sweep", result, "run.json")])
    assert "the server sent no usage figures in 5 of 5 answers" in html and "tokens counted with bytes" in html


def test_the_goodput_verdict_names_the_best_level_and_the_highest_that_held() -> None:
    def at(level: float, pct: float, per_s: float) -> LevelResult:
        tokens = dataclasses.replace(make_token_figures(), goodput_pct=pct, goodput_per_s=per_s)
        return dataclasses.replace(make_level(level, [100.0] * 3), tokens=tokens)

    result = make_sweep([at(1, 100.0, 10.0), at(4, 95.0, 30.0), at(8, 60.0, 40.0), at(16, 91.0, 20.0)])
    verdict = check_goodput(result, min_per_s=50.0)
    assert (verdict.best_per_s, verdict.best_level, verdict.highest_holding) == (
        40.0,
        "concurrency 8",
        "concurrency 16",
    )
    assert not verdict.passed and "gate FAILED (needs 50.0 req/s)" in verdict.lines()[0]
    assert check_goodput(result, 40.0, attainment_pct=99.0).highest_holding == "concurrency 1"
    assert goodput_holds(result.levels[1], 90.0) and not goodput_holds(_sweep().levels[0], 0.0)
    with pytest.raises(PerfkitError, match="needs a sweep run with --goodput"):
        check_goodput(_sweep())


def test_a_mooncake_trace_gives_its_gaps_and_prompts_sharing_its_blocks(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    lines = [
        {"timestamp": 0, "input_length": 700, "output_length": 5, "hash_ids": [1, 2]},
        {"timestamp": 30, "input_length": 600, "output_length": 7, "hash_ids": [1, 3]},
        {"timestamp": 30, "input_length": 40, "output_length": 0},
        {"timestamp": 90, "input_length": 512, "output_length": 9, "hash_ids": [2]},
    ]
    path.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    requests = read_trace(path)
    assert trace_intervals_ns(requests) == (30 * MS, 30 * MS, 1, 60 * MS)  # the mean gap first: where it wraps
    prompts = trace_prompts(requests, ByteTokenizer(), seed=5)
    assert [(p.input_tokens, p.max_tokens) for p in prompts] == [(700, 5), (600, 7), (40, 0), (512, 9)]
    assert prompts[0].text[:512] == prompts[1].text[:512] != prompts[3].text  # block 1 shared
    assert prompts[0].text[512:] == prompts[3].text[: 700 - 512]  # block 2 where it recurs
    path.write_text('{"timestamp": 5, "input_length": 3, "output_length": 1}\n{"timestamp": 1, "input_length": 3}\n')
    with pytest.raises(PerfkitError, match=r"trace.jsonl:2: want a JSON object with timestamp"):
        read_trace(path)
