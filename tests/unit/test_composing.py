"""An ensemble's composing models (and --bls-composing-models): picked and differenced from literal
statistics JSON, written in perf_analyzer's composing-model CSV layout (checked against perf_analyzer
2.48.0's own files), read back for `perfkit compare`, and shown in the tidy CSV and on the console."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from perfkit.analysis.compare import compare_sweeps
from perfkit.analysis.server_stats import ensemble_steps, pick_tree, tree_diff
from perfkit.cli.sweep import parse_model_list
from perfkit.errors import PerfkitError
from perfkit.report.export import composing_csv_name, render_composing_csvs, render_composing_table
from perfkit.report.tidy import render_tidy_csv
from perfkit.results.model import ComposingStats, LatencyStats, ServerStats, sweep_from_json, sweep_to_json
from perfkit.results.pa_csv import composing_csvs, sweep_from_pa_csv
from perfkit.sweep.run import composing_models
from tests.unit.test_export import make_level, make_sweep
from tests.unit.test_server_stats import entry, response

# Written by perf_analyzer 2.48.0 (`-m mlp_pipeline --concurrency-range 1:2 -f pa.csv`) against the
# reference server's demo ensemble; pasted verbatim. Rows in the main file's order (by throughput).
PA_MAIN = (
    "Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,Server Compute Input,"
    "Server Compute Infer,Server Compute Output,Client Recv,p50 latency,p90 latency,p95 latency,p99 latency\n"
    "2,932.026,86,1490,79,8,466,7,0,2038,2889,3504,6677\n"
    "1,945.152,52,734,42,1,220,3,0,947,1200,1368,3613\n"
)
PA_MLP = (
    "Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,Server Compute Input,"
    "Server Compute Infer,Server Compute Output,Client Recv\n"
    "2,931.473,0,73,447,4,383,4,0\n"
    "1,945.152,0,38,202,0,185,2,0\n"
)
PA_PREPROCESS = (
    "Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,Server Compute Input,"
    "Server Compute Infer,Server Compute Output,Client Recv\n"
    "2,931.473,0,72,346,3,82,2,0\n"
    "1,945.705,0,26,175,0,34,1,0\n"
)

ENSEMBLE_CONFIG: dict[str, Any] = {
    "name": "ens",
    "platform": "ensemble",
    "ensemble_scheduling": {
        "step": [
            {"model_name": "pre", "model_version": -1},
            {"model_name": "inner", "model_version": "2"},  # gRPC JSON writes int64 as a string
            {"model_name": "pre", "model_version": -1},  # a model used twice is one composing model
        ]
    },
}


def composing(
    model: str, success: int, queue: float, c_in: float, infer: float, out: float, overhead: float
) -> ComposingStats:
    return ComposingStats(model, "1", ServerStats(success_count=success, queue_us=queue, compute_input_us=c_in,
                                                  compute_infer_us=infer, compute_output_us=out,
                                                  overhead_us=overhead))  # fmt: skip


def pa_levels() -> tuple[Any, ...]:
    """perf_analyzer's run above as perfkit levels: its figures, µs with fractions that truncate, and
    throughputs with the digits its CSV rounds away."""
    return (
        make_level(level=1.0, throughput_infer_per_s=945.152, server=ServerStats(success_count=1709, composing=(
            composing("mlp", 1709, 202.9, 0.4, 185.2, 2.7, 38.9), composing("preprocess", 1710, 175.1, 0.0, 34.5, 1.2, 26.0),
        ))),
        make_level(level=2.0, throughput_infer_per_s=932.0255, server=ServerStats(success_count=1687, composing=(
            composing("mlp", 1686, 447.3, 4.1, 383.0, 4.9, 73.2), composing("preprocess", 1686, 346.0, 3.0, 82.5, 2.0, 72.0),
        ))),
    )  # fmt: skip


def test_ensemble_steps_once_each_with_the_servers_choice_as_empty() -> None:
    assert ensemble_steps(ENSEMBLE_CONFIG) == [("pre", ""), ("inner", "2")]
    assert ensemble_steps({"name": "m", "platform": "onnxruntime_onnx"}) == []
    assert ensemble_steps({"platform": "ensemble"}) == []


def test_pick_tree_and_tree_diff_through_a_nested_ensemble() -> None:
    composing_map = {"ens": (("pre", ""), ("inner", "2")), "inner": (("leaf", ""),)}
    before = response(entry("1", 10, name="ens"), entry("1", 10, name="pre"), entry("1", 5, name="inner", us=500),
                      entry("2", 10, name="inner"), entry("3", 10, name="leaf"), entry("1", 99, name="other"))  # fmt: skip
    after = response(entry("1", 30, name="ens"), entry("1", 30, name="pre", us=2000), entry("1", 5, name="inner"),
                     entry("2", 30, name="inner"), entry("3", 40, name="leaf"), entry("1", 99, name="other"))  # fmt: skip
    first = pick_tree(before, "ens", "", composing_map)
    second = pick_tree(after, "ens", "", composing_map, previous=before)
    assert first is not None and second is not None
    assert sorted(second) == ["ens", "inner", "leaf", "pre"] and second["inner"]["version"] == "2"
    stats = tree_diff(first, second, "ens", composing_map)
    assert stats.success_count == 20
    assert [(c.model, c.version) for c in stats.composing] == [("inner", "2"), ("pre", "1")]  # by name
    inner, pre = stats.composing
    assert inner.server.success_count == 20 and [c.model for c in inner.server.composing] == ["leaf"]
    assert inner.server.composing[0].server.success_count == 30
    # pre's 20 new requests averaged (30·2000 − 10·1000)/20 = 2500 µs, 7/10 of it in compute infer.
    assert pre.server.request_us == pytest.approx(2500.0) and pre.server.compute_infer_us == pytest.approx(1750.0)
    assert pick_tree(after, "absent", "", composing_map) is None
    # A composing model with no entry (a cache hit ran no step) is left out, not an error.
    assert sorted(pick_tree(response(entry("1", 3, name="ens")), "ens", "", composing_map) or {}) == ["ens"]


def test_composing_csvs_match_real_perf_analyzer_files() -> None:
    files = render_composing_csvs(pa_levels())
    assert files == [("mlp", "1", PA_MLP), ("preprocess", "1", PA_PREPROCESS)]
    assert composing_csv_name("mlp", "1", "pa.csv") == "mlp_v1.pa.csv"
    assert render_composing_csvs((make_level(),)) == []


def test_perf_analyzer_composing_csvs_read_back_and_compared(tmp_path: Path) -> None:
    for name, text in (("pa.csv", PA_MAIN), ("mlp_v1.pa.csv", PA_MLP), ("preprocess_v1.pa.csv", PA_PREPROCESS),
                       ("mlp_v1.other.csv", "not this run's")):  # fmt: skip
        (tmp_path / name).write_text(text)
    found = composing_csvs(tmp_path / "pa.csv")
    assert [(model, version) for model, version, _ in found] == [("mlp", "1"), ("preprocess", "1")]
    base = sweep_from_pa_csv(PA_MAIN, tmp_path / "pa.csv", found)
    level2 = next(lv for lv in base.levels if lv.level == 2)
    assert level2.server is not None and level2.server.queue_us == 79
    mlp, pre = level2.server.composing
    assert (mlp.model, pre.model) == ("mlp", "preprocess")
    assert (pre.server.queue_us, pre.server.compute_infer_us, pre.server.overhead_us) == (346, 82, 72)
    slower = [(m, v, t.replace("2,931.473,0,73,447,4,383,", "2,931.473,0,73,447,4,459,")) for m, v, t in found]
    cand = sweep_from_pa_csv(PA_MAIN, tmp_path / "cand.csv", slower)
    notes = compare_sweeps(base, cand).notes
    assert "concurrency 2, composing model mlp v1: queue 447 -> 447 us (+0.0%), compute infer 383 -> 459 us " \
           "(+19.8%), overhead 73 -> 73 us (+0.0%)" in notes  # fmt: skip
    with pytest.raises(PerfkitError, match=r"mlp_v1\.pa\.csv.*composing model's CSV; give the ensemble's"):
        sweep_from_pa_csv(PA_MLP, tmp_path / "mlp_v1.pa.csv")
    with pytest.raises(PerfkitError, match=r"composing model mlp's CSV has the header"):
        sweep_from_pa_csv(PA_MAIN, "pa.csv", [("mlp", "1", "Concurrency,Inferences/Second\n1,2\n")])


def test_composing_models_in_the_json_tidy_csv_and_console() -> None:
    levels = pa_levels()
    sweep = dataclasses.replace(make_sweep(levels), model="mlp_pipeline")
    assert sweep_from_json(sweep_to_json(sweep)) == sweep
    rows = [line.split(",") for line in render_tidy_csv(sweep).splitlines()]
    header, body = rows[0], rows[1:]
    at = {name: header.index(name) for name in ("model", "level", "throughput_infer_per_s", "p50_ms",
                                                "server_queue_us", "network_server_us", "composing_of")}  # fmt: skip
    picked = [[row[i] for i in at.values()] for row in body]
    assert picked[:3] == [
        ["mlp_pipeline", "1", "945.152", "1.5959", "0", "346.7", ""],
        ["mlp", "1", "945.152", "", "202.9", "38.9", "mlp_pipeline"],
        ["preprocess", "1", "945.705044", "", "175.1", "26", "mlp_pipeline"],
    ]
    table = render_composing_table(levels)
    assert table[0].split() == ["level", "composing", "model", "version", "infer/s", "requests", "request", "us",
                                "queue", "us", "compute", "us", "avg", "batch"]  # fmt: skip
    assert table[2].split()[:5] == ["1", "mlp", "1", "945.2", "1709"]
    assert render_composing_table((make_level(latency=LatencyStats()),)) == []


class Configs:
    """A client's model_config over a fixed set of models; the calls are kept."""

    def __init__(self, configs: dict[str, dict[str, Any]]) -> None:
        self.configs = configs
        self.asked: list[tuple[str, str]] = []

    async def model_config(self, model: str, version: str = "") -> dict[str, Any]:
        self.asked.append((model, version))
        if model not in self.configs:
            raise RuntimeError(f"Request for unknown model: '{model}' is not found")
        return self.configs[model]


