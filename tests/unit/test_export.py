"""The report renderers: perf_analyzer's CSV layout (against headers and rows the real
perf_analyzer 2.48.0 wrote), the tidy CSV and its history form, the profile export JSON and the
console summary."""

from __future__ import annotations

import dataclasses
import io
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from perfkit.load.samples import SampleArrays, SampleBuffer
from perfkit.report.export import ProfileExperiment, render_pa_csv, render_profile_export, render_summary_table
from perfkit.report.tidy import TIDY_COLUMNS, TIDY_SCHEMA_VERSION, append_tidy_csv, render_tidy_csv, tidy_header
from perfkit.results.files import write_text_atomic
from perfkit.results.model import (
    Check,
    LatencyStats,
    LevelResult,
    ResourceUsage,
    ServerStats,
    SweepResult,
    WindowResult,
)

# Written by perf_analyzer 2.48.0 (`-f`) against the reference server's `mlp` model, with the options
# named; pasted verbatim.
PA_CONCURRENCY = (
    "Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,Server Compute Input,"
    "Server Compute Infer,Server Compute Output,Client Recv,p50 latency,p90 latency,p95 latency,p99 latency\n"
    "1,580.972,80,335,1165,0,133,1,0,1635,1972,2156,2726\n"
    "2,1473.43,40,473,712,8,114,4,0,1598,2042,2139,2386\n"
)  # --concurrency-range 1:2
PA_REQUEST_RATE_HEADER = (
    "Request Rate,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,Server Compute Input,"
    "Server Compute Infer,Server Compute Output,Client Recv,p50 latency,p90 latency,p95 latency,p99 latency"
)  # --request-rate-range 50:100:50, and --request-intervals FILE
PA_REQUEST_RATE_ROW = "12.5,12.1997,241,1140,1263,0,353,4,0,2883,3245,3279,5214"  # --request-rate-range 12.5
PA_PERCENTILE_97_HEADER = (
    "Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,Server Compute Input,"
    "Server Compute Infer,Server Compute Output,Client Recv,p50 latency,p90 latency,p95 latency,p97 latency,"
    "p99 latency"
)  # --percentile 97
PA_VERBOSE_METRICS_HEADER = (
    "Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,Server Compute Input,"
    "Server Compute Infer,Server Compute Output,Client Recv,p50 latency,p90 latency,p95 latency,p99 latency,"
    "Avg latency,request/response,response wait,Avg GPU Utilization,Avg GPU Power Usage,Max GPU Memory Usage,"
    "Total GPU Memory"
)  # --verbose-csv --collect-metrics (without --verbose-csv, --collect-metrics adds no columns)
# Its row was "1,581.108,65,346,1170,0,129,1,0,1595,1927,2071,3487,1714,65,1641,,,," (no GPU there): its
# "response wait" comes from the client library's request time (8 µs under the average latency here),
# where perfkit's comes from the average latency.
PA_VERBOSE_PERCENTILE_95_HEADER = (
    "Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,Server Compute Input,"
    "Server Compute Infer,Server Compute Output,Client Recv,p50 latency,p90 latency,p95 latency,p99 latency,"
    "request/response,response wait"
)  # --verbose-csv --percentile 95: no second p95 column, and no Avg latency


