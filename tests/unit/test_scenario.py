"""Scenario files: every shipped scenario parses into flags its command accepts; settings become
flags with defaults < file < command line; errors name the file, the table and the key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from perfkit.cli import COMMANDS, main
from perfkit.cli.scenario import command_argv, load_scenario, merge_argv, parse_scenario
from perfkit.cli.sweep import spec_from_args
from perfkit.errors import PerfkitError

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = sorted((ROOT / "scenarios").glob("*.toml"))
SWEEP = COMMANDS["sweep"].parser()
assert SWEEP is not None


def test_the_shipped_scenarios_are_there() -> None:
    assert {p.stem for p in SCENARIOS} >= {"smoke", "concurrency_sweep", "poisson_slo", "tune_mlp", "regression_gate"}


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_every_scenario_becomes_a_valid_command(path: Path) -> None:
    scenario = load_scenario(path)
    parser = COMMANDS[scenario.command].parser()
    if parser is None:
        pytest.skip(f"this perfkit has no `perfkit {scenario.command}` yet")
    argv = command_argv(parser, scenario.settings, str(path))
    args = parser.parse_args(argv)
    if scenario.command == "sweep":
        spec = spec_from_args(args)  # every check of `perfkit sweep` applies
        assert spec.target.url is None or scenario.server.url
    if scenario.gates.baseline is not None:
        assert scenario.gates.baseline.is_file(), f"{path}: the baseline {scenario.gates.baseline} is not committed"
        baseline_levels = load_baseline_levels(scenario.gates.baseline)
        assert baseline_levels, "the committed baseline measured no level"


def load_baseline_levels(path: Path) -> list[float]:
    from perfkit.results.model import read_sweep

    return [lv.level for lv in read_sweep(path).levels]


def test_the_readme_documents_every_key() -> None:
    readme = (ROOT / "scenarios" / "README.md").read_text()
    for key in ("name", "description", "command", "url", "start", "model_repository", "args", "baseline",
                "max_throughput_drop", "max_latency_increase", "metrics", "alpha", "junit", "slo_p99_ms",
                "min_throughput_at_slo", "allow_unstable"):  # fmt: skip
        assert re.search(rf"`{key}`", readme), key
    for path in SCENARIOS:
        assert path.name in readme


def scenario(text: str, tmp_path: Path, name: str = "s.toml"):  # type: ignore[no-untyped-def]
    path = tmp_path / name
    path.write_text(text)
    return load_scenario(path)


def test_settings_become_flags_of_the_command(tmp_path: Path) -> None:
    s = scenario(
        """
[sweep]
concurrency-range = "1:8:2"
measurement_interval = 250
header = ["A: 1", "B: 2"]
collect_metrics = true
binary_search = false
request_intervals = "intervals.txt"
input_data = "random"
""",
        tmp_path,
    )
    argv = command_argv(SWEEP, s.settings, "s")
    assert argv == [
        "--concurrency-range", "1:8:2", "--measurement-interval", "250", "--header", "A: 1", "--header", "B: 2",
        "--collect-metrics", "--request-intervals", str(tmp_path / "intervals.txt"), "--input-data", "random",
    ]  # fmt: skip


def test_sequence_and_request_data_keys_reach_the_sweep_spec(tmp_path: Path) -> None:
    s = scenario(
        """
