"""`perfkit tune --workers`: variants spread over Ray actors, one per server endpoint.

Against two reference-server subprocesses in explicit mode on a local Ray runtime: both endpoints
measure, and the result is what the ranking rules make of the records. Then an endpoint that is
down at the start, and (without Ray or servers, on scripted workers) an endpoint that fails in the
middle of the search. The grids are tiny (4 variants, concurrency 1:2, 100 ms windows)."""

from __future__ import annotations

import asyncio
import socket
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from perfkit.cli import build_parser
from perfkit.cli.tune import spec_from_args
from perfkit.errors import ExitCode, PerfkitError, TargetError
from perfkit.progress import Progress
from perfkit.results.model import LevelResult
from perfkit.target import ServerProcess, reference_server_process
from perfkit.tune.distributed import EndpointState, RayTuner, open_tuner
from perfkit.tune.objectives import best_level, figures_of, rank
from perfkit.tune.search import brute_batches
from perfkit.tune.space import SpaceSpec, build_space, variant_of
from perfkit.tune.state import DefaultRefused, Model, Record, TuneResult, TuneSpec
from perfkit.tune.tuner import run_tune, sweep_variant
from tests.ray_runtime import local_ray
from tests.unit.test_objectives import level

pytestmark = pytest.mark.integration

ray = pytest.importorskip("ray")

# 100 ms windows: the tests check where variants ran and that the ranking follows its rules from
# the records, not how fast any variant is.
FAST = ["-p", "100", "-s", "50", "-r", "3", "--warmup-request-count", "5", "--quiet"]
# The demo identity model: max_batch_size 8, no dynamic batching. 2 instance counts × batching
# off/on at max_batch_size 8: four variants, the default (1 instance, batching off) among them.
GRID = ["--max-instance-count", "2", "--min-batch-size", "8", "--max-batch-size", "8", "--concurrency-range", "1:2",
        "--shape", "INPUT0:16"]  # fmt: skip


@pytest.fixture(scope="module")
def ray_runtime() -> Iterator[None]:
    with local_ray(include_dashboard=False, num_cpus=2, object_store_memory=80 * 1024**2, log_to_driver=False):
        yield


@pytest.fixture(scope="module")
def servers(demo_repository: Path) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    explicit = ["--model-control-mode", "explicit"]
    with (
        reference_server_process(demo_repository, explicit) as a,
        reference_server_process(demo_repository, explicit) as b,
    ):
        yield a, b


def tune_spec(config: Path, *flags: str) -> TuneSpec:
    return spec_from_args(build_parser().parse_args(["tune", str(config), *GRID, *FAST, *flags]))


def grid_order(result: TuneResult) -> list[str]:
    """The variants a sequential brute search measures, in its order."""
    return [v.key for v in next(brute_batches(result.space, variant_of(result.model.base)))]


def assert_ranked_by_the_rules(result: TuneResult) -> None:
    spec = result.spec
    for record in result.records.values():
        if record.status == "ok":
            assert record.chosen == best_level([figures_of(lv) for lv in record.levels], spec.objective, ())
    remeasured = result.leaders if any(result.records[k].remeasures for k in result.leaders) else None
    candidates = [(k, r.variant.cost, r.combined()) for k, r in result.records.items()]
    assert result.ranking == rank(candidates, spec.objective, spec.constraints, remeasured)


