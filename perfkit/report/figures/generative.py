"""The generative report's figures: what AIPerf's and genai-perf's users read, from a sweep's token
figures. Pure functions from a SweepResult to PNG bytes, drawn with `canvas.py`.

- the TTFT and ITL distributions of each level (empirical CDFs, so that many levels overlay), from
  each level's sample of requests (`TokenFigures.sample`, at most `records.SAMPLE_CAP`);
- TTFT, ITL and end-to-end latency percentiles against load (from every request of the level);
- output tokens/s, in total and per user (one request's decode rate), against latency;
- each sampled request's TTFT against its input length (prefill grows with the prompt);
- with `--goodput`, the goodput against load beside the throughput, and the share of requests
  that met every objective.

Legends go under the axes (`canvas.legend_below`), as the sweep's own figures do: inside, they
cover a level's curve or a percentile line. A level is named in full there ("concurrency 4",
"rate 8/s"), so that the legend needs no title.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from matplotlib.ticker import LogLocator, NullFormatter

from perfkit.report.figures import canvas
from perfkit.report.figures.canvas import PALETTE
from perfkit.results.model import LevelResult, SweepResult, TokenFigures, TokenSample, ValueStats, level_name

__all__ = [
    "FIGURES", "STREAMED_ONLY", "figures_of", "goodput_vs_load", "itl_distribution", "token_latency_vs_load",
    "tokens_vs_latency", "ttft_distribution", "ttft_vs_input_length",
]  # fmt: skip


_WIDE = (12.8, 3.6)


def _levels(run: SweepResult) -> list[tuple[LevelResult, TokenFigures]]:
    """The levels with token figures, in load order."""
    levels = sorted(run.levels, key=lambda lv: lv.level)
    return [(lv, lv.tokens) for lv in levels if lv.tokens is not None]


def _present(values: Sequence[float | None]) -> list[float]:
    return [v for v in values if v is not None]


def _cdf(ax: Any, run: SweepResult, column: Callable[[TokenSample], Sequence[float | None]], what: str) -> bool:
    """One empirical CDF per level of a sampled per-request figure; whether any was drawn."""
    drawn = False
    tokens = _levels(run)
    for i, (lv, t) in enumerate(tokens):
        values = np.sort(np.asarray(_present(column(t.sample)) if t.sample is not None else [], dtype=np.float64))
        if not len(values):
            continue
        share = np.arange(1, len(values) + 1) / len(values) * 100
        ax.step(values, share, where="post", color=PALETTE[i % 8], linewidth=1.3,
                label=_level(lv) if len(tokens) > 1 else f"{_level(lv)}: {len(values)} requests")  # fmt: skip
        drawn = True
    for p in (50, 90, 99):
        ax.axhline(p, color="#bbbbbb", linewidth=0.7, linestyle=":")
    ax.set_ylim(0, 100)
    ax.set_ylabel("requests at or below (%)")
    ax.set_xlabel(f"{what} (ms)")
    if drawn:
        low, high = ax.get_xlim()
        positive = [v for v in (low, high) if v > 0]
        if positive and high / max(min(positive), 1e-9) > 50:
            ax.set_xscale("log")
            ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            ax.xaxis.set_major_formatter(lambda v, _pos: f"{v:g}")
            ax.xaxis.set_minor_formatter(NullFormatter())  # 3x10^1 4x10^1 ... would collide
    return drawn


def ttft_distribution(run: SweepResult) -> bytes:
    """Each level's time to first token, as the share of requests at or below each value."""
    fig, ax = canvas.new_figure()
    if not _cdf(ax, run, lambda s: s.ttft_ms, "time to first token"):
        canvas.centred_note(ax, "no TTFT measured: it needs --streaming")
    ax.set_title("TTFT distribution per level", fontsize=11)
    canvas.legend_below(fig, ax)
    return canvas.png(fig)


def itl_distribution(run: SweepResult) -> bytes:
    """Each level's inter-token latency (a request's mean gap between output tokens), as a CDF."""
    fig, ax = canvas.new_figure()
    if not _cdf(ax, run, lambda s: s.itl_ms, "inter-token latency"):
        canvas.centred_note(ax, "no ITL measured: it needs --streaming and two output tokens")
    ax.set_title("ITL distribution per level", fontsize=11)
    canvas.legend_below(fig, ax)
    return canvas.png(fig)


def _level(lv: LevelResult) -> str:
    """A level as a legend names it: "concurrency 4", "rate 8/s"."""
    return level_name(lv.mode, lv.level, short=True)


_PERCENTILES = (("p50", "p50", "-"), ("p90", "p90", "--"), ("p99", "p99", ":"))


def _percentile_lines(ax: Any, xs: list[float], stats: list[ValueStats], color: str) -> None:
    for _name, key, style in _PERCENTILES:
        ax.plot(xs, [getattr(s, key) for s in stats], marker="o", markersize=3, linestyle=style, color=color)


def _percentile_key(ax: Any) -> None:
    """The line styles' key, in grey: each panel draws p50, p90 and p99 in its own colour."""
    for name, _key, style in _PERCENTILES:
        ax.plot([], [], marker="o", markersize=3, linestyle=style, color="#555555", label=name)