[sweep]
sequence_length = 5
sequence-length-variation = 0
sequence_id_range = "100:200"
serial_sequences = true
request_rate_range = "10:10"
request_parameter = ["priority:2:int", "tag:x:string"]
string_length = 8
request_count = 40
""",
        tmp_path,
    )
    spec = spec_from_args(SWEEP.parse_args(command_argv(SWEEP, s.settings, "s")))
    sequences = spec.sequences
    assert sequences.enabled and sequences.serial and sequences.length == 5 and sequences.length_variation_pct == 0
    assert (sequences.start_id, sequences.id_range) == (100, 100)
    assert [p[0] for p in spec.inputs.request_parameters] == ["priority", "tag"]
    assert spec.inputs.string_length == 8 and spec.windows.request_limit == 40


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[sweep]\nconcurrency = 4\n", "'concurrency' is not an argument of this command (did you mean "),
        ("[sweep]\nquiet = 1\n", "quiet is a switch: write quiet = true or false"),
        ("[sweep]\nmodel_name = ['a', 'b']\n", "model_name takes one value, not a list"),
        ("[sweep]\nurl = 'x:1'\n", "url belongs under [server]"),
        ("colour = 'red'\n", "unknown key(s) colour"),
        ("command = 'bench'\n", "command = 'bench'; choose sweep or tune"),
        ("[server]\nurl = 'a:1'\nstart = 'reference'\n", "give url (a running server) or start"),
        ("[server]\nstart = 'tritonserver'\n", 'perfkit can start "reference"'),
        ("[gates]\nmax_throughput_drop = 'lots'\n", "max_throughput_drop takes a percentage"),
        ("[gates]\nmetrics = ['p42']\n", "metrics ['p42']: choose from throughput"),
        ("[gates]\nmin_throughput_at_slo = 10\n", "min_throughput_at_slo needs slo_p99_ms"),
        ("[gates]\nallow_unstable = 'yes'\n", "allow_unstable must be a bool"),
        ("[tune]\n", "command = 'sweep' but the file has a [tune] table"),
        ("name = \n", "not valid TOML"),
    ],
)
def test_errors_name_the_file_and_the_key(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(PerfkitError) as info:
        command_argv(SWEEP, scenario(text, tmp_path).settings, f"{tmp_path / 's.toml'} [sweep]")
    assert message in str(info.value)
    assert "s.toml" in str(info.value)


def test_paths_in_the_file_are_relative_to_it(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    s = scenario('[server]\nmodel_repository = "models"\n[gates]\nbaseline = "../b.json"\njunit = "out.xml"\n',
                 tmp_path / "sub")  # fmt: skip
    assert s.server.model_repository == str(tmp_path / "sub" / "models")
    assert s.server.needs_start
    assert s.gates.baseline == tmp_path / "b.json"
    assert s.gates.junit == Path("out.xml")  # outputs follow the working directory
    assert not parse_scenario({}, tmp_path / "x.toml").server.needs_start  # the sweep's embedded default


def test_the_command_line_wins_over_the_file() -> None:
    file_argv = ["--concurrency-range", "1:4", "--measurement-interval", "500", "--request-distribution", "constant"]
    merged = merge_argv(SWEEP, file_argv, ["-p", "200", "--request-rate-range=100:200"])
    # The file's --concurrency-range is dropped: the command line chose the other load flag; its
    # --measurement-interval too: the command line gives it again (as -p), and each flag is said once.
    assert merged == ["--request-distribution", "constant", "-p", "200", "--request-rate-range=100:200"]
    args = SWEEP.parse_args(merged)
    assert args.measurement_interval == 200.0 and args.request_rate_range == "100:200"
    assert args.concurrency_range is None
    repeatable = merge_argv(SWEEP, ["--shape", "a:1", "--report-dir", "x"], ["--shape", "b:2", "--report-dir", "y"])
    assert repeatable == ["--shape", "a:1", "--shape", "b:2", "--report-dir", "y"]  # repeatable flags add up


def test_run_echoes_each_flag_once(capsys: pytest.CaptureFixture[str]) -> None:
    smoke = ROOT / "scenarios" / "smoke.toml"
    assert main(["run", str(smoke), "--dry-run", "--concurrency-range", "1", "-r", "3", "--report-dir", "out"]) == 0
    command = capsys.readouterr().out.splitlines()[0]
    assert command.count("--concurrency-range") == 1 and command.count("--report-dir") == 1, command
    assert "--max-trials" not in command and command.endswith("--concurrency-range 1 -r 3 --report-dir out")


def test_run_dry_run_shows_the_resolved_command(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(ROOT / "scenarios" / "poisson_slo.toml"), "--dry-run", "-p", "300", "--seed", "7"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].endswith("--report-dir reports/poisson -p 300 --seed 7")
    assert "gate: p99 <= 25 ms at 400 infer/s or more" in out
    gate = ROOT / "scenarios" / "regression_gate.toml"
    assert main(["run", "--max-throughput-drop", "7%", str(gate), "--dry-run", "--metric", "p50", "p99"]) == 0
    assert "(p50, p99; throughput -7%, latency +10%)" in capsys.readouterr().out
    s = tmp_path / "repo.toml"
    s.write_text('[server]\nmodel_repository = "models"\n[sweep]\nconcurrency_range = "1"\n')
    assert main(["run", str(s), "--dry-run"]) == 0
    assert f"# start the reference server on {tmp_path / 'models'}" in capsys.readouterr().out
    assert main(["run", str(s), "--dry-run", "-u", "127.0.0.1:1"]) == 0
    assert "# start" not in capsys.readouterr().out
    assert main(["run", str(tmp_path / "missing.toml")]) == 2
    assert "cannot read scenario" in capsys.readouterr().err
    assert main(["run", str(ROOT / "scenarios" / "smoke.toml"), "--update-baseline", "--dry-run"]) == 2
    assert "--update-baseline: the scenario names no baseline" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('[sweep]\nconcurency_range = "1"\n', "'concurency_range' is not an argument of this command (did you mean "
         "'concurrency_range'?)"),
        ("[gates]\nslo_p99 = 3\n", "unknown key(s) slo_p99 (did you mean 'slo_p99_ms'?)"),
        ('comand = "sweep"\n', "unknown key(s) comand (did you mean 'command'?)"),
        ('[server]\nurls = "h:1"\n', "unknown key(s) urls (did you mean 'url'?)"),
    ],
)  # fmt: skip
def test_a_misspelt_key_gets_a_suggestion(
    text: str, words: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "s.toml"
    path.write_text(text)
    assert main(["run", str(path), "--dry-run"]) == 2
    assert words in capsys.readouterr().err
