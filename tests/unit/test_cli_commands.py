"""The command registry, and the console lines the commands print (perfkit.report.summary)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from perfkit.cli import COMMANDS, build_parser
from perfkit.errors import ExitCode
from perfkit.measure.probe import ModelProbe, ServerProbe
from perfkit.report.summary import render_probe, sweep_notes, sweep_table
from tests.synthetic import steady_sweep


def test_each_command_parses_alone_as_under_perfkit() -> None:
    assert list(COMMANDS) == ["sweep", "report", "compare", "run", "tune", "probe"]
    subparsers = next(a for a in build_parser()._actions if a.dest == "command")
    for name, under_perfkit in subparsers.choices.items():
        alone = COMMANDS[name].parser()
        assert alone.prog == under_perfkit.prog == f"perfkit {name}"
        assert alone.format_help() == under_perfkit.format_help()


def test_sweep_notes_name_the_files_then_why_the_sweep_stopped() -> None:
    done = steady_sweep()
    stopped = dataclasses.replace(done, completed=False, stop_reason="the server stopped answering (timeout)")
    written = [Path("r/a.csv"), Path("r/a.json")]
    assert sweep_notes(done, written, ExitCode.OK) == ["wrote r/a.csv", "wrote r/a.json"]
    assert sweep_notes(stopped, [], ExitCode.FAILED) == [
        "error: the sweep stopped early: the server stopped answering (timeout)"
    ]
    assert sweep_notes(stopped, [], ExitCode.INTERRUPTED) == []  # the caller words an interrupt
    assert sweep_notes(None, [], ExitCode.INTERRUPTED) == []
    assert sweep_table(done)[0].split()[:2] == ["concurrency", "infer/s"]
    assert sweep_table(None) == [] and sweep_table(dataclasses.replace(done, levels=())) == []


def test_probe_lines_show_each_model_and_its_error() -> None:
    ok = ModelProbe("mlp", "1", {"x": [1, 4]}, 20, 0, 0.5, 1.25)
    broken = ModelProbe("cnn", "", {}, 0, 0, 0.0, 0.0, "no such model")
    lines = render_probe(ServerProbe("h:1", True, True, "ref", "2.0", ["binary_tensor_data"], [ok, broken]))
    assert lines[:3] == ["server   ref 2.0 at h:1", "health   live=True ready=True", "features binary_tensor_data"]
    assert lines[5].split() == ["mlp", "1", "x[1,", "4]", "20/20", "0.500", "1.250"]
    assert lines[-1] == "  error: no such model"
