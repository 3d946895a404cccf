"""`perfkit tune`'s request-rate search and bayesian search end to end, on the bundled server (the
demo MLP). Each tune is a few small variants with 100 ms windows: the verdicts checked are
margins of several times, which short windows keep."""

from __future__ import annotations

import csv
import json
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from perfkit.cli import main
from perfkit.target import open_target
from perfkit.testing import write_bls, write_sleeper
from tests.integration.test_tune import SLOW_MLP
from tests.servers import running_triton
from v2kit.demo import build_demo_repository

# Each tune writes report.html: its figures are built but not rasterized (tests/conftest.py, quick_png).
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("quick_png")]

# 100 ms windows: the margins checked are several times, and the slowest variant still completes
# 20 requests a window.
FAST = ["-p", "100", "-s", "50", "-r", "3", "--warmup-request-count", "5", "--quiet"]
# Where the default is feasible the tests check the leader (the highest score): on such short
# windows of a loaded machine, intervals can be wide enough to tie the default, and a tie is
# resolved toward the cheaper configuration, which is not what these tests are about.
NO_REMEASURE = ["--remeasure", "0", *FAST]


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """One bundled server in explicit mode for the module (each tune leaves it as it found it: its
    models unloaded), on a demo repository whose mlp waits 20 ms for a batch, plus `mlp200`, the
    same model waiting 200 ms, and `broken`, the mlp without its model file: it cannot load."""
    repository = build_demo_repository(tmp_path_factory.mktemp("tune_modes") / "models")
    (repository / "mlp" / "config.pbtxt").write_text(SLOW_MLP)
    shutil.copytree(repository / "mlp", repository / "mlp200")
    slower = SLOW_MLP.replace('"mlp"', '"mlp200"').replace("20000", "200000")
    (repository / "mlp200" / "config.pbtxt").write_text(slower)
    shutil.copytree(repository / "mlp", repository / "broken")
    (repository / "broken" / "config.pbtxt").write_text(SLOW_MLP.replace('"mlp"', '"broken"'))
    (repository / "broken" / "1" / "model.onnx").unlink()
    with open_target(None, "http", model_repository=repository, server_args=["--model-control-mode", "explicit"]) as t:
        yield t.url, repository


@pytest.fixture
def slow_mlp(server: tuple[str, Path]) -> Path:
    return server[1] / "mlp" / "config.pbtxt"


def tune(server: tuple[str, Path], *args: str) -> int:
    return main(["tune", "-u", server[0], *args])


def repository_call(url: str, path: str, body: dict[str, Any]) -> Any:
    data = json.dumps(body).encode()
    request = urllib.request.Request(f"http://{url}/v2/repository/{path}", data=data, method="POST")
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read() or b"null")


def ready_models(url: str) -> set[str]:
    return {m["name"] for m in repository_call(url, "index", {}) if m.get("state") == "READY"}