def make_level(**overrides: Any) -> LevelResult:
    """A LevelResult with every field set to a distinct, recognisable value."""
    latency = LatencyStats(
        count=1000, mean_us=1714.9, std_us=300.5, min_us=900.2, max_us=9000.7,
        p50_us=1595.9, p90_us=1927.3, p95_us=2071.99, p99_us=3487.5, p999_us=5000.25,
        p99_ci_low_us=3400.0, p99_ci_high_us=3600.0,
    )  # fmt: skip
    fields: dict[str, Any] = dict(
        mode="concurrency",
        level=1.0,
        batch_size=1,
        stable=True,
        duration_s=1.5,
        request_count=1005,
        ok_count=1000,
        error_count=5,
        errors={"timeout": 2, "HTTP 503": 3},
        throughput_infer_per_s=581.1084,
        throughput_ci_low=575.25,
        throughput_ci_high=590.5,
        send_rate_per_s=600.0,
        latency=latency,
        latency_from_intended=dataclasses.replace(latency, p99_us=4000.0),
        delayed_pct=0.5,
        max_send_lag_us=1500.0,
        client_send_us=65.9,
        client_recv_us=0.4,
        network_server_us=346.7,
        server=ServerStats(
            success_count=1000,
            fail_count=0,
            inference_count=1000,
            execution_count=400,
            avg_batch_size=2.5,
            request_us=1650.0,
            queue_us=1170.99,
            compute_input_us=0.9,
            compute_infer_us=129.5,
            compute_output_us=1.2,
            overhead_us=348.0,
            batch_sizes={1: 100, 2: 100, 4: 200},
        ),  # fmt: skip
        resources=ResourceUsage(
            gpu_utilization={"GPU-b": 0.25, "GPU-a": 0.5},
            gpu_power_w={"GPU-a": 120.5, "GPU-b": 80.0},
            gpu_memory_used_bytes={"GPU-a": 1024, "GPU-b": 8589934592},
            gpu_memory_total_bytes={"GPU-a": 17179869184, "GPU-b": 17179869184},
            client_cpu_pct=35.5,
            client_cpu_us_per_request=12.25,
            server_cpu_pct=20.0,
            notes=("a note",),
        ),
        windows=(WindowResult(0, 500_000_000, 300, 300, 0, 600.0, 1700.0),),
        checks=(Check("stable", True, "3 windows within 10%"), Check("errors", False, "5 errors", "fix the server")),
        bytes_out_per_request=256.0,
        bytes_in_per_request=64.0,
    )
    fields.update(overrides)
    return LevelResult(**fields)


def make_sweep(levels: tuple[LevelResult, ...]) -> SweepResult:
    return SweepResult(
        model="mlp", model_version="1", url="localhost:8000", protocol="http", mode=levels[0].mode,
        levels=levels, provenance={"perfkit": "0.1.0"},
    )  # fmt: skip


def lines(text: str) -> list[str]:
    assert text.endswith("\n")
    return text.splitlines()


# -- perf_analyzer CSV ------------------------------------------------------------------------------


def test_pa_csv_matches_real_perf_analyzer_concurrency_output() -> None:
    levels = [
        make_level(
            level=2.0, throughput_infer_per_s=1473.4321, client_send_us=40.2, network_server_us=473.1,
            server=ServerStats(queue_us=712.9, compute_input_us=8.5, compute_infer_us=114.0, compute_output_us=4.99),
            client_recv_us=0.0,
            latency=LatencyStats(count=10, p50_us=1598.0, p90_us=2042.7, p95_us=2139.0, p99_us=2386.2),
        ),
        make_level(
            level=1.0, throughput_infer_per_s=580.97249, client_send_us=80.0, network_server_us=335.0,
            server=ServerStats(queue_us=1165.0, compute_input_us=0.5, compute_infer_us=133.0, compute_output_us=1.0),
            client_recv_us=0.9,
            latency=LatencyStats(count=10, p50_us=1635.0, p90_us=1972.0, p95_us=2156.0, p99_us=2726.999),
        ),
    ]  # fmt: skip
    assert render_pa_csv(levels) == PA_CONCURRENCY


def test_pa_csv_request_rate_header_and_row() -> None:
    level = make_level(
        mode="request_rate", level=12.5, throughput_infer_per_s=12.19974, client_send_us=241.0,
        network_server_us=1140.0, client_recv_us=0.0,
        server=ServerStats(queue_us=1263.0, compute_input_us=0.0, compute_infer_us=353.0, compute_output_us=4.0),
        latency=LatencyStats(count=10, p50_us=2883.0, p90_us=3245.0, p95_us=3279.0, p99_us=5214.0),
    )  # fmt: skip
    assert lines(render_pa_csv([level])) == [PA_REQUEST_RATE_HEADER, PA_REQUEST_RATE_ROW]
    # perf_analyzer heads custom intervals with "Request Rate" too.
    custom = dataclasses.replace(level, mode="custom_intervals", level=6.0)
    assert lines(render_pa_csv([custom]))[0] == PA_REQUEST_RATE_HEADER


