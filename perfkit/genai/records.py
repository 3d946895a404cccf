"""A level's token figures, from its raw samples' token records, after the fact (pure functions).

Definitions follow AIPerf's (docs/metrics_reference.md of ai-dynamo/aiperf), per successful
request of the reported windows:

- `ttft_ms`: from the send to the first response carrying output text (streamed only);
- `ttst_ms`: from that response to the second one (AIPerf's "time to second token": a gap, not
  a time since the send);
- `itl_ms`: (end-to-end latency - ttft) / (output tokens - 1), for streamed requests with at
  least two output tokens; each request is one value, as in AIPerf (not every gap);
- `output_tokens_per_s_per_request`: 1 / itl for streamed requests (AIPerf's "output token
  throughput per user"); for a request that was not streamed, where AIPerf reports none,
  output tokens / end-to-end latency;
- `output_tokens_per_s`: every output token of the windows' successful requests / the windows'
  seconds. AIPerf divides by the benchmark's whole duration; here, as for every throughput of a
  level, by the measured windows (perf_analyzer's rule), so warm-up and drain are left out.

The end-to-end latency itself is the level's `latency` (completion - send). Every distribution
carries 95% confidence intervals of its mean (Student t over the requests, as if independent)
and of its p99 (order statistics, `analysis.stats.percentile_ci`).

*Responses as tokens.* A generative model streamed over gRPC (`--endpoint-type kserve-infer
--streaming` on a model with a `text_output`, one token per response as the vLLM backend streams)
has no token records; `response_tokens` makes them from its responses: TTFT the first response's
arrival, TTST the first gap, one output token per response (token source "responses").

*Output lengths asked for and not honoured.* A request that sent `max_tokens` and got more
tokens back was not honoured; with `min_tokens` or `ignore_eos` also sent (`exact`), so was one
that got fewer. Counted by the tokenizer in use, so a tokenizer other than the server's can
disagree with it by a token or two: compare with `--tokenizer usage`.

*Usage.* `usage_notes` says how a level's tokens were really counted where `--tokenizer` alone
does not: with `--tokenizer usage`, answers that carried no usage were counted by perfkit's byte
tokenizer (the level's token source says both); with a counting tokenizer, a server whose usage
disagrees with it by more than `USAGE_MISMATCH` (summed over the level, beyond a token an answer:
a server may count an end-of-sequence token) has another tokenizer, and the counts stay the
tokenizer's, as AIPerf's do unless told to take the server's. A chat prompt's usage also counts
the chat template, so only a server counting fewer prompt tokens than perfkit's tokenizer is
told apart there.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from perfkit.analysis.significance import student_t_quantile
from perfkit.analysis.stats import percentile_ci, percentile_rank
from perfkit.genai.endpoints import UsageTally
from perfkit.genai.goodput import met_mask, render_goodput
from perfkit.genai.tokenizer import BYTES, USAGE
from perfkit.genai.workload import GenerativeSpec
from perfkit.load.samples import TOKEN_COLUMNS, SampleArrays, SequenceArrays
from perfkit.results.model import Check, SessionFigures, TokenFigures, TokenSample, ValueStats, WindowResult

__all__ = [
    "SAMPLE_CAP", "output_length_check", "per_request_figures", "response_tokens", "session_figures",
    "token_figures", "token_sample", "unstreamed_note", "usage_notes", "value_stats",
]  # fmt: skip

F64 = npt.NDArray[np.float64]
_TTFT, _TTST, _IN, _OUT, _ASKED = range(len(TOKEN_COLUMNS))
#: The most requests a level keeps in its result file for the report's distributions and scatter:
#: about 40 bytes each in the JSON, so a level stays under 50 kB however long it ran.
SAMPLE_CAP = 1000
#: How far (a fraction of the larger) the server's usage may be from perfkit's count of the same
#: text before the tokenizers are said to differ.
USAGE_MISMATCH = 0.10


def value_stats(values: npt.ArrayLike) -> ValueStats:
    """The distribution of the non-NaN `values`; zeros when there are none."""
    v = np.asarray(values, dtype=np.float64)
    v = np.sort(v[~np.isnan(v)])
    n = len(v)
    if n == 0:
        return ValueStats()
    mean = float(v.mean())
    std = float(v.std(ddof=1)) if n > 1 else 0.0
    half = student_t_quantile(0.95, n - 1) * std / math.sqrt(n) if n > 1 else 0.0
    low, high = percentile_ci(v, 99.0)
    p50, p90, p95, p99 = (percentile_rank(v, p) for p in (50.0, 90.0, 95.0, 99.0))
    return ValueStats(n, mean, std, float(v[0]), float(v[-1]), p50, p90, p95, p99, mean - half, mean + half, low, high)


def per_request_figures(ok: SampleArrays) -> dict[str, F64]:
    """Each successful request's figures (goodput.SLO_FIGURES' names); NaN where it has none."""
    n = len(ok)
    tokens = ok.tokens if ok.tokens is not None else np.tile(np.array([-1, -1, 0, 0, 0]), (n, 1))
    latency_ns = (ok.done_ns - ok.sent_ns).astype(np.float64)
    ttft_ns = np.where(tokens[:, _TTFT] >= 0, tokens[:, _TTFT], np.nan).astype(np.float64)
    ttst_ns = np.where(tokens[:, _TTST] >= 0, tokens[:, _TTST], np.nan).astype(np.float64)
    out = tokens[:, _OUT].astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        itl_ns = np.where(out >= 2, (latency_ns - ttft_ns) / (out - 1), np.nan)
        streamed = ~np.isnan(ttft_ns)
        unstreamed_rate = np.where((out > 0) & (latency_ns > 0), out / (latency_ns / 1e9), np.nan)
        per_request = np.where(streamed, np.where(itl_ns > 0, 1e9 / itl_ns, np.nan), unstreamed_rate)
    return {
        "ttft_ms": ttft_ns / 1e6,
        "ttst_ms": ttst_ns / 1e6,
        "itl_ms": itl_ns / 1e6,
        "latency_ms": latency_ns / 1e6,
        "output_tokens_per_s": per_request,
    }


def response_tokens(samples: SampleArrays) -> SampleArrays:
    """`samples` with token records made from their streamed responses (module docstring); a
    request that was not streamed, or got no response, has no times and no tokens."""
    responses = samples.responses
    counts = samples.gap_counts()
    starts = np.cumsum(counts) - counts  # each request's first gap in the flat column
    has_gap = counts > 0
    ttst = np.full(len(samples), -1, dtype=np.int64)
    ttst[has_gap] = samples.gaps_ns[starts[has_gap]]
    tokens = np.zeros((len(samples), len(TOKEN_COLUMNS)), dtype=np.int64)
    tokens[:, _TTFT] = np.where(responses > 0, samples.first_ns - samples.sent_ns, -1)
    tokens[:, _TTST] = ttst
    tokens[:, _OUT] = np.maximum(responses, 0)
    return dataclasses.replace(samples, tokens=tokens)


def _rounded(values: F64, digits: int = 3) -> tuple[float | None, ...]:
    return tuple(None if math.isnan(v) else round(v, digits) for v in values.tolist())


def token_sample(figures: dict[str, F64], tokens: npt.NDArray[np.int64], cap: int = SAMPLE_CAP) -> TokenSample:
    """At most `cap` of the requests (`per_request_figures` and their token records), drawn evenly
    in their order of completion, so a level's early and late requests are both in it."""
    n = len(tokens)
    pick = np.unique(np.linspace(0, n - 1, cap).round().astype(np.int64)) if n > cap else np.arange(n)
    return TokenSample(
        total=n,
        ttft_ms=_rounded(figures["ttft_ms"][pick]),
        itl_ms=_rounded(figures["itl_ms"][pick]),
        latency_ms=tuple(v for v in _rounded(figures["latency_ms"][pick]) if v is not None),
        input_tokens=tuple(int(v) for v in tokens[pick, _IN]),
        output_tokens=tuple(int(v) for v in tokens[pick, _OUT]),
    )


