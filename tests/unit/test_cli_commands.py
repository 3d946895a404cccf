"""The console lines the commands print (perfkit.report.summary)."""

from __future__ import annotations

from perfkit.measure.probe import ModelProbe, ServerProbe
from perfkit.report.summary import render_probe


def test_probe_lines_show_each_model_and_its_error() -> None:
    ok = ModelProbe("mlp", "1", {"x": [1, 4]}, 20, 0, 0.5, 1.25)
    broken = ModelProbe("cnn", "", {}, 0, 0, 0.0, 0.0, "no such model")
    lines = render_probe(ServerProbe("h:1", True, True, "ref", "2.0", ["binary_tensor_data"], [ok, broken]))
    assert lines[:3] == ["server   ref 2.0 at h:1", "health   live=True ready=True", "features binary_tensor_data"]
    assert lines[5].split() == ["mlp", "1", "x[1,", "4]", "20/20", "0.500", "1.250"]
    assert lines[-1] == "  error: no such model"
