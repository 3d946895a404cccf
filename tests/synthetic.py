"""Synthetic sweep results for the report, compare and scenario tests: every field set, numbers
chosen by the test, no server and no clock."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from perfkit.analysis.stats import throughput_ci
from perfkit.results.model import (
    Check,
    LatencyStats,
    LevelResult,
    ResourceUsage,
    ServerStats,
    SweepResult,
    TokenFigures,
    TokenSample,
    ValueStats,
    WindowResult,
    sweep_to_json,
)

WINDOW_NS = 1_000_000_000


def make_level(
    level: float,
    throughputs: Sequence[float],
    *,
    mode: str = "concurrency",
    p99_ms: float = 2.0,
    p99_ci_ms: tuple[float, float] | None = None,
    latency_ms: Sequence[float] | None = None,
    start_ns: int = 0,
    errors: dict[str, int] | None = None,
    delayed_pct: float = 0.0,
    stable: bool = True,
    gpu: bool = False,
    checks: Sequence[Check] | None = None,
) -> LevelResult:
    """A level whose windows have the given throughputs (and stabilising latencies, in ms)."""
    latency_ms = latency_ms or [p99_ms / 2] * len(throughputs)
    windows = tuple(
        WindowResult(
            start_ns + i * WINDOW_NS,
            start_ns + (i + 1) * WINDOW_NS,
            int(tp),
            int(tp),
            0,
            float(tp),
            float(lat) * 1e3,
        )
        for i, (tp, lat) in enumerate(zip(throughputs, latency_ms))
    )
    reported = windows[-3:]
    low, high = throughput_ci(reported)
    ci_low, ci_high = p99_ci_ms or (p99_ms * 0.95, p99_ms * 1.05)
    count = int(sum(w.ok_count for w in reported))
    latency = LatencyStats(
        count=count, mean_us=p99_ms * 400, std_us=p99_ms * 100, min_us=p99_ms * 200, max_us=p99_ms * 2000,
        p50_us=p99_ms * 400, p90_us=p99_ms * 600, p95_us=p99_ms * 750, p99_us=p99_ms * 1000, p999_us=p99_ms * 1500,
        p99_ci_low_us=ci_low * 1000, p99_ci_high_us=ci_high * 1000,
    )  # fmt: skip
    errors = errors or {}
    error_count = sum(errors.values())
    resources = ResourceUsage(
        gpu_utilization={"GPU-0": 0.4 + level / 100} if gpu else {},
        gpu_memory_used_bytes={"GPU-0": 2 * 2**30} if gpu else {},
        client_cpu_pct=20.0 + level,
        client_cpu_us_per_request=100.0,
        server_cpu_pct=30.0 + level,
    )
    default_checks = (
        Check("stable", stable, "the last 3 windows agree within 10%", "" if stable else "measure longer windows (-p)"),
        Check(
            "errors",
            error_count == 0,
            f"{error_count} of {count} requests failed",
            "" if error_count == 0 else "read the server's log",
        ),  # fmt: skip
    )
    return LevelResult(
        mode=mode, level=float(level), batch_size=1, stable=stable, duration_s=len(reported) * WINDOW_NS / 1e9,
        request_count=count + error_count, ok_count=count, error_count=error_count, errors=errors,
        throughput_infer_per_s=sum(w.throughput_infer_per_s for w in reported) / len(reported),
        throughput_ci_low=low, throughput_ci_high=high, send_rate_per_s=float(level) if mode != "concurrency" else 0.0,
        latency=latency, latency_from_intended=latency, delayed_pct=delayed_pct, max_send_lag_us=0.0,
        client_send_us=50.0, client_recv_us=20.0, network_server_us=300.0,
        server=ServerStats(success_count=count, inference_count=count, execution_count=count, avg_batch_size=1.5,
                           request_us=500.0, queue_us=200.0, compute_input_us=10.0, compute_infer_us=250.0,
                           compute_output_us=5.0),
        resources=resources, windows=windows, checks=tuple(checks) if checks is not None else default_checks,
    )  # fmt: skip


def make_token_figures(scale: float = 1.0) -> TokenFigures:
    """Token figures of a streamed chat level, every distribution filled, times ×scale."""

    def stats(mean: float) -> ValueStats:
        return ValueStats(100, mean, mean / 10, mean / 2, mean * 2, mean, mean * 1.2, mean * 1.3, mean * 1.5,
                          mean * 0.95, mean * 1.05, mean * 1.4, mean * 1.6)  # fmt: skip

    return TokenFigures(
        endpoint_type="chat", streaming=True, token_source="bytes", ttft_ms=stats(40.0 * scale),
        ttst_ms=stats(10.0 * scale), itl_ms=stats(10.0 * scale), input_tokens=stats(128.0), output_tokens=stats(64.0),
        output_tokens_per_s_per_request=stats(100.0 / scale), output_tokens_per_s=6400.0 / scale,
        total_tokens_per_s=19200.0 / scale, asked_count=100, goodput_slo="ttft_ms<=50", goodput_per_s=90.0 / scale,
        goodput_pct=90.0, sample=make_token_sample(scale),
    )  # fmt: skip


def make_token_sample(scale: float = 1.0, n: int = 100) -> TokenSample:
    """A level's sample of n requests: TTFT grows with the prompt (64..191 tokens), ITL and
    latency spread around their means, times ×scale; one request in ten has one token (no ITL)."""
    inputs = [64 + (i * 37) % 128 for i in range(n)]
    itl: list[float | None] = [None if i % 10 == 0 else round(10.0 * scale * (0.8 + 0.4 * (i % 7) / 6), 3)
                               for i in range(n)]  # fmt: skip
    ttft = [round(scale * (20.0 + 0.15 * tokens), 3) for tokens in inputs]
    latency = [round(t + 63 * (v or 0.0), 3) for t, v in zip(ttft, itl)]
    return TokenSample(n, tuple(ttft), tuple(itl), tuple(latency), tuple(inputs),
                       tuple(1 if v is None else 64 for v in itl))  # fmt: skip


def make_sweep(levels: Sequence[LevelResult], *, model: str = "mlp", **provenance: Any) -> SweepResult:
    """A sweep of these levels, laid end to end in time, with a plausible provenance."""
    placed = []
    offset = 0
    for level in levels:
        shift = offset - level.windows[0].start_ns
        windows = tuple(
            dataclasses.replace(w, start_ns=w.start_ns + shift, end_ns=w.end_ns + shift) for w in level.windows
        )
        placed.append(dataclasses.replace(level, windows=windows))
        offset = windows[-1].end_ns
    mode = levels[0].mode if levels else "concurrency"
    return SweepResult(
        model=model,
        model_version="",
        url="127.0.0.1:8000",
        protocol="http",
        mode=mode,
        levels=tuple(placed),
        provenance={
            "perfkit_version": "0.1.0",
            "git_commit": "0123456789abcdef",
            "started_at": "2026-01-02T03:04:05+00:00",
            "argv": ["sweep", "--concurrency-range", "1:4"],
            "seed": 0,
            "server": {"url": "127.0.0.1:8000", "embedded": True, "name": "perfkit-reference-server", "version": "0.1.0"},
            "machine": {"hostname": "testhost", "platform": "Linux", "python": "3.11", "cpu_count": 4},
            "spec": {"load": {"mode": mode, "start": 1, "end": 4, "step": 1, "latency_threshold_ms": 0.0},
                     "windows": {"mode": "time_windows", "interval_ms": 1000.0, "stability_pct": 10.0,
                                 "max_trials": 10, "stable_window_count": 3, "percentile": None}},
            **provenance,
        },
    )  # fmt: skip


def steady_sweep(scale: float = 1.0, *, p99_scale: float = 1.0, spread: float = 0.01, **kwargs: Any) -> SweepResult:
    """Concurrency 1, 2, 4 with five windows each, throughput ×scale and p99 ×p99_scale; `spread`
    is the relative window-to-window variation."""
    levels = []
    for c, base in ((1, 1000.0), (2, 1800.0), (4, 3000.0)):
        tps = [base * scale * (1 + spread * d) for d in (-1.0, 0.5, 0.0, 1.0, -0.5)]
        p99 = 1.0 + c * 0.5
        levels.append(make_level(c, tps, p99_ms=p99 * p99_scale, gpu=True))
    return make_sweep(levels, **kwargs)


def write_sweep_json(result: SweepResult, path: Path, *, kind: bool = False) -> Path:
    text = sweep_to_json(result)
    if kind:
        text = json.dumps({"kind": "sweep", **json.loads(text)})
    path.write_text(text)
    return path


def tune_json(tmp_path: Path) -> Path:
    """A tune.json laid out as `perfkit tune` writes it (report.tune_tables.render_json), three variants."""
    levels = [json.loads(sweep_to_json(steady_sweep(s)))["levels"] for s in (1.0, 1.5)]

    def figures(tp: float, p99: float) -> dict[str, object]:
        return {"throughput": {"value": tp, "low": tp * 0.98, "high": tp * 1.02},
                "p99_ms": {"value": p99, "low": p99 * 0.9, "high": p99 * 1.1}}  # fmt: skip

    def score(tp: float) -> dict[str, float]:  # the throughput objective's: ln(throughput), ±2 %
        return {"value": math.log(tp), "low": math.log(tp * 0.98), "high": math.log(tp * 1.02)}

    def variant(key: str, default: bool, fig: object, lv: object, status: str = "measured") -> dict[str, object]:
        return {"key": key, "description": f"<{key}>", "params": {"instance_count": 1}, "is_default": default,
                "status": status, "error": "", "config": {}, "levels": lv, "chosen_concurrency": 4,
                "figures": fig, "remeasures": [], "combined_figures": fig, "measured_in_this_run": True}  # fmt: skip

    data = {
        "schema_version": 1, "perfkit_version": "0.1.0", "started_at": "2026-01-01T00:00:00+00:00",
        "argv": ["tune", "models/mlp/config.pbtxt"], "model": "mlp", "config_path": "models/mlp/config.pbtxt",
        "server": {}, "settings": {"url": None, "protocol": "http", "search": "brute", "objective": {"throughput": 1.0},
                                   "constraints": ["p99_ms<=10"]},
        "variants": [
            variant("count=1 mbs=4 batching=off", True, figures(3000.0, 4.0), levels[0]),
            variant("count=2 mbs=8 batching=100us", False, figures(4500.0, 6.0), levels[1]),
            variant("count=4 mbs=8 batching=off", False, figures(6000.0, 30.0), []),
            variant("count=8 mbs=8 batching=off", False, None, [], status="failed"),
        ],
        "measurements": {"variants": 4, "levels": 24, "measured_in_this_run": 24},
        "ranking": [
            {"rank": 1, "key": "count=2 mbs=8 batching=100us", "status": "feasible", "violations": [],
             "score": score(4500.0), "gain_over_default": 0.5},
            {"rank": 2, "key": "count=1 mbs=4 batching=off", "status": "feasible", "violations": [],
             "score": score(3000.0), "gain_over_default": 0.0},
            {"rank": 3, "key": "count=4 mbs=8 batching=off", "status": "infeasible",
             "violations": ["p99_ms 30 > 10"], "score": score(6000.0), "gain_over_default": 1.0},
            {"rank": 4, "key": "count=8 mbs=8 batching=off", "status": "failed", "violations": [],
             "score": None, "gain_over_default": None},
        ],
        "leader": "count=2 mbs=8 batching=100us", "ties": ["count=2 mbs=8 batching=100us"],
        "best": "count=2 mbs=8 batching=100us", "completed": True, "stop_reason": "",
    }  # fmt: skip
    path = tmp_path / "tune.json"
    path.write_text(json.dumps(data))
    return path