def _in_windows(times_ns: npt.NDArray[np.int64], windows: Sequence[WindowResult]) -> npt.NDArray[np.bool_]:
    mask = np.zeros(len(times_ns), dtype=np.bool_)
    for w in windows:
        mask |= (times_ns >= w.start_ns) & (times_ns < w.end_ns)
    return mask


def token_figures(samples: SampleArrays, windows: Sequence[WindowResult], spec: GenerativeSpec) -> TokenFigures:
    """The token figures of the requests that completed in `windows` (the level's reported ones)."""
    counted = samples.select(_in_windows(samples.done_ns, windows))
    ok = counted.select(counted.ok)
    duration_s = sum(w.end_ns - w.start_ns for w in windows) / 1e9
    figures = per_request_figures(ok)
    tokens = ok.tokens if ok.tokens is not None else np.zeros((len(ok), len(TOKEN_COLUMNS)), dtype=np.int64)
    out, asked = tokens[:, _OUT], tokens[:, _ASKED]
    exact = spec.exact_output
    not_honoured = (asked > 0) & ((out > asked) | (exact & (out != asked)))
    goodput_per_s = goodput_pct = None
    if spec.goodput:
        met = int(met_mask(spec.goodput, figures, len(ok)).sum())
        goodput_per_s = met / duration_s if duration_s > 0 else 0.0
        goodput_pct = 100.0 * met / len(ok) if len(ok) else 0.0
    seconds = duration_s if duration_s > 0 else math.inf
    return TokenFigures(
        endpoint_type=spec.endpoint_type,
        streaming=spec.streaming,
        token_source=spec.tokenizer,
        ttft_ms=value_stats(figures["ttft_ms"]),
        ttst_ms=value_stats(figures["ttst_ms"]),
        itl_ms=value_stats(figures["itl_ms"]),
        input_tokens=value_stats(tokens[:, _IN]),
        output_tokens=value_stats(out),
        output_tokens_per_s_per_request=value_stats(figures["output_tokens_per_s"]),
        output_tokens_per_s=float(out.sum()) / seconds,
        total_tokens_per_s=float(out.sum() + tokens[:, _IN].sum()) / seconds,
        asked_count=int((asked > 0).sum()),
        not_honoured_count=int(not_honoured.sum()),
        goodput_slo=render_goodput(spec.goodput) if spec.goodput else "",
        goodput_per_s=goodput_per_s,
        goodput_pct=goodput_pct,
        sample=token_sample(figures, tokens),
    )