def test_pa_csv_custom_percentile_in_sorted_position() -> None:
    latency = dataclasses.replace(make_level().latency, custom_percentile=97.0, custom_us=3000.7)
    header, row = lines(render_pa_csv([make_level(latency=latency)]))
    assert header == PA_PERCENTILE_97_HEADER
    assert row.split(",")[-5:] == ["1595", "1927", "2071", "3000", "3487"]


def test_pa_csv_verbose_with_metrics_matches_real_perf_analyzer() -> None:
    level = make_level(resources=ResourceUsage(), throughput_infer_per_s=581.108)
    header, row = lines(render_pa_csv([level], verbose_csv=True, collect_metrics=True))
    assert header == PA_VERBOSE_METRICS_HEADER
    # Avg latency 1714, request/response 65 + 0, response wait 1714 - 65 - 0, four empty GPU cells.
    assert row == "1,581.108,65,346,1170,0,129,1,0,1595,1927,2071,3487,1714,65,1649,,,,"


def test_pa_csv_verbose_with_a_listed_custom_percentile() -> None:
    latency = dataclasses.replace(make_level().latency, custom_percentile=95.0, custom_us=2071.99)
    header = lines(render_pa_csv([make_level(latency=latency)], verbose_csv=True))[0]
    assert header == PA_VERBOSE_PERCENTILE_95_HEADER


def test_pa_csv_collect_metrics_needs_verbose_csv_as_in_perf_analyzer() -> None:
    assert render_pa_csv([make_level()], collect_metrics=True) == render_pa_csv([make_level()])


def test_pa_csv_gpu_cells_per_gpu_sorted_by_uuid() -> None:
    row = lines(render_pa_csv([make_level()], verbose_csv=True, collect_metrics=True))[1].split(",")
    assert row[-4:] == [
        "GPU-a:0.5;GPU-b:0.25;",
        "GPU-a:120.5;GPU-b:80;",
        "GPU-a:1024;GPU-b:8589934592;",
        "GPU-a:17179869184;GPU-b:17179869184;",
    ]


def test_pa_csv_without_server_stats_drops_server_columns() -> None:
    header, row = lines(render_pa_csv([make_level(server=None)]))
    assert header == (
        "Concurrency,Inferences/Second,Client Send,Client Recv,p50 latency,p90 latency,p95 latency,p99 latency"
    )
    assert row == "1,581.108,65,0,1595,1927,2071,3487"


def test_pa_csv_levels_without_server_stats_among_others_write_zeros() -> None:
    rows = lines(render_pa_csv([make_level(), make_level(server=None, throughput_infer_per_s=600.0)]))
    assert rows[2].split(",")[3:8] == ["346", "0", "0", "0", "0"]


def test_pa_csv_times_truncate_to_integer_microseconds() -> None:
    level = make_level(
        server=None, client_send_us=99.999, client_recv_us=1.5,
        latency=LatencyStats(count=3, p50_us=0.99, p90_us=1000.9999, p95_us=1001.5, p99_us=-3.0),
    )  # fmt: skip
    assert lines(render_pa_csv([level]))[1] == "1,581.108,99,1,0,1000,1001,0"


def test_pa_csv_throughput_formatted_as_cpp_ostream() -> None:
    def throughput_cell(value: float) -> str:
        return lines(render_pa_csv([make_level(throughput_infer_per_s=value)]))[1].split(",")[1]

    assert throughput_cell(69.2) == "69.2"
    assert throughput_cell(50.0) == "50"
    assert throughput_cell(123456.7) == "123457"
    assert throughput_cell(1234567.0) == "1.23457e+06"
    assert throughput_cell(0.0) == "0"


def test_pa_csv_rows_sorted_by_increasing_throughput() -> None:
    levels = [
        make_level(level=float(c), throughput_infer_per_s=t)
        for c, t in ((1, 500.0), (2, 900.0), (4, 1200.0), (8, 1100.0))
    ]
    rows = lines(render_pa_csv(levels))[1:]
    assert [row.split(",")[0] for row in rows] == ["1", "2", "8", "4"]


