"""perfkit.tune.params and `perfkit tune --param`: parsing against the ModelConfig schema, the refusals
(each naming the path, its type and the fix), application to a config, and the variants the searches
make of the values. No server: a refused --param exits 2 before one would start."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import text_format

from perfkit.cli import main
from perfkit.errors import PerfkitError
from perfkit.report.tune_tables import render_csv
from perfkit.tune.objectives import Estimate, Figures, Objective
from perfkit.tune.params import apply_settings, check_against_config, parse_param
from perfkit.tune.search import brute_search, quick_search
from perfkit.tune.space import Space, SpaceSpec, Variant, build_space, default_variant, variant_of
from perfkit.tune.state import Model, Record, TuneResult, TuneSpec
from v2kit.model_config import config_from_json, config_to_json, parse_config_text

BASE_TEXT = """
name: "m"
backend: "python"
max_batch_size: 8
input [{ name: "IN" data_type: TYPE_FP32 dims: [4] }]
output [{ name: "OUT" data_type: TYPE_FP32 dims: [4] }]
instance_group [{ count: 1 kind: KIND_CPU }]
"""


def base_config() -> dict[str, Any]:
    return config_to_json(parse_config_text(BASE_TEXT, Path("m/config.pbtxt")))


@pytest.mark.parametrize(
    ("text", "values"),
    [
        ("dynamic_batching.max_queue_delay_microseconds=0,100,500", (0, 100, 500)),
        ("instance_group[0].count=1:4", (1, 2, 3, 4)),
        ("instance_group[0].count=2:8:3", (2, 5, 8)),
        ("dynamic_batching.preferred_batch_size=[4,8]", ((4, 8),)),
        ("dynamic_batching.preferred_batch_size=[4],[4, 8],[]", ((4,), (4, 8), ())),
        ("instance_group[0].kind=kind_cpu,KIND_GPU", ("KIND_CPU", "KIND_GPU")),
        ("dynamic_batching.preserve_ordering=true,False", (True, False)),
        ("max_batch_size=8,8,16", (8, 16)),
    ],
)
def test_values_parse_by_the_fields_type(text: str, values: tuple[object, ...]) -> None:
    assert parse_param(text).values == values


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("dynamic_batching.max_queue_delay_microsecond=1", "has no field 'max_queue_delay_microsecond'; did you mean max_queue_delay_microseconds?"),
        ("instance_groups[0].count=1", "did you mean instance_group?"),
        ("instance_group.count=1", "pick an element: instance_group[0]"),
        ("max_batch_size[0]=1", "drop [0]"),
        ("dynamic_batching=1", "name one of its fields"),
        ("parameters.x=1", "is a map (string keys); pick an entry: parameters[KEY].string_value"),
        ("max_batch_size=abc", "'abc' does not fit the field's type int32; give an integer"),
        ("sequence_batching.max_sequence_idle_microseconds=-1", "type uint64: out of range; give an integer in 0.."),
        ("instance_group[0].kind=KIND_CPUU", "did you mean KIND_CPU"),
        ("dynamic_batching.preserve_ordering=yes", "give true or false"),
        ("dynamic_batching.preferred_batch_size=4,8", "give each alternative as a bracketed list, e.g."),
        ("backend=a:b", None),  # a string field takes 'a:b' as a string, not a range
        ("max_batch_size=4:1", "needs A <= B and STEP >= 1"),
        ("instance_group[0].kind=1:2", "a range A:B needs an integer field"),
        ("max_batch_size", "--param takes PATH=VALUES"),
    ],
)  # fmt: skip
def test_refusals_name_the_path_and_the_fix(text: str, message: str | None) -> None:
    if message is None:
        assert parse_param(text).values == ("a:b",)
        return
    with pytest.raises(PerfkitError) as caught:
        parse_param(text)
    assert message in str(caught.value)
    assert str(caught.value).startswith("--param")


def test_an_index_past_the_configs_list_is_refused() -> None:
    config = base_config()
    check_against_config([parse_param("instance_group[0].count=1:2")], config, "m/config.pbtxt")
    with pytest.raises(PerfkitError, match=r"m/config.pbtxt has 1 instance_group entry, so \[1\] is out of range"):
        check_against_config([parse_param("instance_group[1].count=1:2")], config, "m/config.pbtxt")


def test_a_oneof_member_beside_its_sibling_is_refused() -> None:
    config = base_config()
    config["dynamic_batching"] = {"max_queue_delay_microseconds": 100}
    sequence = parse_param("sequence_batching.max_sequence_idle_microseconds=1000")
    with pytest.raises(
        PerfkitError, match="m/config.pbtxt sets dynamic_batching, and 'sequence_batching' is in the same oneof"
    ):
        check_against_config([sequence], config, "m/config.pbtxt")
    delay = parse_param("dynamic_batching.max_queue_delay_microseconds=0")
    with pytest.raises(PerfkitError, match="search them in separate tunes"):
        check_against_config([delay, sequence], base_config(), "m/config.pbtxt")
    check_against_config([sequence], base_config(), "m/config.pbtxt")


def test_settings_apply_to_a_copy_and_round_trip_through_text_format() -> None:
    config = base_config()
    assert "dynamic_batching" not in config
    settings = (
        ("dynamic_batching.max_queue_delay_microseconds", 100),
        ("dynamic_batching.preferred_batch_size", (4, 8)),
        ("instance_group[0].count", 3),
        ("instance_group[0].kind", "KIND_GPU"),
    )
    applied = apply_settings(config, settings)
    assert "dynamic_batching" not in config and config["instance_group"][0]["count"] == 1
    text = text_format.MessageToString(config_from_json(json.dumps(applied), "applied"))
    proto = parse_config_text(text, Path("m/config.pbtxt"))
    assert proto.dynamic_batching.max_queue_delay_microseconds == 100
    assert list(proto.dynamic_batching.preferred_batch_size) == [4, 8]
    assert proto.instance_group[0].count == 3 and proto.instance_group[0].kind == proto.instance_group[0].KIND_GPU
    assert proto.max_batch_size == 8 and proto.input[0].name == "IN"  # the rest of the config is kept


def test_params_alone_make_the_grid_and_keys_show_the_values() -> None:
    config = base_config()
    spec = SpaceSpec(params=(parse_param("dynamic_batching.max_queue_delay_microseconds=0,100"),
                             parse_param("instance_group[0].count=1:3")))  # fmt: skip
    default = variant_of(config)
    space = build_space(spec, default, config)
    assert space.shape == (1, 1, 1, 1, 2, 3) and space.size == 6
    policy = brute_search(space, default)
    seen: list[Variant] = [next(policy)]
    try:
        while True:
            seen.append(policy.send(None))
    except StopIteration:
        pass
    assert seen[0] == default and len(seen) == 7
    keys = [v.key for v in seen[1:]]
    assert keys[0] == "dynamic_batching.max_queue_delay_microseconds=0 instance_group[0].count=1"
    assert "dynamic_batching.max_queue_delay_microseconds=100 instance_group[0].count=3" in keys
    applied = seen[-1].apply(config)
    assert applied["dynamic_batching"]["max_queue_delay_microseconds"] == 100
    assert applied["instance_group"][0]["count"] == 3 and applied["instance_group"][0]["kind"] == "KIND_CPU"
    assert seen[-1].params()["settings"] == {
        "dynamic_batching.max_queue_delay_microseconds": 100, "instance_group[0].count": 3,
    }  # fmt: skip


def test_the_point_that_is_the_config_itself_is_the_default_measured_once_and_named_alike() -> None:
    config = base_config()
    config["dynamic_batching"] = {"max_queue_delay_microseconds": 100, "preferred_batch_size": []}
    spec = SpaceSpec(params=(parse_param("dynamic_batching.max_queue_delay_microseconds=0,100,500"),))
    default = default_variant(config, spec.params)
    space = build_space(spec, variant_of(config), config)
    assert space.home_is_base and space.variant(space.nearest(default)) == default
    policy = brute_search(space, default)
    keys = [next(policy).key]
    with contextlib.suppress(StopIteration):
        while True:
            keys.append(policy.send(None).key)
    # The default is named by its values of the --param fields, as every other variant: not in knob style.
    assert keys == [
        "dynamic_batching.max_queue_delay_microseconds=100",
        "dynamic_batching.max_queue_delay_microseconds=0",
        "dynamic_batching.max_queue_delay_microseconds=500",
    ]
    # Without dynamic_batching in the config, a delay of 100 turns batching on: a variant of its own,
    # and the default says that it sets no delay.
    assert not build_space(spec, variant_of(base_config()), base_config()).home_is_base
    assert default_variant(base_config(), spec.params).key == "dynamic_batching.max_queue_delay_microseconds=unset"


def test_quick_search_climbs_the_param_dimensions_from_the_configs_own_values() -> None:
    config = base_config()
    spec = SpaceSpec(params=(parse_param("instance_group[0].count=1:6"),))
    default = variant_of(config)
    space = build_space(spec, default, config)
    assert space.nearest(default)[4] == 0  # the config's count, 1, is the first value

    def throughput(variant: Variant) -> Figures:
        count = dict(variant.settings).get("instance_group[0].count", 1)
        return {"throughput": Estimate.exact(100.0 * min(count, 4)), "p99_ms": Estimate.exact(1.0)}

    policy = quick_search(space, default, Objective())
    variant = next(policy)
    counts = []
    try:
        while True:
            counts.append(dict(variant.settings).get("instance_group[0].count"))
            variant = policy.send(throughput(variant))
    except StopIteration:
        pass
    assert 4 in counts and 6 not in counts  # it climbs to the plateau and stops one past it


def test_cli_refuses_a_bad_param_before_any_server(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "m" / "config.pbtxt"
    config.parent.mkdir()
    config.write_text(BASE_TEXT)
    assert main(["tune", str(config), "--param", "dynamic_batching.max_queue_delay=0,100"]) == 2
    assert "did you mean max_queue_delay_microseconds?" in capsys.readouterr().err
    assert main(["tune", str(config), "--param", "instance_group[2].count=1:2"]) == 2
    assert "has 1 instance_group entry, so [2] is out of range" in capsys.readouterr().err
    assert main(["tune", str(config), "--param", "max_batch_size=4", "--param", "max_batch_size=8"]) == 2
    assert "--param max_batch_size is given twice" in capsys.readouterr().err
    assert main(["tune", str(config), "--param", "max_batch_size=4", "--max-instance-count", "3"]) == 2
    assert "--max-instance-count is a knob of the default grid, which --param replaces" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["tune", "--help"])
    assert "--param PATH=VALUES" in capsys.readouterr().out


def test_a_records_knob_columns_are_those_of_the_config_it_loads(tmp_path: Path) -> None:
    config = base_config()
    variant = Variant(1, 8, None, "KIND_CPU", (("instance_group[0].count", 3), ("max_batch_size", 16)))
    record = Record(variant, variant.apply(config), default=False, status="failed", error="refused")
    assert record.params()["instance_count"] == 3 and record.params()["max_batch_size"] == 16
    result = TuneResult(
        TuneSpec(tmp_path / "config.pbtxt"), Model("m", tmp_path, config), Space((1,), (8,), (None,)), ""
    )
    result.records[variant.key] = record
    row = render_csv(result).splitlines()[1].split(",")
    assert row[:4] == ["instance_group[0].count=3 max_batch_size=16", "false", "3", "16"]


def test_map_entries_are_searched_by_key_and_created_when_absent() -> None:
    threads = parse_param("parameters[intra_op_thread_count].string_value=1,2,4")
    assert threads.steps == (("parameters", "intra_op_thread_count"), ("string_value", None))
    assert threads.values == ("1", "2", "4") and threads.type_name == "string"
    tag = parse_param("metric_tags[team.name]=a,b")  # a scalar-valued map; a key may hold dots
    assert tag.steps == (("metric_tags", "team.name"),)
    policy = parse_param("dynamic_batching.priority_queue_policy[2].max_queue_size=0:2")
    assert policy.steps[-2] == ("priority_queue_policy", "2") and policy.values == (0, 1, 2)

    config = base_config()
    config["parameters"] = {"EXECUTION_ENV_PATH": {"string_value": "env.tar.gz"}}
    check_against_config([threads, tag, policy], config, "m/config.pbtxt")
    applied = apply_settings(
        config,
        (
            ("parameters[intra_op_thread_count].string_value", "2"),
            ("metric_tags[team.name]", "b"),
            ("dynamic_batching.priority_queue_policy[2].max_queue_size", 1),
        ),
    )
    assert "intra_op_thread_count" not in config["parameters"]  # the config itself is untouched
    proto = parse_config_text(
        text_format.MessageToString(config_from_json(json.dumps(applied), "applied")), Path("m/config.pbtxt")
    )
    assert proto.parameters["intra_op_thread_count"].string_value == "2"
    assert proto.parameters["EXECUTION_ENV_PATH"].string_value == "env.tar.gz"  # other entries kept
    assert proto.metric_tags["team.name"] == "b"
    assert proto.dynamic_batching.priority_queue_policy[2].max_queue_size == 1


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("parameters.string_value=1", "is a map (string keys); pick an entry: parameters[KEY].string_value"),
        ("parameters[x]=1", "has type message ModelParameter; name one of its fields, e.g. parameters[x].string_value"),
        ("parameters[x].value=1", "ModelParameter has no field 'value'; did you mean string_value?"),
        ("dynamic_batching.priority_queue_policy[high].max_queue_size=1", "'high' does not fit the field's type uint64"),
        ("instance_group[first].count=1", "its index [first] must be a number"),
    ],
)  # fmt: skip
def test_map_refusals_name_the_key_and_the_fix(text: str, message: str) -> None:
    with pytest.raises(PerfkitError) as caught:
        parse_param(text)
    assert message in str(caught.value)
