"""Latency summaries (--metrics-config summary_latencies=true): the sliding window, the quantiles,
the families' exposition in Triton's form, and the flags that turn them on."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from reference_server.config import config_from_args
from reference_server.frontends.metrics import model_families, render_exposition, summary_families
from reference_server.scheduling.stats import ModelStats
from reference_server.scheduling.summaries import (
    DEFAULT_QUANTILES,
    LatencySummary,
    SummarizedStats,
    parse_quantiles,
)


def test_quantiles_are_nearest_rank_values_of_the_window() -> None:
    summary = LatencySummary()
    for value in range(1, 101):
        summary.observe(value, now=0.0)
    assert summary.quantiles([0.5, 0.9, 0.99, 1.0, 0.0], now=1.0) == [50.0, 90.0, 99.0, 100.0, 1.0]
    assert (summary.count, summary.total) == (100, 5050)


def test_the_window_forgets_after_a_minute_but_count_and_sum_stay() -> None:
    summary = LatencySummary()
    summary.observe(1000, now=0.0)
    summary.observe(7, now=50.0)  # a later age bucket
    assert summary.quantiles([1.0], now=59.0) == [1000.0]
    assert summary.quantiles([1.0], now=61.0) == [7.0]  # the first bucket aged out
    assert all(math.isnan(v) for v in summary.quantiles([0.5, 0.9], now=200.0))
    summary.observe(3, now=201.0)
    assert summary.quantiles([0.5], now=201.0) == [3.0]
    assert (summary.count, summary.total) == (3, 1010)


def test_summarized_stats_observe_microseconds_and_cache_hits_in_the_queue_alone() -> None:
    stats = SummarizedStats()
    stats.record_success(5_000_999, 1_000_999, 1_999, 2_000_000, 3_000)
    stats.record_cache_hit(9_000, 4_000, 1_000)
    assert (stats.request_summary.count, stats.request_summary.total) == (1, 5_000)
    assert (stats.queue_summary.count, stats.queue_summary.total) == (2, 1_004)
    assert (stats.compute_input_summary.total, stats.compute_infer_summary.total) == (1, 2_000)
    assert stats.success_count == 2  # the statistics as a plain ModelStats counts them


def test_summary_families_read_as_prometheus_summaries_in_tritons_form() -> None:
    stats = SummarizedStats()
    for ms in (1, 2, 3, 4):
        stats.record_success(ms * 1_000_000, 1_000, 0, ms * 1_000_000, 0)
    served = [("m", "1", stats), ("plain", "1", ModelStats())]
    quantiles = tuple(q for q, _ in DEFAULT_QUANTILES)
    text = render_exposition([*model_families(served), *summary_families(served, quantiles)])
    assert (
        "# HELP nv_inference_queue_summary_us Summary of inference queuing duration in microseconds "
        "(includes cached requests)\n# TYPE nv_inference_queue_summary_us summary\n"
        'nv_inference_queue_summary_us_count{model="m",version="1"} 4\n'
        'nv_inference_queue_summary_us_sum{model="m",version="1"} 4\n'
        'nv_inference_queue_summary_us{model="m",version="1",quantile="0.5"} 1\n'
    ) in text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    names = [n for n in families if n.endswith("_summary_us")]
    assert names == [
        "nv_inference_request_summary_us",
        "nv_inference_queue_summary_us",
        "nv_inference_compute_input_summary_us",
        "nv_inference_compute_infer_summary_us",
        "nv_inference_compute_output_summary_us",
    ]
    request = {(s.name, s.labels.get("quantile")): s.value for s in families["nv_inference_request_summary_us"].samples}
    assert request[("nv_inference_request_summary_us_count", None)] == 4
    assert request[("nv_inference_request_summary_us_sum", None)] == 10_000
    assert request[("nv_inference_request_summary_us", "0.5")] == 2_000
    assert request[("nv_inference_request_summary_us", "0.999")] == 4_000
    assert all(s.labels["model"] == "m" for n in names for s in families[n].samples)  # not the plain stats'


def test_a_cached_model_has_no_request_summary_and_an_empty_window_is_nan() -> None:
    stats = SummarizedStats(cache_enabled=True)
    text = render_exposition(summary_families([("m", "1", stats)], (0.5,)))
    assert "nv_inference_request_summary_us" not in text
    assert 'nv_inference_queue_summary_us{model="m",version="1",quantile="0.5"} NaN\n' in text


def test_summaries_are_off_unless_asked_for_exactly_true(tmp_path: Path) -> None:
    def parse(*args: str) -> tuple[bool, tuple[tuple[float, float], ...]]:
        config = config_from_args(["--model-repository", str(tmp_path), *args])
        return config.metrics_summary_latencies, config.metrics_summary_quantiles

    assert parse() == (False, DEFAULT_QUANTILES)
    assert parse("--metrics-config", "summary_latencies=true") == (True, DEFAULT_QUANTILES)
    assert parse("--metrics-config=summary_latencies=1")[0] is False  # Triton compares with "true"
    assert parse(
        "--metrics-config=summary_latencies=true", "--metrics-config", "summary_quantiles=0.5:0.05,0.99:0.001"
    ) == (True, ((0.5, 0.05), (0.99, 0.001)))


@pytest.mark.parametrize("value", ["0.5", "0.5:x", "2:0.1", "0.5:0.05,"])
def test_bad_quantiles_exit_2_naming_the_setting(
    value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        config_from_args(["--model-repository", str(tmp_path), f"--metrics-config=summary_quantiles={value}"])
    assert exited.value.code == 2
    assert "--metrics-config summary_quantiles:" in capsys.readouterr().err
    with pytest.raises(ValueError):
        parse_quantiles(value)