def session_figures(sessions: SequenceArrays, windows: Sequence[WindowResult]) -> SessionFigures:
    """The per-session figures of the sessions whose last answer came in `windows`: turns per
    session over all of them, latency (first send to last answer) over the successful ones."""
    inside = _in_windows(sessions.done_ns, windows)
    ok = inside & sessions.ok
    duration_s = sum(w.end_ns - w.start_ns for w in windows) / 1e9
    return SessionFigures(
        count=int(inside.sum()),
        ok_count=int(ok.sum()),
        throughput_per_s=int(ok.sum()) / duration_s if duration_s > 0 else 0.0,
        turns=value_stats(sessions.requests[inside]),
        latency_ms=value_stats((sessions.done_ns[ok] - sessions.first_sent_ns[ok]) / 1e6),
    )


def unstreamed_note(endpoint_type: str, streaming: bool) -> str:
    """What a generative run without --streaming does not measure (console and report); "" when
    nothing is missing (streamed, or embeddings, which answer once)."""
    if streaming or endpoint_type in ("kserve-infer", "embeddings"):
        return ""
    return (f"--endpoint-type {endpoint_type} without --streaming: each answer comes whole, so TTFT, TTST and ITL "
            "are not measured (they need --streaming); only request latency and tokens/s are measured")  # fmt: skip


def output_length_check(figures: TokenFigures, exact: bool) -> Check | None:
    """Whether the server produced the output lengths asked for; None when none were asked."""
    if figures.asked_count == 0:
        return None
    bad = figures.not_honoured_count
    rule = "exactly the max_tokens sent" if exact else "at most the max_tokens sent"
    return Check(
        "output_lengths",
        bad == 0,
        f"{bad} of {figures.asked_count} requests did not get {rule} (counted with {figures.token_source})",
        ""
        if bad == 0
        else "the server did not honour max_tokens/min_tokens/ignore_eos: check that it supports them (vLLM and "
        "TensorRT-LLM do), count with the server's tokenizer (--tokenizer FILE or usage), or drop "
        "--output-tokens-mean-deterministic/--ignore-eos",
    )


def _differs(server: int, own: int, answers: int) -> bool:
    return abs(server - own) > max(USAGE_MISMATCH * max(server, own), answers)


def usage_notes(tally: UsageTally, spec: GenerativeSpec) -> tuple[str, dict[str, str]]:
    """A level's token source and what to say about it, by kind (module docstring, *Usage*)."""
    source, notes = spec.tokenizer, {}
    if tally.without_usage and spec.tokenizer == USAGE:
        source = BYTES if not tally.with_usage else f"{USAGE}, else {BYTES}"
        asked = " (asked with stream_options.include_usage)" if spec.streaming else ""
        notes["no usage"] = (
            f"--tokenizer usage: the server sent no usage figures{asked} in {tally.without_usage} of "
            f"{tally.without_usage + tally.with_usage} answers; their tokens were counted by perfkit's tokenizer "
            f"({BYTES}, 1 byte = 1 token); for counts like the server's, give its tokenizer.json with --tokenizer"
        )
    n = tally.with_usage
    if n and spec.tokenizer != USAGE:
        chat = spec.endpoint_type == "chat"
        prompt = (tally.own_in - tally.server_in > max(USAGE_MISMATCH * tally.own_in, n)) if chat else (
            _differs(tally.server_in, tally.own_in, n))  # fmt: skip
        output = spec.endpoint_type != "embeddings" and _differs(tally.server_out, tally.own_out, n)
        if prompt or output:
            name = spec.tokenizer
            figures = [f"{what} tokens per answer: {server / n:.1f} by the server's usage, {own / n:.1f} by {name}"
                       for what, server, own, differs in (("prompt", tally.server_in, tally.own_in, prompt),
                                                          ("completion", tally.server_out, tally.own_out, output))
                       if differs]  # fmt: skip
            notes["tokenizer differs"] = (
                f"the tokenizer (--tokenizer {name}) differs from the server's: {'; '.join(figures)}; ISL/OSL "
                "here are --tokenizer's counts: give the server's tokenizer.json with --tokenizer, or take its "
                "counts with --tokenizer usage"
            )
    return source, notes
