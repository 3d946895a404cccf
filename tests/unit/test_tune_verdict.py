"""How a tune's ranking is told (`perfkit.tune.verdict`), on the console and in the HTML report alike:
a gain only when its interval excludes 0, the tie marks by one rule, "provisional" for a tune that
did not finish, intervals in both tables; and what `perfkit tune` leaves when it is interrupted or
recommends nothing. Tune results are built here from synthetic levels: no server."""

from __future__ import annotations

import html
import itertools
import json
import re
from pathlib import Path

import pytest

from perfkit.cli import main
from perfkit.errors import ExitCode
from perfkit.report.html import render_html
from perfkit.report.html import tune as tune_section
from perfkit.report.tune_tables import render_json, render_summary
from perfkit.results.files import load_result
from perfkit.tune.objectives import Estimate, Objective, parse_constraint, rank
from perfkit.tune.space import Space, Variant
from perfkit.tune.state import Model, Record, TuneResult, TuneSpec
from perfkit.tune.verdict import TIE_RULE, difference, mark, provisional
from tests.synthetic import make_level

CONFIG = 'name: "mlp"\nmax_batch_size: 8\ninstance_group [ { count: 1 kind: KIND_CPU } ]\n'
NOISY = [100.0, 300.0, 200.0]  # windows that disagree: a throughput interval far wider than ±50 %


def steady(tp: float) -> list[float]:
    return [tp * 0.99, tp * 1.01, tp]


def tune_result(
    tmp_path: Path, variants: dict[int, list[float]], *, completed: bool = True, leaders: tuple[int, ...] = (),
    constraints: tuple[str, ...] = (), top: int = 3,
) -> TuneResult:  # fmt: skip
    """A tune of `variants` (instance count: window throughputs), the default being count=1;
    `leaders` re-measured once at the same throughputs."""
    spec = TuneSpec(tmp_path / "mlp" / "config.pbtxt", constraints=tuple(map(parse_constraint, constraints)), top=top)
    default = Variant(1, 8, None, "KIND_CPU")
    result = TuneResult(spec, Model("mlp", tmp_path / "mlp", {"max_batch_size": 8}), Space((1,), (8,), (None,)),
                        default.key)  # fmt: skip
    for count, windows in variants.items():
        variant = Variant(count, 8, None, "KIND_CPU")
        record = Record(variant, variant.apply({"max_batch_size": 8}), variant.key == default.key, status="ok")
        record.levels, record.chosen = [make_level(4, windows)], 0
        if count in leaders:
            record.remeasures = [make_level(4, windows)]
        result.records[variant.key] = record
    result.leaders = [Variant(c, 8, None, "KIND_CPU").key for c in leaders]
    result.ranking = result.rank(final=bool(leaders))
    result.completed = completed
    return result


def key(count: int) -> str:
    return Variant(count, 8, None, "KIND_CPU").key