def token_latency_vs_load(run: SweepResult) -> bytes:
    """TTFT, ITL and end-to-end latency (p50, p90, p99) against load, one panel each."""
    fig, first = canvas.new_figure(_WIDE, right=0.2, top=0.45)
    fig.subplots_adjust(wspace=0.32)
    first.remove()
    axes = fig.subplots(1, 3)
    tokens = _levels(run)
    xs = [lv.level for lv, _ in tokens]
    panels = (
        ("TTFT", [t.ttft_ms for _, t in tokens], PALETTE[0]),
        ("ITL", [t.itl_ms for _, t in tokens], PALETTE[2]),
        ("end-to-end latency", [_latency_stats(lv) for lv, _ in tokens], PALETTE[3]),
    )
    for ax, (name, stats, color) in zip(axes, panels):
        ax.grid(True, color="#d9d9d9", linewidth=0.6)
        ax.set_axisbelow(True)
        measured = [(x, s) for x, s in zip(xs, stats) if s.count]
        if measured:
            _percentile_lines(ax, [x for x, _ in measured], [s for _, s in measured], color)
        else:
            canvas.centred_note(ax, f"no {name}: it needs --streaming")
        canvas.set_load_axis(ax, xs, run.mode)
        ax.set_ylabel(f"{name} (ms)")
        ax.set_ylim(bottom=0)
        ax.set_title(name, fontsize=10)
    _percentile_key(axes[0])
    canvas.legend_below(fig, axes[0])
    fig.suptitle("TTFT, ITL and end-to-end latency vs load", fontsize=11)
    return canvas.png(fig)


def _latency_stats(lv: LevelResult) -> ValueStats:
    """The level's end-to-end latency (µs) as the per-request figures' ValueStats (ms)."""
    lat = lv.latency
    return ValueStats(lat.count, lat.mean_us / 1e3, p50=lat.p50_us / 1e3, p90=lat.p90_us / 1e3, p99=lat.p99_us / 1e3)


def tokens_vs_latency(run: SweepResult) -> bytes:
    """Output tokens/s of the whole level (left) and of one user (a request's decode rate, p50;
    right) against the level's median end-to-end latency, each point labelled with its level: the
    trade-off between serving many and serving each one fast."""
    fig, ax = canvas.new_figure(right=0.75)
    tokens = [(lv, t) for lv, t in _levels(run) if lv.latency.count]
    xs = [lv.latency.p50_us / 1e3 for lv, _ in tokens]
    totals = [t.output_tokens_per_s for _, t in tokens]
    ax.plot(xs, totals, marker="o", markersize=4, color=PALETTE[0], label="output tokens/s, total")
    right = ax.twinx()
    per_user = [t.output_tokens_per_s_per_request for _, t in tokens]
    p50s = [s.p50 for s in per_user if s.count]
    right.plot([x for x, s in zip(xs, per_user) if s.count], p50s, marker="s", markersize=4, linestyle="--",
               color=PALETTE[1], label="output tokens/s per user, p50")  # fmt: skip
    right.set_ylabel("output tokens/s per user", color=PALETTE[1])
    # Headroom above the highest point (a flat per-user rate autoscaled to the top edge is drawn on
    # it), more than the total's: the same headroom would put both lines' highest points together.
    right.set_ylim(0, max(p50s) * 1.3 if p50s and max(p50s) > 0 else None)
    right.spines["top"].set_visible(False)
    if not tokens:
        canvas.centred_note(ax, "no level with successful requests")
    ax.set_xlabel("end-to-end latency p50 (ms)")
    ax.set_ylabel("output tokens/s (total)", color=PALETTE[0])
    ax.margins(x=0.12)  # room for the level labels; the latency axis keeps to the levels' range
    ax.set_ylim(0, max(totals) * 1.15 if totals and max(totals) > 0 else None)  # room for the top label
    ax.set_title("Output tokens/s vs latency (level on each point)", fontsize=11)
    canvas.legend_below(fig, ax, right)
    # Last, on the final layout; clear of the per-user line too, which may cross the total's points.
    canvas.place_labels(
        ax, [(f"{lv.level:g}", x, y, PALETTE[0]) for x, y, (lv, _) in zip(xs, totals, tokens)], others=[right]
    )
    return canvas.png(fig)


