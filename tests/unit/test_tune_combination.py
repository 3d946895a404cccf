"""perfkit.tune.multi.study: the combined grid of several models, weights, combined figures, the
searches over combinations (a synthetic server where models share cores), and the study's checks;
no server, no clock."""

from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import pytest

from perfkit.cli import main
from perfkit.errors import PerfkitError
from perfkit.report.tune_tables import render_combination_csv, render_combination_json
from perfkit.results.files import TuneView, load_result
from perfkit.tune.bayesian import bayesian_search
from perfkit.tune.multi.checkpoint import CombinationCheckpoint, fingerprint
from perfkit.tune.multi.study import (
    Combination,
    CombinationRecord,
    CombinedSpace,
    Study,
    combined_figures,
    combined_objective,
    level_figures,
    new_result,
    parse_weights,
    read_study,
)
from perfkit.tune.objectives import Estimate, Figures, Objective, merit, parse_constraint, parse_objective
from perfkit.tune.search import brute_search, quick_search
from perfkit.tune.space import Space, SpaceSpec, Variant
from perfkit.tune.state import Model, TuneSpec
from tests.synthetic import make_level
from tests.unit.test_search import figures, run
from v2kit.demo import build_demo_repository


def two_model_space() -> CombinedSpace:
    a = Space((1, 2, 3), (1, 8), (None,))
    b = Space((1, 2, 3), (0,), (None,))
    return CombinedSpace((("a", a), ("b", b)))


def test_the_combined_grid_is_the_product_of_the_models_grids() -> None:
    space = two_model_space()
    assert space.shape == (3, 2, 1, 1, 3, 1, 1, 1) and space.size == 18
    combination = space.variant((2, 1, 0, 0, 0, 0, 0, 0))
    assert combination.key == "a: count=3 mbs=8 batching=off | b: count=1 mbs=0 batching=off"
    assert space.nearest(combination) == (2, 1, 0, 0, 0, 0, 0, 0)
    assert len({space.variant(c).key for c in space.coordinates()}) == 18
    # One member's knob moves at a time along an axis.
    assert len(space.neighbours((1, 0, 0, 0, 1, 0, 0, 0))) == 5
    assert combination.cost[0] == 4.0  # instances summed over the models


def test_weights_fold_into_one_objective_over_model_figures() -> None:
    study = Study((Model("a", Path("a"), {}), Model("b", Path("b"), {})), None, parse_weights("a:3", ["a", "b"]))
    assert study.weights == (("a", 0.75), ("b", 0.25))
    objective, constraints = combined_objective(study, parse_objective("throughput:1,p99_ms:1"), [
        parse_constraint("p99_ms<=20")])  # fmt: skip
    assert dict(objective.weights) == {
        "a/throughput": 0.375, "a/p99_ms": 0.375, "b/throughput": 0.125, "b/p99_ms": 0.125,
    }  # fmt: skip
    assert [str(c) for c in constraints] == ["a/p99_ms<=20", "b/p99_ms<=20"]
    assert all(c.tightens_with_load for c in constraints)
    figs = combined_figures({"a": figures(100.0, 10.0), "b": figures(300.0, 30.0)})
    assert figs is not None and figs["throughput"] == Estimate.exact(400.0)
    assert not constraints[1].holds(figs) and constraints[0].holds(figs)
    # The score is Σ w_model · w_figure · ±ln(figure): model_analyzer's weighted comparison in logs.
    expected = 0.375 * (math.log(100) - math.log(10)) + 0.125 * (math.log(300) - math.log(30))
    assert objective.score(figs).value == pytest.approx(expected)
    assert combined_figures({"a": figures(100.0), "b": None}) is None


def shared_cores(cores: int = 4) -> object:
    """Two models on one machine of `cores` cores: each instance gets a core while there are
    enough, then they all share; model a batches (8 gives ×3), model b does not."""

    def land(c: Combination) -> Figures:
        (_, a), (_, b) = c.variants
        total = a.instance_count + b.instance_count
        share = min(1.0, cores / total)
        tp_a = 100.0 * a.instance_count * share * (3.0 if a.max_batch_size == 8 else 1.0)
        tp_b = 100.0 * b.instance_count * share
        out = combined_figures({"a": figures(tp_a), "b": figures(tp_b)})
        assert out is not None
        return out

    return land