def test_a_model_that_cannot_load_stops_the_tune_at_once_with_the_servers_words(
    server: tuple[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, repository = server
    broken, mlp = str(repository / "broken" / "config.pbtxt"), str(repository / "mlp" / "config.pbtxt")
    for configs in ([broken], [mlp, broken]):  # one model, and a tune of several
        out = tmp_path / str(len(configs))
        assert tune(server, *configs, "--max-instance-count", "3", "--concurrency-range", "1:1", "-o", str(out),
                    *NO_REMEASURE) == 2  # fmt: skip
        err = capsys.readouterr().err
        assert "(the default variant, tried first), so no variant can be measured" in err
        assert err.count("model file not found") == 1, err  # the default's refusal only: no other variant tried
        assert "--constraint" not in err and not out.exists()  # nothing measured, nothing written
    assert ready_models(url) == set()  # the server left as the tune found it


@pytest.mark.timeout(200)
def test_request_rate_search_judges_latency_from_the_intended_send_time(
    server: tuple[str, Path], tmp_path: Path
) -> None:
    # A 200 ms queue delay holds a request 100 ms on the median at 50-100/s (a batch never fills to
    # 64): twice a 50 ms bound on p50 at every rate. Without the delay the MLP answers in ~1 ms. The
    # median, not p99, over 200 ms windows: on a loaded 2-core machine a stall of the sender of a
    # fifth of a second is the p99 of a short window, and the median of a 100 ms one.
    out = tmp_path / "out"
    code = tune(server, str(server[1] / "mlp200" / "config.pbtxt"), "--param",
                "dynamic_batching.max_queue_delay_microseconds=0,200000", "--request-rate-range", "50:100",
                "--constraint", "p50_ms<=50", "-o", str(out), *NO_REMEASURE, "-p", "200")  # fmt: skip
    assert code == 0
    doc = read_json(out / "tune.json")
    assert doc["settings"]["load_mode"] == "request_rate"
    variants = {v["key"]: v for v in doc["variants"]}
    fast = variants["dynamic_batching.max_queue_delay_microseconds=0"]
    assert doc["best"] == fast["key"] and doc["best"] != doc["default"]
    assert {lv["mode"] for v in variants.values() for lv in v["levels"]} == {"request_rate"}
    # The fast variant stands for the highest rate it sustained (completed 90 % of); a machine too
    # loaded to send even 50/s on time leaves it none, and then its best level stands for it.
    sustained = [lv["level"] for lv in fast["levels"] if lv["throughput_infer_per_s"] >= 0.9 * lv["level"]]
    assert fast["chosen_concurrency"] == max(sustained, default=fast["chosen_concurrency"])
    assert fast["levels"][0]["level"] == 50 and (50 in sustained or len(fast["levels"]) == 1)
    slow = variants[doc["default"]]
    level = slow["levels"][0]
    assert slow["figures"]["p50_ms"]["value"] == level["latency_from_intended"]["p50_us"] / 1000
    ranked = next(v for v in doc["ranking"] if v["key"] == doc["default"])
    assert ranked["status"] == "infeasible" and ranked["violations"][0].startswith("p50_ms ")
    assert "request rate" in (out / "summary.txt").read_text()


@pytest.mark.timeout(200)
def test_bayesian_search_spends_its_budget_and_beats_the_default(
    server: tuple[str, Path], slow_mlp: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    code = tune(server, str(slow_mlp), "--search", "bayesian", "--search-budget", "3", "--seed", "3",
                 "--param", "dynamic_batching.max_queue_delay_microseconds=0,5000,20000",
                 "--param", "instance_group[0].count=1,2", "--concurrency-range", "4:4", "-o", str(out),
                 *NO_REMEASURE)  # fmt: skip
    assert code == 0
    doc = read_json(out / "tune.json")
    assert doc["settings"]["search"] == "bayesian" and doc["settings"]["search_budget"] == 3
    assert len(doc["variants"]) == 3 and doc["variants"][0]["is_default"]  # of a grid of 6
    # Any variant with a shorter queue delay serves 4 clients several times faster than 20 ms batches.
    keys = [v["key"] for v in doc["variants"]]
    assert any("=20000" not in key for key in keys[1:])
    assert doc["leader"] != doc["default"] and "=20000" not in doc["leader"]


SMALL_GRID = ["--max-instance-count", "1", "--min-batch-size", "64", "--max-batch-size", "64",
              "--concurrency-range", "4:4", *FAST]  # fmt: skip


def throughput_of(doc: dict[str, Any], key: str, name: str = "mlp") -> float:
    combination = next(c for c in doc["combinations"] if c["key"] == key)
    return float(combination["combined_figures"][f"{name}/throughput" if name == "mlp" else "throughput"]["value"])


@pytest.mark.timeout(200)
def test_two_models_are_measured_together_and_ranked_with_weights(
    server: tuple[str, Path], slow_mlp: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    preprocess = slow_mlp.parent.parent / "preprocess" / "config.pbtxt"
    # The server already serves preprocess, with 2 instances: that is its default, and what it serves after.
    served = {"name": "preprocess", "backend": "onnxruntime", "max_batch_size": 64,
              "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [256]}],
              "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [256]}],
              "instance_group": [{"count": 2, "kind": "KIND_CPU"}]}  # fmt: skip
    repository_call(server[0], "models/preprocess/load", {"parameters": {"config": json.dumps(served)}})
    code = tune(server, str(slow_mlp), str(preprocess), "--weights", "mlp:3", "--batching-delays-us", "0",
                "--leaders", "2", "--remeasure", "1", "-o", str(out), *SMALL_GRID)  # fmt: skip
    assert code == 0
    doc = read_json(out / "tune.json")
    assert doc["mode"] == "concurrent" and doc["weights"] == {"mlp": 0.75, "preprocess": 0.25}
    assert doc["settings"]["objective"] == {"mlp/throughput": 0.75, "preprocess/throughput": 0.25}
    assert len(doc["combinations"]) == 2 * 2 + 1  # (off, 0 µs) for each, and the defaults (100 µs off the grid)
    for combination in doc["combinations"]:  # every level has both models, each under its own load
        assert all(set(levels) == {"mlp", "preprocess"} for levels in combination["levels"])
        assert all(lv["ok_count"] > 0 for levels in combination["levels"] for lv in levels.values())
    # The two leaders were measured again, and the verdict is on their merged figures.
    assert len(doc["leaders"]) >= 2 and doc["leader"] in doc["leaders"]
    leaders = [c for c in doc["combinations"] if c["key"] in doc["leaders"]]
    assert all(len(c["remeasures"]) == 1 and c["combined_figures"] for c in leaders)
    # The default mlp waits 20 ms for each batch of four; either grid value serves it several times faster.
    assert "20000us" not in doc["leader"].split(" | ")[0]
    assert throughput_of(doc, doc["leader"]) > 1.5 * throughput_of(doc, doc["default"])
    assert all((out / "best" / name / "config.pbtxt").is_file() for name in ("mlp", "preprocess"))
    assert doc["default"].endswith("| preprocess: count=2 mbs=64 batching=off kind=cpu")
    assert ready_models(server[0]) == {"preprocess"}
    with urllib.request.urlopen(f"http://{server[0]}/v2/models/preprocess/config", timeout=30) as response:
        after = json.loads(response.read())
    assert after["instance_group"][0]["count"] == 2 and "dynamic_batching" not in after
    # results.csv: one row per combination × model × level (search and re-measurement); report.html
    # with a table and plots per model; `perfkit report` reads the tune.json.
    with (out / "results.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    levels = sum(len(c["levels"]) + len(c["remeasures"]) for c in doc["combinations"])
    assert len(rows) == 2 * levels and {r["model"] for r in rows} == {"mlp", "preprocess"}
    assert {r["phase"] for r in rows} == {"search", "remeasure"} and all(
        float(r["throughput_infer_per_s"]) > 0 for r in rows
    )
    page = (out / "report.html").read_text()
    assert "<h3>mlp, best first</h3>" in page and "<h3>preprocess, best first</h3>" in page and page.count("<img") >= 6
    assert main(["report", str(out / "tune.json"), "-o", str(tmp_path / "again.html")]) == 0
    # Resumed from its checkpoint, the tune measures nothing again and reaches the same verdict.
    again = tmp_path / "again"
    code = tune(server, str(slow_mlp), str(preprocess), "--weights", "mlp:3", "--batching-delays-us", "0",
                "--leaders", "2", "--remeasure", "1", "-o", str(again), "--checkpoint", str(out / "checkpoint.json"),
                *SMALL_GRID)  # fmt: skip
    resumed = read_json(again / "tune.json")
    assert code == 0 and resumed["measurements"]["measured_in_this_run"] == 0
    assert resumed["leader"] == doc["leader"] and resumed["measurements"]["levels"] == levels
    repository_call(server[0], "models/preprocess/unload", {})


@pytest.mark.timeout(200)
def test_an_ensemble_is_measured_while_its_composing_models_are_searched(
    server: tuple[str, Path], slow_mlp: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    ensemble = slow_mlp.parent.parent / "mlp_pipeline" / "config.pbtxt"
    grid = ["--max-instance-count", "1", "--min-batch-size", "1",
            "--max-batch-size", "64", "--batching-delays-us", "0", "--concurrency-range", "4:4", *FAST]  # fmt: skip
    assert tune(server, str(ensemble), "--search", "quick", "--remeasure", "0", "-o", str(out), *grid) == 0
    doc = read_json(out / "tune.json")
    assert doc["mode"] == "ensemble" and doc["models"] == ["preprocess", "mlp"] and doc["endpoint"] == "mlp_pipeline"
    # Only the ensemble takes load; its steps are searched at batch size 64 alone (the ensemble's).
    assert all(set(levels) == {"mlp_pipeline"} for c in doc["combinations"] for levels in c["levels"])
    assert all("mbs=64" in v for c in doc["combinations"] for v in c["variants"].values())
    assert doc["default"].endswith("mlp: count=1 mbs=64 batching=20000us kind=cpu")
    assert "20000us" not in doc["leader"]
    assert throughput_of(doc, doc["leader"], "mlp_pipeline") > 1.5 * throughput_of(doc, doc["default"], "mlp_pipeline")
    assert ready_models(server[0]) == set()  # the server is left as the tune found it


@pytest.mark.timeout(200)
def test_a_bls_model_is_measured_while_its_composing_models_are_searched(
    server: tuple[str, Path], slow_mlp: Path, tmp_path: Path
) -> None:
    # The BLS model sends each request on to the mlp, which waits 20 ms for a batch.
    bls = write_bls(server[1], "bls", ["mlp"], max_batch_size=64)
    out = tmp_path / "out"
    code = tune(server, str(bls / "config.pbtxt"), "--composing-models", "mlp", "--search", "quick",
                "--remeasure", "0", "--shape", "INPUT0:256", "-o", str(out), *SMALL_GRID)  # fmt: skip
    assert code == 0
    doc = read_json(out / "tune.json")
    assert doc["mode"] == "bls" and doc["models"] == ["mlp", "bls"] and doc["endpoint"] == "bls"
    # Only the BLS model takes load; the composing models' configs (and its own) are what vary.
    assert all(set(levels) == {"bls"} for c in doc["combinations"] for levels in c["levels"])
    assert len({c["variants"]["mlp"] for c in doc["combinations"]}) >= 2
    assert doc["default"].startswith("mlp: count=1 mbs=64 batching=20000us kind=cpu | bls: ")
    assert "20000us" not in doc["leader"]
    assert throughput_of(doc, doc["leader"], "bls") > 1.5 * throughput_of(doc, doc["default"], "bls")
    assert ready_models(server[0]) == set()


SLEEPER_PIPELINE = """\
name: "pipeline"
platform: "ensemble"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
ensemble_scheduling { step [
  { model_name: "first" model_version: -1 input_map { key: "INPUT0" value: "INPUT0" }
    output_map { key: "OUTPUT0" value: "middle" } },
  { model_name: "second" model_version: -1 input_map { key: "INPUT0" value: "middle" }
    output_map { key: "OUTPUT0" value: "OUTPUT0" } }
] }
"""


@pytest.mark.peers
@pytest.mark.timeout(300)
def test_an_ensemble_of_sleepers_on_triton_needs_both_steps_batched(peers: Path, tmp_path: Path) -> None:
    # Each step sleeps 10 ms an execution: 100 requests/s each without a batcher, up to 800/s with
    # one. The pipeline is as fast as its slower step, so only both batched pay: a combination
    # the search must find across the two models' grids.
    repo = tmp_path / "models"
    write_sleeper(repo, "first", service_ms=10.0)
    write_sleeper(repo, "second", service_ms=10.0)
    (repo / "pipeline" / "1").mkdir(parents=True)
    (repo / "pipeline" / "config.pbtxt").write_text(SLEEPER_PIPELINE)
    out = tmp_path / "out"
    with running_triton(peers, repo, extra_args=["--model-control-mode=explicit"], auto_complete=False) as triton:
        code = main(["tune", str(repo / "pipeline" / "config.pbtxt"), "-u", triton.grpc_url, "-i", "grpc",
                     "--shape", "INPUT0:16", "--max-instance-count", "1", "--min-batch-size", "8",
                     "--max-batch-size", "8", "--batching-delays-us", "0", "--concurrency-range", "8:8",
                     "--remeasure", "0", "-o", str(out), *FAST])  # fmt: skip
    assert code == 0
    doc = read_json(out / "tune.json")
    assert doc["endpoint"] == "pipeline" and len(doc["combinations"]) == 4
    assert all(c["status"] == "ok" for c in doc["combinations"])
    assert doc["leader"] == "first: count=1 mbs=8 batching=0us kind=cpu | second: count=1 mbs=8 batching=0us kind=cpu"
    one_batched = next(c for c in doc["combinations"] if c["key"].count("batching=0us") == 1)
    assert throughput_of(doc, doc["leader"], "pipeline") > 2 * one_batched["figures"]["throughput"]["value"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--request-rate-range", "10:5"], "--request-rate-range START:END needs whole requests per second"),
        (["--request-rate-range", "1.5:8"], "--request-rate-range takes START:END, whole numbers"),
        (["--request-rate-range", "10:50", "--concurrency-range", "1:4"], "are exclusive"),
        (["--request-distribution", "poisson"], "--request-distribution applies with --request-rate-range"),
        (["--search-budget", "10"], "--search-budget applies to --search bayesian"),
        (["--search", "bayesian", "--search-budget", "1"], "--search-budget 1 measures only the default"),
        (["--weights", "mlp:2"], "--weights weighs several models"),
        (["--composing-models", "nowhere"], "composing model 'nowhere' of 'mlp'"),
    ],
)
def test_flag_errors_name_the_flag(
    args: list[str], message: str, demo_repository: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["tune", str(demo_repository / "mlp" / "config.pbtxt"), *args]) == 2
    assert message in capsys.readouterr().err