def page_of(result: TuneResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The HTML report from the tune.json perfkit tune writes, its text unescaped; no figures drawn."""
    monkeypatch.setattr(tune_section, "_tune_figures", lambda *args: [])
    path = tmp_path / "tune.json"
    path.write_text(render_json(result, ["tune"]))
    return html.unescape(render_html([load_result(path)]))


def html_marks(page: str) -> dict[str, str]:
    """Each table row's variant and status badge."""
    rows = re.findall(r"<tr><td[^>]*>\d+</td><td>([^<]+)</td>.*?<span class=\"badge [a-z]+\">([^<]+)</span>", page)
    return {name.replace(" (default)", "").replace(" ★", ""): status for name, status in rows}


def test_a_difference_is_significant_exactly_when_the_intervals_do_not_overlap() -> None:
    intervals = [(v, v - h, v + h) for v, h in itertools.product((0.0, 0.1, 0.25, 0.5), (0.0, 0.05, 0.2))]
    for a, b in itertools.product(intervals, repeat=2):
        d = difference(a, b)
        assert d.low <= d.gain <= d.high
        assert d.significant == (not Estimate(*a).overlaps(Estimate(*b))), (a, b)
    # The ranking's tie is the same rule: a tied variant's difference to the leader includes 0.
    ranking = rank(
        [("a", (1.0,), {"throughput": Estimate(100, 95, 105)}), ("b", (2.0,), {"throughput": Estimate(98, 90, 99)}),
         ("c", (3.0,), {"throughput": Estimate(80, 75, 85)})], Objective(), [],
    )  # fmt: skip
    scores = {e.key: (e.score.value, e.score.low, e.score.high) for e in ranking.entries if e.score}
    for k in "bc":
        assert (k in ranking.tie) == (not difference(scores[k], scores["a"]).significant)


def test_a_gain_whose_interval_includes_0_is_not_claimed_on_the_console_or_in_the_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The pick measured 2× the default, from windows too noisy to tell: the interval spans 0. (Only
    # re-measured variants tie, so the default, measured once, is not picked for being cheaper.)
    result = tune_result(tmp_path, {1: steady(100.0), 2: NOISY}, leaders=(2,))
    assert result.best is not None and result.best.variant.key == key(2)
    summary = "\n".join(render_summary(result))
    assert "more throughput than the default" not in summary
    assert re.search(r"It is not distinguishable from the default configuration \(\+100 %, 95 % CI -\d+\.\.\+\d+ %\)",
                     summary), summary  # fmt: skip
    page = page_of(result, tmp_path, monkeypatch)
    assert "better than the default" not in page
    assert re.search(rf"{key(2)} is not distinguishable from the default configuration \(\+100 %, 95 % CI -\d+", page)


def test_a_significant_gain_is_claimed_with_its_interval_in_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = tune_result(tmp_path, {1: steady(100.0), 2: steady(200.0)})
    summary = "\n".join(render_summary(result))
    assert re.search(r"That is 100 % more throughput than the default configuration \(95 % CI \+\d+\.\.\+\d+ %\)",
                     summary), summary  # fmt: skip
    page = page_of(result, tmp_path, monkeypatch)
    assert re.search(rf"{key(2)} is 100 % better than the default configuration \(95 % CI \+\d+\.\.\+\d+ %\)", page)


def test_the_report_says_provisional_when_the_console_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    unfinished = tune_result(tmp_path, {1: steady(100.0), 2: steady(200.0)}, completed=False)
    words = provisional(False)
    assert words in render_summary(unfinished) and words in page_of(unfinished, tmp_path, monkeypatch)
    finished = tune_result(tmp_path, {1: steady(100.0), 2: steady(200.0)})
    assert "provisional" not in "\n".join(render_summary(finished))
    assert "provisional" not in page_of(finished, tmp_path, monkeypatch)


def test_the_reports_table_carries_intervals_and_names_the_tie_rule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    page = page_of(tune_result(tmp_path, {1: steady(100.0), 2: steady(200.0)}), tmp_path, monkeypatch)
    assert "<th>95% CI</th>" in page or '<th class="n">95% CI</th>' in page
    assert "vs default (95% CI)" in page and TIE_RULE in page
    assert re.search(r"\+100 % \(\+\d+\.\.\+\d+\)", page)  # the pick's difference to the default, with its interval
    assert re.search(r"19\d\.\d – 20\d\.\d", page)  # its throughput's interval


def test_one_rule_marks_ties_in_both_tables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Re-measured: 4 (the leader), 3 and 6 (tied: overlapping) and 2 (significantly below). Not
    # re-measured: 5, noisy, whose interval overlaps the leader's, and the default, far below.
    result = tune_result(
        tmp_path, {1: steady(50.0), 2: steady(160.0), 3: steady(198.0), 4: steady(200.0), 5: NOISY, 6: steady(199.0)},
        leaders=(2, 3, 4, 6), top=6,
    )  # fmt: skip
    ranking = result.ranking
    assert ranking is not None and ranking.leader == key(4) and set(ranking.tie) == {key(3), key(4), key(6)}
    assert ranking.best == key(3)  # the cheaper of the tie
    scores = {e.key: (e.score.value, e.score.low, e.score.high) for e in ranking.entries if e.score}
    marks = {
        k: mark(k, best=ranking.best, leader=ranking.leader, ties=ranking.tie, remeasured=result.leaders, scores=scores)
        for k in scores
    }
    assert marks[key(3)] == "recommended" and marks[key(4)] == "the leader"
    assert re.fullmatch(r"tied with the leader: [-+]\d+ % \(-\d+\.\.\+\d+\)", marks[key(6)])
    assert marks[key(2)] == "" and marks[key(1)] == ""  # told apart: their difference to the leader excludes 0
    assert marks[key(5)].startswith("overlaps the leader: ") and marks[key(5)].endswith(", not re-measured")
    # The console and the report show the same marks, each beside the difference that justifies it.
    summary = render_summary(result)
    console = {k: line for line in summary for k in scores if line[:1].isdigit() and f"{k} " in line}
    page = html_marks(page_of(result, tmp_path, monkeypatch))
    for k, m in marks.items():
        shown = f"feasible ({m})" if m else "feasible"
        assert shown in console[k] and page[k] == shown, (k, console[k], page[k])
    # A tie is never shown with a difference to the leader that excludes 0.
    for text in [*console.values(), *page.values()]:
        found = re.search(r"tied with the leader: [-+]\d+ % \(([-+]\d+)\.\.([-+]\d+)\)", text)
        assert found is None or int(found[1]) <= 0 <= int(found[2])


@pytest.mark.usefixtures("quick_png")  # the page's text is checked, not its pictures
def test_an_interrupted_tune_writes_its_best_so_far_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "mlp").mkdir()
    (tmp_path / "mlp" / "config.pbtxt").write_text(CONFIG)
    partial = tune_result(tmp_path, {1: steady(100.0), 2: steady(200.0)}, completed=False)

    def interrupted(spec, sink, checkpoint, opener):  # type: ignore[no-untyped-def]
        sink(partial)
        return partial, ExitCode.INTERRUPTED

    monkeypatch.setattr("perfkit.cli.tune.run_tune", interrupted)
    out = tmp_path / "out"
    assert main(["tune", str(tmp_path / "mlp" / "config.pbtxt"), "-o", str(out), "--quiet"]) == 130
    err = capsys.readouterr().err
    best = out / "best" / "config.pbtxt"
    assert best.is_file() and "count: 2" in best.read_text()
    assert f"interrupted: {best} holds the best configuration found so far (provisional" in err
    assert f"wrote {out / 'report.html'}" in err and provisional(False) in (out / "report.html").read_text()
    assert provisional(False) in (out / "summary.txt").read_text()


@pytest.mark.usefixtures("quick_png")  # the page's text is checked, not its pictures
def test_loosening_a_constraint_is_advised_only_when_one_was_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "mlp").mkdir()
    (tmp_path / "mlp" / "config.pbtxt").write_text(CONFIG)

    def finished(result: TuneResult):  # type: ignore[no-untyped-def]
        def run(spec, sink, checkpoint, opener):  # type: ignore[no-untyped-def]
            return result, ExitCode.FAILED

        return run

    config = str(tmp_path / "mlp" / "config.pbtxt")
    for constraints in ((), ("p99_ms<=20",)):  # none set; set, but every variant failed before it mattered
        failed = tune_result(tmp_path, {1: steady(100.0)}, constraints=constraints)
        failed.records[key(1)].status, failed.records[key(1)].chosen = "failed", None
        failed.ranking = failed.rank(final=True)
        monkeypatch.setattr("perfkit.cli.tune.run_tune", finished(failed))
        flags = [f"--constraint={c}" for c in constraints]
        assert main(["tune", config, *flags, "-o", str(tmp_path / "a"), "--quiet"]) == 1
        err = capsys.readouterr().err
        assert "loosen --constraint" not in err and "every variant failed" in err
        assert "Every variant failed" in (tmp_path / "a" / "summary.txt").read_text()
        assert "every configuration failed" in (tmp_path / "a" / "report.html").read_text()

    infeasible = tune_result(tmp_path, {1: steady(100.0)}, constraints=("throughput>=1000",))
    monkeypatch.setattr("perfkit.cli.tune.run_tune", finished(infeasible))
    assert main(["tune", config, "--constraint", "throughput>=1000", "-o", str(tmp_path / "b"), "--quiet"]) == 1
    assert "loosen --constraint" in capsys.readouterr().err
    assert json.loads((tmp_path / "b" / "tune.json").read_text())["best"] is None