def model_ready(server: ServerProcess, model: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{server.http_url}/v2/models/{model}/ready", timeout=10) as response:
            return bool(response.status == 200)
    except urllib.error.HTTPError:
        return False


@pytest.mark.timeout(120)
def test_variants_are_spread_over_both_endpoints(
    ray_runtime: None, servers: tuple[ServerProcess, ServerProcess], demo_repository: Path, tmp_path: Path
) -> None:
    a, b = servers
    spec = tune_spec(demo_repository / "identity" / "config.pbtxt", "-u", f"{a.http_url},{b.http_url}",
                     "--leaders", "2", "--remeasure", "1")  # fmt: skip
    assert spec.workers == 2 and spec.endpoints == (a.http_url, b.http_url)
    result, code = run_tune(spec, lambda _: None, tmp_path / "checkpoint.json", open_tuner)
    assert code == ExitCode.OK and result is not None and result.completed
    assert list(result.records) == grid_order(result) and len(result.records) == 4
    assert all(r.status == "ok" for r in result.records.values()), [r.error for r in result.records.values()]
    assert {r.endpoint for r in result.records.values()} == {a.http_url, b.http_url}
    assert len(result.leaders) >= 2 and all(len(result.records[k].remeasures) == 1 for k in result.leaders)
    assert_ranked_by_the_rules(result)
    assert result.best is not None and not result.lost_endpoints
    # Neither server had the model loaded before the tune; each actor unloaded it again.
    assert not model_ready(a, "identity") and not model_ready(b, "identity")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.timeout(120)
def test_an_endpoint_that_is_down_is_reported_and_the_others_measure(
    ray_runtime: None, servers: tuple[ServerProcess, ServerProcess], demo_repository: Path, tmp_path: Path
) -> None:
    live, down = servers[0].http_url, f"127.0.0.1:{free_port()}"
    spec = tune_spec(demo_repository / "identity" / "config.pbtxt", "-u", live, "-u", down, "--workers", "2",
                     "--remeasure", "0")  # fmt: skip
    result, code = run_tune(spec, lambda _: None, tmp_path / "checkpoint.json", open_tuner)
    assert code == ExitCode.OK and result is not None and result.completed
    assert [why.split(": ", 1)[0] for why in result.lost_endpoints] == [down]
    assert {r.endpoint for r in result.records.values()} == {live}
    assert list(result.records) == grid_order(result)
    assert_ranked_by_the_rules(result)


# --- scripted workers: an endpoint that fails in the middle ---------------------------------------


class ScriptedWorker:
    """A worker whose server serves `1000 × instance count` infer/s, and fails at call `fail_at`;
    with `refusal`, a server that refuses every load with it."""

    def __init__(self, url: str, spec: TuneSpec, fail_at: int | None = None, refusal: str = "") -> None:
        self.url, self.spec, self.fail_at, self.refusal = url, spec, fail_at, refusal
        self.calls = 0
        self.closed: tuple[bool, Any] | None = None

    async def open(self) -> EndpointState:
        return EndpointState(None, {"name": self.url})

    async def _level(self, concurrency: int, record: Record) -> LevelResult:
        await asyncio.sleep(0)  # lets the other worker's variant interleave
        return level(1000.0 * record.variant.instance_count, 1000.0)

    async def measure_variant(self, record: Record, cached: dict[int, LevelResult]) -> Record:
        self.calls += 1
        if self.calls == self.fail_at:
            raise TargetError("the server stopped answering")
        record.endpoint = self.url

        async def load(config: dict[str, Any]) -> str:
            return self.refusal

        await sweep_variant(record, cached, self.spec, load, self._level, on_level=lambda: None)
        return record

    async def measure_level(self, config: dict[str, Any], concurrency: int, record: Record) -> LevelResult | None:
        return await self._level(concurrency, record)

    async def close(self, restore: bool, config: dict[str, Any] | None) -> None:
        self.closed = (restore, config)


def test_an_endpoint_failing_mid_search_fails_its_variant_and_the_search_goes_on(tmp_path: Path) -> None:
    spec = TuneSpec(config_path=tmp_path / "config.pbtxt", concurrency=(1, 1), space=SpaceSpec(1, 3, 8, 8),
                    remeasure_rounds=1, leaders=2, endpoints=("a:1", "b:1"), workers=2)  # fmt: skip
    model = Model("m", tmp_path, {"max_batch_size": 8, "instance_group": [{"count": 1}]})
    good, bad = ScriptedWorker("a:1", spec), ScriptedWorker("b:1", spec, fail_at=2)
    tuner = RayTuner(spec, model, [good, bad], Progress(quiet=True), lambda _: None)
    result = asyncio.run(tuner.run(tmp_path / "checkpoint.json"))
    assert result.completed and result.space == build_space(spec.space, variant_of(model.base))
    assert list(result.records) == grid_order(result) and len(result.records) == 6
    failed = [r for r in result.records.values() if r.status == "failed"]
    assert len(failed) == 1 and failed[0].error == "endpoint b:1 failed: the server stopped answering"
    assert [why for why in result.lost_endpoints] == ["b:1: the server stopped answering"]
    assert {r.endpoint for r in result.records.values() if r.status == "ok"} == {"a:1", "b:1"}
    assert bad.calls == 2  # nothing more went to the failed endpoint
    assert_ranked_by_the_rules(result)
    assert result.best is not None and result.best.variant.instance_count == 3
    assert good.closed == (True, None) and bad.closed == (True, None)  # the model was not loaded before


def test_a_default_the_servers_refuse_stops_the_tune_at_once(tmp_path: Path) -> None:
    spec = TuneSpec(config_path=tmp_path / "config.pbtxt", concurrency=(1, 1), space=SpaceSpec(1, 3, 8, 8),
                    endpoints=("a:1", "b:1"), workers=2)  # fmt: skip
    model = Model("m", tmp_path, {"max_batch_size": 8, "instance_group": [{"count": 1}]})
    workers = [ScriptedWorker(url, spec, refusal="model.onnx: model file not found") for url in ("a:1", "b:1")]
    saved: list[TuneResult] = []
    tuner = RayTuner(spec, model, workers, Progress(quiet=True), saved.append)
    with pytest.raises(DefaultRefused, match="cannot load model 'm' with its own configuration.*model file not found"):
        asyncio.run(tuner.run(tmp_path / "checkpoint.json"))
    assert not saved and not (tmp_path / "checkpoint.json").exists()  # nothing measured, nothing written
    assert sum(w.calls for w in workers) <= 2 and all(w.closed == (True, None) for w in workers)


@pytest.mark.parametrize("seed", range(8))
def test_quick_batches_are_the_quick_sequence_in_neighbourhoods(seed: int) -> None:
    from perfkit.tune.search import quick_batches, quick_search
    from tests.unit.test_search import THROUGHPUT, run, separable

    space, land = separable(seed)
    default = space.variant(tuple(n // 2 for n in space.shape))
    batches, flat = [], []
    policy = quick_batches(space, default, THROUGHPUT)
    try:
        batch = next(policy)
        while True:
            batches.append([v.key for v in batch])
            flat += batches[-1]
            batch = policy.send([land(v) for v in batch])
    except StopIteration:
        pass
    assert flat == list(run(quick_search(space, default, THROUGHPUT), land))
    assert len(flat) == len(set(flat)) and max(map(len, batches)) > 1


def test_worker_flags_are_checked(demo_repository: Path) -> None:
    config = demo_repository / "identity" / "config.pbtxt"
    with pytest.raises(PerfkitError, match="--workers 3 runs one Ray actor per endpoint"):
        tune_spec(config, "-u", "h:1,h:2", "--workers", "3")
    with pytest.raises(PerfkitError, match="--workers needs -u endpoints"):
        tune_spec(config, "--workers", "2")
    with pytest.raises(PerfkitError, match="--ray-address applies with --workers"):
        tune_spec(config, "-u", "h:1", "--ray-address", "auto")
    with pytest.raises(PerfkitError, match="several -u endpoints are measured by Ray actors"):
        tune_spec(config, "-u", "h:1,h:2", "--workers", "0")
    with pytest.raises(PerfkitError, match="same endpoint twice"):
        tune_spec(config, "-u", "h:1", "-u", "h:1")


def test_without_ray_the_error_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from perfkit.load.cluster.runtime import import_ray

    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` meets when Ray is not installed
    with pytest.raises(PerfkitError, match=r"pip install 'perfkit\[distributed\]'"):
        import_ray()
