"""The files perfkit writes: the mode the umask gives (not mkstemp's 0600), whichever command writes
them; a rewritten file keeps its mode; a sweep's names say the protocol and list only what exists."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from perfkit.cli import main
from perfkit.cli.sweep import interrupt_lines
from perfkit.report.figures import canvas
from perfkit.results import writing
from perfkit.results.writing import new_file_mode, write_text_atomic
from perfkit.sweep.run import SweepFiles, SweepRun
from perfkit.sweep.spec import LoadSpec, OutputSpec, SweepSpec
from perfkit.target import TargetSpec
from tests.synthetic import steady_sweep, tune_json, write_sweep_json

TINY_PNG = b"\x89PNG\r\n\x1a\n"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(params=[(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)], ids=["umask-022", "umask-077", "umask-002"])
def umask(request: pytest.FixtureRequest) -> Iterator[int]:
    """The process's umask set for the test (and perfkit's reading of it forgotten); yields the
    mode a new file must get."""
    given, expected = request.param
    old = os.umask(given)
    new_file_mode.cache_clear()
    try:
        yield expected
    finally:
        os.umask(old)
        new_file_mode.cache_clear()


@pytest.fixture
def quick_png(monkeypatch: pytest.MonkeyPatch) -> None:
    """The report's figures built but not drawn: these tests are about the files, not the pixels."""
    monkeypatch.setattr(canvas, "png", lambda fig: TINY_PNG)


def test_the_umask_is_read_without_changing_it(umask: int) -> None:
    before = os.umask(0o022)
    os.umask(before)
    assert writing._read_umask() == before
    assert new_file_mode() == umask
    after = os.umask(0o022)
    os.umask(after)
    assert after == before


def test_a_new_file_gets_the_mode_the_umask_gives(tmp_path: Path, umask: int) -> None:
    path = tmp_path / "out.csv"
    write_text_atomic(path, "a,b\n")
    assert path.read_text() == "a,b\n" and mode(path) == umask
    assert [p.name for p in tmp_path.iterdir()] == ["out.csv"]  # no temporary file left


def test_a_rewritten_file_keeps_its_own_mode(tmp_path: Path) -> None:
    path = tmp_path / "history.csv"
    path.write_text("old\n")
    path.chmod(0o640)
    write_text_atomic(path, "new\n")
    assert path.read_text() == "new\n" and mode(path) == 0o640


def sweep_spec(tmp_path: Path, protocol: str, **output: object) -> SweepSpec:
    return SweepSpec(
        TargetSpec(url="127.0.0.1:8000", protocol=protocol), LoadSpec("concurrency"),
        output=OutputSpec(report_dir=tmp_path, **output),  # type: ignore[arg-type]
    )  # fmt: skip


def test_a_sweeps_files_name_the_protocol_and_follow_the_umask(tmp_path: Path, umask: int, quick_png: None) -> None:
    for protocol in ("http", "grpc"):
        files = SweepFiles(sweep_spec(tmp_path, protocol, history_csv=tmp_path / "history.csv"), "mlp")
        assert files.json_path.name.startswith(f"sweep-mlp-concurrency-{protocol}-")
        assert files.paths() == []  # nothing written yet, nothing named
        files.save(steady_sweep(), None)
        files.finish(steady_sweep())
        names = [p.name for p in files.paths()]
        stem = files.json_path.stem
        assert names == [f"{stem}.csv", f"{stem}_long.csv", f"{stem}.json", f"{stem}.html", "history.csv"]
        assert {p: mode(p) for p in files.paths()} == {p: umask for p in files.paths()}


def test_an_unfinished_sweep_names_neither_its_report_nor_its_history(tmp_path: Path) -> None:
    files = SweepFiles(sweep_spec(tmp_path, "http", history_csv=tmp_path / "history.csv"), "mlp")
    files.save(steady_sweep(), None)  # as after Ctrl-C: the levels saved, `finish` never ran
    assert files.html_path is not None and files.history_path is not None
    assert files.html_path not in files.paths() and files.history_path not in files.paths()
    assert files.paths() and all(p.exists() for p in files.paths())


def test_report_and_compare_outputs_follow_the_umask(tmp_path: Path, umask: int, quick_png: None) -> None:
    base = write_sweep_json(steady_sweep(), tmp_path / "base.json")
    new = write_sweep_json(steady_sweep(0.99), tmp_path / "new.json")
    outputs = [tmp_path / "out" / name for name in ("gate.xml", "compare.html", "report.html", "tune.html")]
    assert main(["compare", str(base), str(new), "--junit", str(outputs[0]), "--html", str(outputs[1])]) == 0
    assert main(["report", str(base), "-o", str(outputs[2])]) == 0
    assert main(["report", str(tune_json(tmp_path)), "-o", str(outputs[3])]) == 0
    assert {p.name: mode(p) for p in outputs} == {p.name: umask for p in outputs}


@pytest.mark.usefixtures("quick_png")  # the page's text is checked, not its pictures
def test_ctrl_c_says_what_it_kept(tmp_path: Path) -> None:
    files = SweepFiles(sweep_spec(tmp_path, "http", history_csv=tmp_path / "history.csv"), "mlp")
    assert interrupt_lines(SweepRun()) == ["interrupted before any level finished: no results written"]
    files.save(steady_sweep(), None)
    assert interrupt_lines(SweepRun(steady_sweep(), files)) == [
        "interrupted: the levels finished so far are in the files above",
        f"--append {tmp_path / 'history.csv'}: not appended to, as the sweep was interrupted",
    ]
    files.finish(steady_sweep())  # Ctrl-C after the sweep's end: the history has its rows
    assert interrupt_lines(SweepRun(steady_sweep(), files))[1:] == []