@pytest.mark.parametrize("weights", ["a:1", "b:9"])
def test_quick_and_bayesian_find_brute_s_combination_and_weights_move_it(weights: str) -> None:
    space = two_model_space()
    study = Study(
        (Model("a", Path("a"), {}), Model("b", Path("b"), {})), None, parse_weights(weights, ["a", "b"])
    )  # fmt: skip
    objective, _ = combined_objective(study, Objective(), ())
    land = shared_cores()
    default = space.variant((0,) * 8)
    brute = run(brute_search(space, default), land)  # type: ignore[arg-type]
    top = max(brute, key=lambda k: merit(brute[k], objective, ()))
    quick = run(quick_search(space, default, objective), land)  # type: ignore[arg-type]
    bayes = run(bayesian_search(space, default, objective, budget=10, seed=0), land)  # type: ignore[arg-type]
    for found in (quick, bayes):
        best = max(found, key=lambda k: merit(found[k], objective, ()))
        assert objective.score(found[best] or {}).value == pytest.approx(objective.score(brute[top] or {}).value)
    # Log scores reward balance: with equal weights the four cores are split two and two (a's
    # batches make its share worth more, yet 600·200 beats 900·100); weighting b nine to one
    # gives b three of them.
    expected = {
        "a:1": "a: count=2 mbs=8 batching=off | b: count=2",
        "b:9": "a: count=1 mbs=8 batching=off | b: count=3",
    }
    assert top.startswith(expected[weights])
    assert len(quick) < len(brute)


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_demo_repository(tmp_path_factory.mktemp("demo") / "models")


def test_an_ensemble_s_study_is_its_steps_and_a_bls_model_joins_its_models(repository: Path) -> None:
    ensemble = read_study([repository / "mlp_pipeline" / "config.pbtxt"])
    assert ensemble is not None and ensemble.mode == "ensemble"
    assert [m.name for m in ensemble.members] == ["preprocess", "mlp"]
    assert [m.name for m in ensemble.measured] == ["mlp_pipeline"]
    bls = read_study([repository / "python_linear" / "config.pbtxt"], composing=["mlp"])
    assert bls is not None and bls.mode == "bls" and [m.name for m in bls.members] == ["mlp", "python_linear"]
    assert read_study([repository / "mlp" / "config.pbtxt"]) is None  # a plain one-model tune
    # The ensemble batches up to 64: its steps are searched from 64 up, never below.
    spec = TuneSpec(config_path=repository / "mlp_pipeline" / "config.pbtxt", space=SpaceSpec(max_instances=1))
    result = new_result(spec, ensemble)
    assert {v.max_batch_size for c in result.space.coordinates() for _, v in result.space.variant(c).variants} == {
        64, 128,
    }  # fmt: skip
    with pytest.raises(PerfkitError, match="--max-batch-size 32 is below ensemble 'mlp_pipeline''s"):
        new_result(TuneSpec(config_path=spec.config_path, space=SpaceSpec(max_batch=32)), ensemble)