def test_pa_csv_refuses_mixed_modes() -> None:
    with pytest.raises(ValueError, match="one load mode"):
        render_pa_csv([make_level(), make_level(mode="request_rate")])


def test_pa_csv_without_levels_is_a_header() -> None:
    assert render_pa_csv([]).count("\n") == 1


# -- tidy CSV ---------------------------------------------------------------------------------------


def test_tidy_columns_are_snake_case_unique_and_carry_units() -> None:
    names = [column.name for column in TIDY_COLUMNS]
    assert len(names) == len(set(names))
    assert all(name == name.lower() and " " not in name for name in names)
    suffix = {"ms": "_ms", "us": "_us", "s": "_s", "%": "_pct", "W": "_w", "infer/s": "_per_s", "req/s": "_per_s"}
    for column in TIDY_COLUMNS:
        if column.unit in suffix:
            assert column.name.endswith(suffix[column.unit]), column.name
    assert names[0] == "schema_version"


def test_tidy_csv_parses_with_pandas() -> None:
    levels = (make_level(level=4.0), make_level(level=1.0, stable=False, checks=()), make_level(level=2.0))
    frame = pd.read_csv(io.StringIO(render_tidy_csv(make_sweep(levels))))
    assert list(frame.columns) == tidy_header()
    assert len(frame) == 3
    assert list(frame["level"]) == [4, 1, 2]  # the sweep's order, not throughput's
    assert (frame["schema_version"] == TIDY_SCHEMA_VERSION).all()
    first = frame.iloc[0]
    assert first["model"] == "mlp" and first["protocol"] == "http" and first["mode"] == "concurrency"
    assert first["model_version"] == 1
    assert frame["stable"].dtype == bool and list(frame["stable"]) == [True, False, True]
    assert list(frame["valid"]) == [False, True, False]
    assert first["errors"] == "HTTP 503=3;timeout=2"
    assert first["failed_checks"] == "errors"
    assert first["p99_ms"] == pytest.approx(3.4875)
    assert first["p50_ms"] == pytest.approx(1.5959)
    assert first["p999_ms"] == pytest.approx(5.00025)
    assert first["p99_ci_low_ms"] == pytest.approx(3.4)
    assert first["p99_from_intended_ms"] == pytest.approx(4.0)
    assert first["max_send_lag_ms"] == pytest.approx(1.5)
    assert first["throughput_infer_per_s"] == pytest.approx(581.1084)
    assert first["throughput_ci_high_infer_per_s"] == pytest.approx(590.5)
    assert first["client_send_us"] == pytest.approx(65.9)
    assert first["server_queue_us"] == pytest.approx(1170.99)
    assert first["server_execution_count"] == 400
    assert first["gpu_utilization_pct"] == pytest.approx(37.5)
    assert first["gpu_memory_used_max_bytes"] == 8589934592
    assert first["gpu_power_mean_w"] == pytest.approx(100.25)
    assert first["client_cpu_us_per_request"] == pytest.approx(12.25)
    assert pd.isna(first["custom_percentile"]) and pd.isna(first["custom_percentile_ms"])


def test_tidy_csv_missing_values_are_empty_cells() -> None:
    level = make_level(
        server=None, resources=ResourceUsage(), errors={}, error_count=0, checks=(),
        latency=LatencyStats(), latency_from_intended=LatencyStats(),
    )  # fmt: skip
    text = render_tidy_csv(make_sweep((level,)))
    row = dict(zip(*(line.split(",") for line in lines(text))))
    for name in ("p50_ms", "p99_ci_high_ms", "p99_from_intended_ms", "server_queue_us", "server_avg_batch_size",
                 "gpu_utilization_pct", "gpu_memory_used_max_bytes", "client_cpu_pct", "server_cpu_pct",
                 "errors", "failed_checks"):  # fmt: skip
        assert row[name] == "", name
    assert row["error_count"] == "0"
    assert row["valid"] == "true"


