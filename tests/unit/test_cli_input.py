"""What the commands make of what they are given: -u and --metrics-url, perf_analyzer's own flags,
and their --help. Nothing here starts a server: every case ends at the flags."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from perfkit.cli import COMMANDS, main, sweep
from perfkit.cli.sweep.perf_analyzer import perf_analyzer_notes
from perfkit.errors import PerfkitError
from perfkit.sweep.spec import SweepSpec
from perfkit.target import checked_metrics_url, checked_url

MALFORMED_URLS = ["127.0.0.1:abc", "127.0.0.1:99999", ":8000", "foo:bar:baz", "[::1", "::1", "h:0", "ftp://h:1"]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().err


def _one_usage_line(code: int, err: str) -> None:
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith("error: -u ") or err.startswith("error: --metrics-url "), err


@pytest.mark.parametrize("url", MALFORMED_URLS)
def test_a_malformed_url_is_a_one_line_usage_error_in_every_command(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "m" / "config.pbtxt"
    config.parent.mkdir()
    config.write_text('name: "m"\nbackend: "python"\n')
    scenario = tmp_path / "s.toml"
    scenario.write_text(f'[server]\nurl = "{url}"\n[sweep]\nconcurrency_range = "1"\n')
    for argv in (["sweep", "-u", url], ["probe", "-u", url], ["tune", str(config), "-u", url], ["run", str(scenario)],
                 ["sweep", "-i", "grpc", "-u", url]):  # fmt: skip
        _one_usage_line(*_run(argv, capsys))


@pytest.mark.parametrize("url", ["h:abc", "http://:9", "ftp://h:1/metrics", "a:b:c"])
def test_a_malformed_metrics_url_is_a_one_line_usage_error(url: str, capsys: pytest.CaptureFixture[str]) -> None:
    _one_usage_line(*_run(["sweep", "-u", "h:1", "--collect-metrics", "--metrics-url", url], capsys))


def test_a_host_alone_means_the_protocols_default_port_not_80() -> None:
    def target_url(*flags: str) -> str | None:
        args = sweep.COMMAND.parser().parse_args(list(flags))
        return sweep.spec_from_args(args).target.url

    assert target_url("-u", "127.0.0.1") == "127.0.0.1:8000"
    assert target_url("-u", "127.0.0.1", "-i", "grpc") == "127.0.0.1:8001"
    assert target_url("-u", "a,b:9") == "a:8000,b:9"
    assert target_url("-u", "[::1]") == "[::1]:8000"
    assert target_url("-u", "https://h:9/prefix") == "https://h:9/prefix"
    assert target_url() is None  # the embedded server
    assert checked_url("http://h", "http") == "http://h"  # a URL's port is its scheme's
    assert checked_metrics_url("h") == "http://h:8002/metrics"  # perf_analyzer's default port and path
    assert checked_metrics_url("https://h:1/m") == "https://h:1/m"


# --------------------------------------------------------------------------------------------------
# perf_analyzer's command lines


def _sweep_spec(*flags: str) -> SweepSpec:
    return sweep.spec_from_args(sweep.COMMAND.parser().parse_args(list(flags)))


def test_perf_analyzer_flags_without_meaning_here_are_accepted_with_one_note() -> None:
    args = sweep.COMMAND.parser().parse_args(["-a", "--sync", "--max-threads", "8", "--service-kind", "triton"])
    sweep.spec_from_args(args)
    (note,) = perf_analyzer_notes(args)
    assert note.startswith("note: --async, --sync, --max-threads ignored: ") and "asyncio" in note
    assert perf_analyzer_notes(sweep.COMMAND.parser().parse_args([])) == []
    assert sweep.COMMAND.parser().parse_args(["--async"]).pa_async


def test_perf_analyzer_flags_that_map_reach_the_spec() -> None:
    spec = _sweep_spec("-v", "-v", "--verbose-csv", "--collect-metrics", "--metrics-interval", "500", "-u", "h:1")
    assert (spec.output.verbose, spec.output.verbose_csv) == (2, True)
    assert (spec.metrics.collect, spec.metrics.interval_ms) == (True, 500.0)
    openai = ("--service-kind", "openai", "-u", "h:9000")
    assert _sweep_spec(*openai, "--endpoint", "v1/chat/completions").genai.endpoint_type == "chat"
    assert _sweep_spec(*openai, "--endpoint", "/v1/completions").genai.endpoint_type == "completions"
    assert _sweep_spec(*openai, "--endpoint", "v1/embeddings").genai.endpoint_type == "embeddings"
    with pytest.raises(PerfkitError, match="--service-kind openai needs --endpoint"):
        _sweep_spec(*openai)


@pytest.mark.parametrize(
    ("flags", "words"),
    [
        (["--service-kind", "tfserving"], "argument --service-kind: 'tfserving' is not supported"),
        (["--service-kind", "triton_c_api"], "start tritonserver and give -u"),
        (["--service-kind", "nope"], "invalid choice: 'nope'"),
        (["--periodic-concurrency-range", "1:4:1", "--request-period", "5"], "use --concurrency-range"),
        (["--request-period", "5"], "argument --request-period: not supported"),
        (["--no-such-flag", "3"], "unrecognized arguments: --no-such-flag 3"),
    ],
)
def test_refused_flags_get_the_sweeps_own_usage(
    flags: list[str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["sweep", *flags])
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert err.startswith("usage: perfkit sweep ") and "perfkit sweep: error: " in err and words in err, err


def test_verbose_csv_writes_perf_analyzers_extra_columns(tmp_path: Path) -> None:
    from perfkit.sweep.run import SweepFiles
    from tests.synthetic import steady_sweep

    for flag, extra in (("--verbose-csv", True), ("--quiet", False)):
        files = SweepFiles(_sweep_spec(flag, "--report-dir", str(tmp_path / flag)), "m")
        files.save(steady_sweep(), None)
        header = files.pa_csv_path.read_text().splitlines()[0].split(",")
        assert ("Avg latency" in header and "request/response" in header and "response wait" in header) is extra


# --------------------------------------------------------------------------------------------------
# --help


def test_every_commands_help_says_each_default_and_never_none() -> None:
    for name, command in COMMANDS.items():
        parser = command.parser()
        text = parser.format_help()
        assert "(default: None)" not in text and "default: []" not in text and "default: False" not in text, name
        for action in parser._actions:
            if action.nargs == 0 or action.default in (None, "", [], argparse.SUPPRESS):
                continue
            assert "default" in (action.help or ""), f"perfkit {name} {action.option_strings}: no default in its help"
    helps = {a.dest: a.help or "" for a in sweep.COMMAND.parser()._actions}
    assert all("(default " in helps[dest] for dest in ("stability_percentage", "max_trials", "batch_size"))


def test_flags_sit_in_their_groups_not_under_options() -> None:
    for name in ("sweep", "tune"):
        parser = COMMANDS[name].parser()
        assert [a.dest for a in parser._optionals._group_actions] == ["help"], name
    load = next(g for g in sweep.COMMAND.parser()._action_groups if g.title == "load")
    dests = {a.dest for a in load._group_actions}
    assert {"latency_threshold", "binary_search", "request_distribution", "concurrency_range"} <= dests