async def test_the_composing_map_of_a_bls_model_and_of_nested_ensembles() -> None:
    inner = {"name": "inner", "platform": "ensemble",
             "ensemble_scheduling": {"step": [{"model_name": "leaf", "model_version": -1}]}}  # fmt: skip
    client = Configs({"ens": ENSEMBLE_CONFIG, "inner": inner, "pre": {}, "leaf": {}, "helper": {}})
    # A BLS model names what it calls; an ensemble among them brings its own steps (perf_analyzer's
    # AddBLSComposingModels), and the measured model's own config is read as an ensemble's would be.
    found = await composing_models(client, "bls", {"backend": "python"}, [("helper", ""), ("ens", "1")])  # type: ignore[arg-type]
    assert found == {
        "bls": (("helper", ""), ("ens", "1")),
        "ens": (("pre", ""), ("inner", "2")),
        "inner": (("leaf", ""),),
    }
    assert await composing_models(client, "m", {"backend": "onnxruntime"}, []) == {}  # type: ignore[arg-type]
    with pytest.raises(PerfkitError, match=r"--bls-composing-models absent: the server does not give its config"):
        await composing_models(client, "bls", {}, [("absent", "")])  # type: ignore[arg-type]
    assert parse_model_list("a, b:2", "--bls-composing-models") == (("a", ""), ("b", "2"))
    assert parse_model_list("", "--bls-composing-models") == ()
    with pytest.raises(PerfkitError, match=r"--bls-composing-models takes MODEL\[:VERSION\]"):
        parse_model_list("a:latest", "--bls-composing-models")