def test_tidy_csv_custom_percentile_and_number_format() -> None:
    latency = dataclasses.replace(make_level().latency, custom_percentile=99.9, custom_us=4500.0)
    text = render_tidy_csv(make_sweep((make_level(latency=latency, mode="request_rate", level=12.5),)))
    row = dict(zip(*(line.split(",") for line in lines(text))))
    assert row["custom_percentile"] == "99.9"
    assert row["custom_percentile_ms"] == "4.5"
    assert row["level"] == "12.5"
    assert row["duration_s"] == "1.5"
    assert row["batch_size"] == "1"


def test_tidy_csv_quotes_cells_with_commas() -> None:
    level = make_level(errors={"HTTP 500: a, b": 1})
    frame = pd.read_csv(io.StringIO(render_tidy_csv(make_sweep((level,)))))
    assert frame.iloc[0]["errors"] == "HTTP 500: a, b=1"


def test_append_tidy_csv_starts_and_extends_a_history() -> None:
    sweep = make_sweep((make_level(level=1.0), make_level(level=2.0)))
    first = append_tidy_csv(None, sweep, "run-1", "2024-01-01T00:00:00Z")
    second = append_tidy_csv(first, sweep, "run-2", "2024-01-02T00:00:00Z")
    assert append_tidy_csv("", sweep, "run-1", "2024-01-01T00:00:00Z") == first
    assert second.startswith(first)
    frame = pd.read_csv(io.StringIO(second))
    assert list(frame.columns) == ["run_id", "timestamp", *tidy_header()]
    assert list(frame["run_id"]) == ["run-1", "run-1", "run-2", "run-2"]
    assert list(frame["level"]) == [1, 2, 1, 2]
    # A history whose last line lacks its newline is still extended on a new line.
    assert pd.read_csv(io.StringIO(append_tidy_csv(first.rstrip("\n"), sweep, "r", "t"))).shape[0] == 4


def test_append_tidy_csv_refuses_another_header() -> None:
    sweep = make_sweep((make_level(),))
    history = append_tidy_csv(None, sweep, "run-1", "t")
    header, rest = history.split("\n", 1)
    with pytest.raises(ValueError, match=r"missing columns \['p999_ms'\]"):
        append_tidy_csv(header.replace(",p999_ms", "") + "\n" + rest, sweep, "run-2", "t")
    with pytest.raises(ValueError, match=r"unexpected columns \['extra'\]"):
        append_tidy_csv(header + ",extra\n", sweep, "run-2", "t")
    swapped = header.replace("p50_ms,p90_ms", "p90_ms,p50_ms")
    with pytest.raises(ValueError, match=r"is 'p90_ms', expected 'p50_ms'"):
        append_tidy_csv(swapped + "\n", sweep, "run-2", "t")
    with pytest.raises(ValueError, match="missing columns"):
        append_tidy_csv(render_tidy_csv(sweep), sweep, "run-2", "t")  # a plain tidy CSV has no run_id


def test_write_text_atomic(tmp_path: Path) -> None:
    target = tmp_path / "out.csv"
    write_text_atomic(target, "a,b\n1,2\n")
    write_text_atomic(target, "a,b\n3,4\n")
    assert target.read_text() == "a,b\n3,4\n"
    assert [p.name for p in tmp_path.iterdir()] == ["out.csv"]


# -- profile export ---------------------------------------------------------------------------------


def make_samples() -> SampleArrays:
    buffer = SampleBuffer()
    buffer.record(intended_ns=1_000, sent_ns=1_500, done_ns=3_000)
    buffer.record(intended_ns=2_000, sent_ns=2_000, done_ns=9_000, error="HTTP 503")
    buffer.record(intended_ns=3_000, sent_ns=3_100, done_ns=4_000)
    return buffer.arrays()


