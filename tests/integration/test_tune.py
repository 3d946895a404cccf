"""`perfkit tune` end to end: on the bundled server (the demo MLP), against NVIDIA's tritonserver in
explicit mode (a python-backend sleeper, over gRPC), a variant the server refuses, a resumed
checkpoint, and the flag errors. Searches are kept small (a few variants, two or three concurrency
levels each, three 100 ms windows a level) so that each test takes well under a minute on two
cores: the verdicts they check are margins of several times (the best variant of the bundled MLP
serves about ten times the default's throughput), which short windows keep."""

from __future__ import annotations

import asyncio
import json
import shutil
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from perfkit.cli import main
from perfkit.results.writing import new_file_mode
from perfkit.testing import write_sleeper
from reference_server.config import ServerConfig
from reference_server.core.model_config import config_from_json, config_to_json, parse_config_text
from reference_server.server import running_server
from tests.servers import running_triton

# Each tune writes report.html: its figures are built but not rasterized (tests/conftest.py, quick_png).
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("quick_png")]

FAST = ["-p", "100", "-s", "50", "-r", "3", "--warmup-request-count", "10", "--quiet"]

# The demo MLP as a user might first configure it: a queue delay of 20 ms. At 4 or 8 clients a batch
# never fills up to 64, so every batch waits the whole 20 ms: any variant without it serves more
# (several times more: 4:8 is enough of a concurrency sweep to show it, two levels a variant).
SLOW_MLP = """\
name: "mlp"
backend: "onnxruntime"
max_batch_size: 64
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 256 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 10 ] } ]
dynamic_batching { max_queue_delay_microseconds: 20000 }
instance_group [ { count: 1 kind: KIND_CPU } ]
"""


def tune(*args: str) -> int:
    return main(["tune", *args])


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


def throughput(doc: dict[str, Any], key: str) -> float:
    variant = next(v for v in doc["variants"] if v["key"] == key)
    return float(variant["combined_figures"]["throughput"]["value"])


@pytest.fixture
def slow_mlp(repository_copy: Path) -> Path:
    config = repository_copy / "mlp" / "config.pbtxt"
    config.write_text(SLOW_MLP)
    return config