@pytest.mark.parametrize(
    ("configs", "kwargs", "message"),
    [
        (["mlp", "mlp"], {}, "named twice"),
        (["mlp", "mlp_pipeline"], {}, "tune an ensemble or a BLS model"),
        (["mlp", "preprocess"], {"weights": "convnet:2"}, "give MODEL:WEIGHT for a model being tuned"),
        (["mlp", "preprocess"], {"weights": "mlp:0"}, "the weight must be a positive number"),
        (["mlp", "preprocess"], {"weights": "mlp"}, "give MODEL:WEIGHT"),
        (["mlp"], {"weights": "mlp:2"}, "--weights weighs several models"),
        (["mlp_pipeline"], {"composing": ["mlp"]}, "an ensemble's are read from its steps"),
        (["python_linear"], {"composing": ["nowhere"]}, "composing model 'nowhere'"),
    ],
)
def test_study_errors_name_the_fix(
    repository: Path, configs: list[str], kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(PerfkitError, match=message):
        read_study([repository / name / "config.pbtxt" for name in configs], **kwargs)  # type: ignore[arg-type]


def test_models_of_different_repositories_are_refused(repository: Path, tmp_path: Path) -> None:
    other = build_demo_repository(tmp_path / "other")
    with pytest.raises(PerfkitError, match="must be in one model repository"):
        read_study([repository / "mlp" / "config.pbtxt", other / "preprocess" / "config.pbtxt"])


def test_a_combination_applies_each_model_s_variant(repository: Path) -> None:
    study = read_study([repository / "mlp" / "config.pbtxt", repository / "preprocess" / "config.pbtxt"])
    assert study is not None
    combination = Combination((("mlp", Variant(2, 8, None)), ("preprocess", Variant(1, 64, None))))
    configs = combination.configs(study)
    assert configs["mlp"]["instance_group"][0]["count"] == 2 and configs["mlp"]["max_batch_size"] == 8
    assert "dynamic_batching" not in configs["preprocess"]


def test_a_combination_checkpoint_gives_back_its_levels_and_refuses_another_tune(
    repository: Path, tmp_path: Path
) -> None:
    study = read_study([repository / "mlp" / "config.pbtxt", repository / "preprocess" / "config.pbtxt"])
    assert study is not None
    spec = TuneSpec(config_path=repository / "mlp" / "config.pbtxt", space=SpaceSpec(max_instances=1, max_batch=1))
    result = new_result(spec, study)
    combination = result.space.variant(result.space.coordinates()[0])
    record = result.records[combination.key] = CombinationRecord(combination, combination.configs(study), False)
    for concurrency in (1, 2):
        record.levels.append(
            {"mlp": make_level(concurrency, [100.0] * 3), "preprocess": make_level(concurrency, [50.0] * 3)}
        )
    record.remeasure_levels.append(record.levels[1])
    path = tmp_path / "checkpoint.json"
    CombinationCheckpoint(path, fingerprint(spec, study, "embedded")).save(result, {"mlp": None})
    again = CombinationCheckpoint(path, fingerprint(spec, study, "embedded"))
    assert sorted(again.levels[combination.key]) == [1, 2] and again.served == {"mlp": None}
    assert again.levels[combination.key][2]["preprocess"].throughput_infer_per_s == 50.0
    assert list(again.remeasures[combination.key][0]) == ["mlp", "preprocess"]
    # Its CSV: a row per combination × model × level, the re-measurement last.
    rows = list(csv.DictReader(io.StringIO(render_combination_csv(result))))
    assert [(r["model"], r["phase"]) for r in rows] == [("mlp", "search")] * 2 + [("mlp", "remeasure")] + [
        ("preprocess", "search")] * 2 + [("preprocess", "remeasure")]  # fmt: skip
    # Its tune.json, as `perfkit report` reads it: the combinations, then each model's own figures.
    record.figures = [level_figures(study, levels) for levels in record.levels]
    record.chosen, record.status = 1, "ok"
    result.ranking = result.rank()
    (tmp_path / "tune.json").write_text(render_combination_json(result, ["tune"]))
    item = load_result(tmp_path / "tune.json")
    assert item.kind == "tune_combination" and isinstance(item.result, TuneView)
    assert item.result.variants[0].throughput_infer_per_s == 150.0 and item.result.best == combination.key
    assert [(m.model, m.variants[0].throughput_infer_per_s) for m in item.result.per_model] == [
        ("mlp", 100.0), ("preprocess", 50.0)]  # fmt: skip
    with pytest.raises(PerfkitError, match="server differ"):
        CombinationCheckpoint(path, fingerprint(spec, study, "host:8000"))
    path.write_text(json.dumps({"schema": 1, "fingerprint": {}, "variants": {}}))
    with pytest.raises(PerfkitError, match="checkpoint of a one-model tune"):
        CombinationCheckpoint(path, fingerprint(spec, study, "embedded"))


@pytest.mark.usefixtures("quick_png")  # the page's text is checked, not its pictures
def test_an_interrupted_tune_of_several_models_writes_each_best_config_so_far(
    repository: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    configs = [str(repository / "mlp" / "config.pbtxt"), str(repository / "preprocess" / "config.pbtxt")]
    study = read_study([Path(c) for c in configs])
    assert study is not None
    spec = TuneSpec(config_path=repository / "mlp" / "config.pbtxt", space=SpaceSpec(max_instances=1, max_batch=1))
    result = new_result(spec, study)
    combination = result.space.variant(result.space.coordinates()[0])
    record = result.records[combination.key] = CombinationRecord(combination, combination.configs(study), False)
    record.levels = [{"mlp": make_level(1, [100.0] * 3), "preprocess": make_level(1, [50.0] * 3)}]
    record.figures = [level_figures(study, record.levels[0])]
    record.chosen, record.status = 0, "ok"
    result.ranking = result.rank()  # the search under way: nothing re-measured, not completed

    def interrupted(spec, study, sink, checkpoint):  # type: ignore[no-untyped-def]
        sink(result)
        return result, 130

    monkeypatch.setattr("perfkit.cli.tune.run_combination_tune", interrupted)
    out = tmp_path / "out"
    assert main(["tune", *configs, "-o", str(out), "--quiet"]) == 130
    err = capsys.readouterr().err
    assert all((out / "best" / name / "config.pbtxt").is_file() for name in ("mlp", "preprocess"))
    assert f"interrupted: {out / 'best'} holds the best configuration found so far (provisional" in err
    assert "provisional" in (out / "summary.txt").read_text() and "provisional" in (out / "report.html").read_text()