def ttft_vs_input_length(run: SweepResult) -> bytes:
    """Every sampled request's TTFT against its prompt's length in tokens, coloured by level. When
    every prompt had one length (the default: no --synthetic-input-tokens-stddev), the points stand
    in one column, centred, and the axis's label says so and how to vary them."""
    tokens = _levels(run)
    lengths = {n for _, t in tokens if t.sample is not None for n in t.sample.input_tokens}
    fig, ax = canvas.new_figure(bottom=0.75 if len(lengths) == 1 else 0.55)
    drawn = False
    for i, (lv, t) in enumerate(tokens):
        s = t.sample
        if s is None:
            continue
        pairs = [(n, v) for n, v in zip(s.input_tokens, s.ttft_ms) if v is not None]
        if not pairs:
            continue
        ax.scatter([n for n, _ in pairs], [v for _, v in pairs], s=6, alpha=0.5, color=PALETTE[i % 8],
                   label=_level(lv), linewidths=0)  # fmt: skip
        drawn = True
    if not drawn:
        canvas.centred_note(ax, "no TTFT measured: it needs --streaming")
    ax.set_ylabel("time to first token (ms)")
    if len(lengths) == 1:
        (length,) = lengths
        ax.set_xlim(0, 2 * length)
        ax.set_xlabel(f"input length (tokens)\nevery prompt had {length:g} tokens: "
                      "--synthetic-input-tokens-stddev varies them")  # fmt: skip
    else:
        ax.set_xlim(left=0)
        ax.set_xlabel("input length (tokens)")
    ax.set_ylim(bottom=0)
    ax.set_title("TTFT vs input length, per request", fontsize=11)
    if len(tokens) > 1:
        canvas.legend_below(fig, ax, markerscale=2)
    return canvas.png(fig)


def goodput_vs_load(run: SweepResult) -> bytes:
    """Goodput (requests/s that met every --goodput objective) beside the throughput against load,
    and the share of requests that met them on the right."""
    fig, ax = canvas.new_figure(right=0.75)
    tokens = [(lv, t) for lv, t in _levels(run) if t.goodput_per_s is not None]
    xs = [lv.level for lv, _ in tokens]
    throughput = [lv.throughput_infer_per_s for lv, _ in tokens]
    rates = throughput + [t.goodput_per_s for _, t in tokens if t.goodput_per_s is not None]
    # Goodput wide underneath, the throughput thin and dashed over it: where every request met the
    # objectives the two are one line, and both stay visible.
    ax.plot(xs, [t.goodput_per_s for _, t in tokens], marker="o", markersize=5, linewidth=2.6, color=PALETTE[2],
            label="goodput (req/s)")  # fmt: skip
    ax.plot(xs, throughput, marker="o", markersize=2.5, color="#444444", linewidth=1, linestyle="--",
            label="throughput (req/s)")  # fmt: skip
    right = ax.twinx()
    right.plot(xs, [t.goodput_pct for _, t in tokens], marker="s", markersize=3, linestyle=":", color=PALETTE[4],
               label="met every objective (%)")  # fmt: skip
    # 100 % below the top, and the rates' highest point lower still: the three lines meet at the
    # top right when every request met the objectives.
    right.set_ylim(0, 115)
    right.set_yticks([0, 20, 40, 60, 80, 100])
    right.set_ylabel("requests within the objectives (%)", color=PALETTE[4])
    right.spines["top"].set_visible(False)
    canvas.set_load_axis(ax, xs, run.mode)
    ax.set_ylabel("requests/s")
    ax.set_ylim(0, max(rates) * 1.3 if rates and max(rates) > 0 else None)
    slo = next((t.goodput_slo for _, t in tokens if t.goodput_slo), "")
    ax.set_title(f"Goodput vs load ({slo})" if slo else "Goodput vs load", fontsize=11)
    canvas.legend_below(fig, ax, right)
    return canvas.png(fig)


#: The generative figures of a sweep, with their alt texts, in the report's order: (alt, draw,
#: wide, drawn from the levels' request samples).
FIGURES: tuple[tuple[str, Callable[[SweepResult], bytes], bool, bool], ...] = (
    ("TTFT distribution per level", ttft_distribution, False, True),
    ("ITL distribution per level", itl_distribution, False, True),
    ("TTFT, ITL and end-to-end latency vs load", token_latency_vs_load, True, False),
    ("output tokens/s, total and per user, vs latency", tokens_vs_latency, False, False),
    ("TTFT vs input length, per request", ttft_vs_input_length, False, True),
)


#: The figures of TTFT and ITL, which only a streamed answer has: an unstreamed run leaves them out
#: (empty axes saying "it needs --streaming" four times), and the report says why once.
STREAMED_ONLY = frozenset({ttft_distribution, itl_distribution, token_latency_vs_load, ttft_vs_input_length})


def figures_of(run: SweepResult) -> list[tuple[str, Callable[[SweepResult], bytes], bool]]:
    """The figures a generative sweep gets: those from request samples only when its levels kept
    one (result files written before samples were kept have none), those of TTFT and ITL only when
    some TTFT was measured (`STREAMED_ONLY`), goodput only with --goodput."""
    sampled = any(lv.tokens is not None and lv.tokens.sample is not None for lv in run.levels)
    streamed = any(t.ttft_ms.count for _, t in _levels(run))
    figures = [
        (alt, draw, wide)
        for alt, draw, wide, per_request in FIGURES
        if (sampled or not per_request) and (streamed or draw not in STREAMED_ONLY)
    ]
    if any(lv.tokens is not None and lv.tokens.goodput_per_s is not None for lv in run.levels):
        figures.append(("goodput vs load", goodput_vs_load, False))
    return figures