def test_profile_export_structure_and_timestamps() -> None:
    offset = 1_700_000_000_000_000_000
    text = render_profile_export(
        [
            ProfileExperiment("concurrency", 4, make_samples(), [0, 5_000, 10_000]),
            ("request_rate", 50, make_samples(), [100]),
            ("custom_intervals", 6.0, make_samples(), []),
        ],
        version="0.1.0",
        epoch_offset_ns=offset,
        endpoint="v2/models/mlp/infer",
    )
    assert "\n" not in text and ", " not in text.replace("HTTP 503", "")  # compact, one line, as PA writes it
    data = json.loads(text)
    assert list(data) == ["experiments", "version", "service_kind", "endpoint"]
    assert (data["version"], data["service_kind"], data["endpoint"]) == ("0.1.0", "triton", "v2/models/mlp/infer")
    concurrency, rate, custom = data["experiments"]
    assert list(concurrency) == ["experiment", "requests", "window_boundaries"]
    assert concurrency["experiment"] == {"mode": "concurrency", "value": 4}
    assert isinstance(concurrency["experiment"]["value"], int)
    assert '"experiment":{"mode":"request_rate","value":50.0}' in text
    assert custom["experiment"] == {"mode": "request_rate", "value": 6.0}
    assert concurrency["window_boundaries"] == [offset, offset + 5_000, offset + 10_000]
    assert rate["window_boundaries"] == [offset + 100] and custom["window_boundaries"] == []
    first, failed, _ = concurrency["requests"]
    assert list(first) == [
        "timestamp", "request_inputs", "response_timestamps", "response_outputs", "intended_timestamp", "error",
    ]  # fmt: skip
    assert first == {
        "timestamp": offset + 1_500,
        "request_inputs": {},
        "response_timestamps": [offset + 3_000],
        "response_outputs": [{}],
        "intended_timestamp": offset + 1_000,
        "error": "",
    }
    assert failed["error"] == "HTTP 503" and failed["timestamp"] == offset + 2_000


def test_profile_export_escapes_error_kinds() -> None:
    buffer = SampleBuffer()
    buffer.record(0, 0, 10, error='bad "quote" \\ \n')
    text = render_profile_export([("concurrency", 1, buffer.arrays(), [])], version="v", epoch_offset_ns=0)
    assert json.loads(text)["experiments"][0]["requests"][0]["error"] == 'bad "quote" \\ \n'


def test_profile_export_of_100k_requests_is_quick() -> None:
    n = 100_000
    base = np.arange(n, dtype=np.int64) * 10_000
    zeros = np.zeros(n, dtype=np.int64)
    samples = SampleArrays(
        base, base + 5, base + 2_000_000, zeros, zeros, zeros, zeros, zeros, zeros, zeros - 1, zeros[:0], ("",)
    )
    start = time.perf_counter()
    text = render_profile_export([("request_rate", 1000.0, samples, [0, n * 10_000])], version="v", epoch_offset_ns=7)
    elapsed = time.perf_counter() - start
    assert elapsed < 5.0, elapsed  # ~0.1 s on a laptop
    requests = json.loads(text)["experiments"][0]["requests"]
    assert len(requests) == n and requests[-1]["timestamp"] == int(base[-1]) + 5 + 7


# -- console summary --------------------------------------------------------------------------------


def test_summary_table_concurrency() -> None:
    table = render_summary_table([make_level(), make_level(level=8.0, stable=False, server=None, checks=())])
    assert table[0].split() == [
        "concurrency", "infer/s", "p50", "ms", "p90", "ms", "p99", "ms", "errors", "avg", "batch", "stable", "valid",
    ]  # fmt: skip
    assert set(table[1]) <= {"-", " "}
    assert table[2].split() == ["1", "581.1", "1.60", "1.93", "3.49", "5", "2.50", "yes", "NO"]
    assert table[3].split() == ["8", "581.1", "1.60", "1.93", "3.49", "5", "-", "NO", "yes"]
    assert len({len(line) for line in table[:2]}) == 1  # the header is as wide as the rule


def test_summary_table_rate_mode_shows_corrected_latency_and_delays() -> None:
    table = render_summary_table([make_level(mode="request_rate", level=12.5, latency=LatencyStats())])
    assert "p99 corr ms" in table[0] and "sent/s" in table[0] and "delayed %" in table[0]
    assert table[2].split() == ["12.5", "581.1", "-", "-", "-", "4.00", "600.0", "0.5", "5", "2.50", "yes", "NO"]