@pytest.mark.timeout(400)
def test_tune_on_the_bundled_server_beats_the_default_and_resumes(
    slow_mlp: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    args = [str(slow_mlp), "--max-instance-count", "2", "--min-batch-size", "4", "--max-batch-size", "8",
            "--batching-delays-us", "0", "--concurrency-range", "4:8", "--constraint", "p99_ms<=200", *FAST]  # fmt: skip
    assert tune(*args, "-o", str(out)) == 0
    printed = capsys.readouterr().out
    doc = read_json(out / "tune.json")
    default, best = doc["default"], doc["best"]
    assert default == "count=1 mbs=64 batching=20000us kind=cpu"
    assert len(doc["variants"]) == 9 and doc["measurements"]["measured_in_this_run"] == doc["measurements"]["levels"]
    assert best != default and "batching=20000us" not in best
    assert throughput(doc, best) > 1.5 * throughput(doc, default)
    summary = (out / "summary.txt").read_text()
    assert "more throughput than the default configuration" in summary and f"Best: {best}" in summary
    assert printed == ""  # --quiet: the summary is in the file
    report = (out / "report.html").read_text()
    assert "data:image/png;base64," in report and best in report
    # Three leaders re-measured, and more when one that was not re-measured overtook them.
    assert len(doc["leaders"]) >= 3 and best in doc["ties"], doc["leaders"]
    ranked = [r["key"] for r in doc["ranking"]]
    assert ranked[-1] == default or ranked.index(default) > ranked.index(best)
    # One CSV row per variant × level, re-measurements included.
    rows = (out / "results.csv").read_text().splitlines()
    assert rows[0].startswith("variant,is_default,instance_count,max_batch_size,dynamic_batching")
    assert "throughput_infer_per_s" in rows[0] and len(rows) - 1 == doc["measurements"]["levels"]
    assert summary.startswith("perfkit tune of model 'mlp'")
    # Every output is as readable as the umask lets a new file be (not mkstemp's 0600).
    modes = {p.relative_to(out): p.stat().st_mode & 0o777 for p in out.rglob("*") if p.is_file()}
    assert modes == dict.fromkeys(modes, new_file_mode()) and Path("best/config.pbtxt") in modes

    # best/config.pbtxt is a Triton config that round-trips and that our server loads.
    text = (out / "best" / "config.pbtxt").read_text()
    parsed = parse_config_text(text, out / "best" / "config.pbtxt")
    assert config_to_json(parsed) == config_to_json(config_from_json(json.dumps(doc["best_config"]), "best"))
    repo = tmp_path / "deploy"
    shutil.copytree(slow_mlp.parent, repo / "mlp")
    (repo / "mlp" / "config.pbtxt").write_text(text)
    with running_server(ServerConfig(model_repository=repo, http_port=0, grpc_port=0, metrics_port=0)) as server:
        with urllib.request.urlopen(f"http://{server.http_url}/v2/models/mlp/config", timeout=30) as response:
            served = json.loads(response.read())
    params = next(v for v in doc["variants"] if v["key"] == best)["params"]
    assert served["max_batch_size"] == params["max_batch_size"]
    assert served["instance_group"][0]["count"] == params["instance_count"]

    # An interrupted tune: drop the last three variants and the re-measurements from the
    # checkpoint; the resumed run measures only those, and takes the rest from the checkpoint.
    checkpoint = read_json(out / "checkpoint.json")
    dropped = list(checkpoint["variants"])[-3:]
    for key in dropped:
        del checkpoint["variants"][key]
    checkpoint["remeasures"] = {}
    (tmp_path / "resume.json").write_text(json.dumps(checkpoint))
    assert tune(*args, "--checkpoint", str(tmp_path / "resume.json"), "-o", str(tmp_path / "again")) == 0
    again = read_json(tmp_path / "again" / "tune.json")
    measured_now = {v["key"] for v in again["variants"] if v["measured_in_this_run"]}
    assert set(dropped) <= measured_now <= set(dropped) | set(again["leaders"])
    for v in again["variants"]:
        if v["key"] not in dropped:  # every level of the search came from the checkpoint
            assert v["measured_in_this_run"] == len(v["remeasures"])
    # The resumed run re-measured the leaders afresh: on a busy machine its verdict may differ, but
    # the two runs' ties must share a variant (tests/unit/test_objectives.py checks the stricter
    # "same best, or one's best in the other's tie" on a simulated noisy machine).
    assert set(again["ties"]) & set(doc["ties"]), (doc["ties"], again["ties"])
    assert again["best"] != default


def test_a_variant_the_server_refuses_is_recorded_and_the_search_goes_on(repository_copy: Path, tmp_path: Path) -> None:
    # Preferred batch size 4 is refused with max_batch_size 2 (it must be <= max_batch_size).
    out = tmp_path / "out"
    code = tune(str(repository_copy / "mlp" / "config.pbtxt"), "--max-instance-count", "1", "--min-batch-size", "2",
                "--max-batch-size", "4", "--preferred-batch-sizes", "4", "--concurrency-range", "2:2",
                "--remeasure", "0", "-o", str(out), *FAST)  # fmt: skip
    assert code == 0
    doc = read_json(out / "tune.json")
    status = {v["key"]: (v["status"], v["error"]) for v in doc["variants"]}
    assert status["count=1 mbs=2 batching=0us/pref4"][0] == "failed"
    assert "preferred_batch_size 4" in status["count=1 mbs=2 batching=0us/pref4"][1]
    assert {k for k, (s, _) in status.items() if s == "ok"} >= {
        "count=1 mbs=2 batching=off",
        "count=1 mbs=4 batching=0us/pref4",
    }
    assert [r["status"] for r in doc["ranking"]][-1] == "failed"
    assert doc["best"] is not None
    failed_rows = [row for row in (out / "results.csv").read_text().splitlines() if ",failed," in row]
    assert len(failed_rows) == 1 and "preferred_batch_size" in failed_rows[0]


def test_infeasible_variants_are_reported_and_nothing_is_recommended(
    repository_copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    code = tune(str(repository_copy / "mlp" / "config.pbtxt"), "--max-instance-count", "1", "--min-batch-size", "64",
                "--max-batch-size", "64", "--concurrency-range", "1:1", "--constraint", "throughput>=1e9", "-o", str(out),
                *FAST[:-1])  # fmt: skip
    assert code == 1
    assert "loosen --constraint" in capsys.readouterr().err
    assert "No variant met the constraints" in (out / "summary.txt").read_text()
    doc = read_json(out / "tune.json")
    assert len(doc["ranking"]) == 3 and {r["status"] for r in doc["ranking"]} == {"infeasible"}
    assert all(r["violations"][0].startswith("throughput ") for r in doc["ranking"])
    assert doc["best"] is None and not (out / "best").exists()


def test_a_server_not_in_explicit_mode_is_named(demo_server: Any, tmp_path: Path, demo_repository: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    code = tune(str(demo_repository / "mlp" / "config.pbtxt"), "-u", demo_server.http_url, "--max-instance-count",
                "1", "--min-batch-size", "64", "--max-batch-size", "64", "-o", str(tmp_path / "out"), *FAST)  # fmt: skip
    assert code == 1
    assert "--model-control-mode explicit" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--objective", "speed"], "--objective: unknown figure 'speed'"),
        (["--constraint", "p99<20"], "--constraint 'p99<20' must look like FIGURE<=BOUND"),
        (["--concurrency-range", "1:8:2"], "--concurrency-range takes START:END"),
        (["--concurrency-range", "8:1"], "--concurrency-range START:END needs 1 <= START <= END"),
        (["--max-instance-count", "0"], "--max-instance-count need 1 <= MIN <= MAX"),
        (["--max-batch-size", "0"], "--max-batch-size need 1 <= MIN <= MAX"),
        (["--batching-delays-us", "0,-5"], "--batching-delays-us takes a comma-separated list"),
        (["--preferred-batch-sizes", "half"], "--preferred-batch-sizes: 'half'"),
        (["--instance-kinds", "KIND_TPU"], "--instance-kinds: 'KIND_TPU'"),
        (["--top", "0"], "--top must be at least 1"),
        (["-r", "2"], "-r/--max-trials must be at least 3"),
        (["--metrics-url", "http://x/metrics"], "--metrics-url needs --collect-metrics"),
    ],
)
def test_flag_errors_name_the_flag(
    args: list[str], message: str, demo_repository: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert tune(str(demo_repository / "mlp" / "config.pbtxt"), *args) == 2
    assert message in capsys.readouterr().err


def test_config_errors_name_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert tune(str(tmp_path / "nowhere" / "config.pbtxt")) == 2
    assert "is not a file" in capsys.readouterr().err
    bad = tmp_path / "m" / "config.pbtxt"
    bad.parent.mkdir()
    bad.write_text('name: "m"\nmax_batch_size: oops\n')
    assert tune(str(bad)) == 2
    assert f"{bad}:2" in capsys.readouterr().err
    bad.write_text('name: "other"\n')
    assert tune(str(bad)) == 2
    assert "differs from its folder 'm'" in capsys.readouterr().err


@pytest.mark.peers
@pytest.mark.timeout(400)
def test_tune_against_triton_in_explicit_mode(peers: Path, tmp_path: Path) -> None:
    repo = tmp_path / "models"
    config = write_sleeper(repo, "sleeper", service_ms=10.0, max_batch_size=8) / "config.pbtxt"
    out = tmp_path / "out"
    with running_triton(
        peers, repo, extra_args=["--model-control-mode=explicit", "--load-model=sleeper"], auto_complete=False
    ) as triton:
        code = tune(str(config), "-u", triton.grpc_url, "-i", "grpc", "--shape", "INPUT0:16",
                    "--max-instance-count", "2", "--min-batch-size", "8", "--max-batch-size", "8",
                    "--batching-delays-us", "0", "--concurrency-range", "4:4", "--leaders", "2", "--remeasure", "1",
                    "-o", str(out), *FAST)  # fmt: skip
        with urllib.request.urlopen(f"http://{triton.http_url}/v2/models/sleeper/config", timeout=30) as response:
            after = json.loads(response.read())
    assert code == 0
    doc = read_json(out / "tune.json")
    # The default is the server's configuration (kinds as Triton completes them): one of the grid.
    assert doc["default"] == "count=1 mbs=8 batching=off kind=cpu"
    assert {v["key"] for v in doc["variants"]} == {
        f"count={n} mbs=8 batching={b} kind=cpu" for n in (1, 2) for b in ("off", "0us")
    }
    assert all(v["status"] == "ok" for v in doc["variants"])
    assert [r["status"] for r in doc["ranking"]] == ["feasible"] * 4
    # 10 ms per execution: the default serves 100/s however many clients wait, while one sleep
    # serves a whole batch (up to 400/s at 4 clients) or two instances sleep at once (200/s).
    assert doc["best"] != doc["default"]
    assert throughput(doc, doc["best"]) > 1.5 * throughput(doc, doc["default"])
    # The server is left serving the configuration it had before the tune.
    assert after["instance_group"][0]["count"] == 1 and "dynamic_batching" not in after


def test_leaders_that_fall_behind_bring_the_new_leader_to_re_measurement(tmp_path: Path) -> None:
    """No server: the tuner's loads and levels are stubbed. A and B lead the first pass, but their
    re-measurements fall to 1000 infer/s; C then leads without having been re-measured, so C and D
    are re-measured too, round-robin, before the ranking is final."""
    from perfkit.progress import Progress
    from perfkit.tune.space import Space, Variant
    from perfkit.tune.state import Checkpoint, Model, Record, TuneResult, TuneSpec
    from perfkit.tune.tuner import Tuner
    from tests.unit.test_objectives import level

    spec = TuneSpec(config_path=tmp_path / "config.pbtxt", leaders=2, remeasure_rounds=2)
    result = TuneResult(
        spec, Model("m", tmp_path, {}), Space((1, 2, 3, 4), (1,), (None,)), "count=1 mbs=1 batching=off"
    )
    first = {"A": 3000.0, "B": 2900.0, "C": 2800.0, "D": 2700.0}
    for n, (name, value) in enumerate(first.items(), 1):
        result.records[name] = Record(
            Variant(n, 1, None), {"name": name}, name == "A", "ok", levels=[level(value, 1000.0)], chosen=0
        )
    calls: list[str] = []

    class Stubbed(Tuner):
        async def _load(self, config: dict[str, Any]) -> str:
            calls.append(config["name"])
            return ""

        async def _level(self, concurrency: int, record: Record) -> Any:
            return level(1000.0 if record.config["name"] in "AB" else first[record.config["name"]], 1000.0)

    tuner = object.__new__(Stubbed)
    tuner.spec, tuner.progress, tuner.default_config, tuner.sink = spec, Progress(quiet=True), {}, lambda _: None
    tuner.checkpoint = Checkpoint(tmp_path / "checkpoint.json", {})
    asyncio.run(tuner._remeasure(result))
    assert calls == ["A", "B", "A", "B", "C", "D", "C", "D"]
    assert result.leaders == ["A", "B", "C", "D"]
    assert result.rank(final=True).leader == "C"
