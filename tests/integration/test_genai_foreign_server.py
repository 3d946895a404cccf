"""`perfkit sweep --endpoint-type chat|completions|embeddings` against an OpenAI-compatible server
that is not Triton (the scripted server's vLLM manners: no /v2 routes, GET /v1/models listing its
models, OpenAI's 404 for any other): an unknown -m is a usage error naming the server's words and
its models, a lone listed model is measured without -m, answers without usage are counted by
perfkit's tokenizer and said once, and a server whose usage counts words is said to have another
tokenizer, with both figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from perfkit.cli import main
from perfkit.errors import ExitCode
from perfkit.genai.endpoints import UsageTally
from perfkit.genai.records import usage_notes
from perfkit.genai.workload import GenerativeSpec
from perfkit.results.model import read_sweep
from perfkit.testing.genai_server import DEFAULT_TOKENS, serving_in_thread

pytestmark = [pytest.mark.integration]

# 250 ms windows, at most three: a level ends in about a second, measured and too short to be valid
WINDOWS = ["--concurrency-range", "2", "-p", "250", "-r", "3", "-s", "1000", "--no-report", "--num-prompts", "3"]


def _sweep(tmp_path: Path, url: str, *flags: str) -> int:
    return main(["sweep", "-u", url, *WINDOWS, "--report-dir", str(tmp_path), *flags])


@pytest.mark.parametrize("style", ["openai", "detail"])
def test_an_unknown_model_is_a_usage_error_naming_the_servers_words_and_its_models(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], style: str
) -> None:
    with serving_in_thread(models=("ok", "words"), not_found=style) as url:
        code = _sweep(tmp_path, url, "-m", "nope", "--endpoint-type", "completions", "--streaming")
    err = capsys.readouterr().err
    assert code == ExitCode.USAGE  # not a level of 404s and exit 4
    assert "-m nope: the server at" in err and "The model `nope` does not exist." in err
    assert "GET /v1/models lists ok, words" in err
    assert not list(tmp_path.glob("sweep-*"))  # nothing was measured


def test_embeddings_of_an_unknown_model_are_refused_the_same_way(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with serving_in_thread(models=("ok",)) as url:
        code = _sweep(tmp_path, url, "-m", "nope", "--endpoint-type", "embeddings")
    assert code == ExitCode.USAGE and "The model `nope` does not exist." in capsys.readouterr().err


def test_a_bare_404_names_the_endpoint_as_well_as_the_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # a route the server does not serve answers 404 too, without naming any model
    with serving_in_thread(models=("ok",)) as url:
        code = _sweep(tmp_path, url, "-m", "nope", "--endpoint-type", "completions", "--endpoint", "/v1/nothing")
    err = capsys.readouterr().err
    assert code == ExitCode.USAGE
    assert "POST /v1/nothing for -m nope: HTTP 404" in err and "check --endpoint-type (or --endpoint) and -m" in err
    assert "GET /v1/models lists ok" in err


def test_without_m_several_listed_models_are_named_for_m(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with serving_in_thread(models=("ok", "words")) as url:
        code = _sweep(tmp_path, url, "--endpoint-type", "chat")
    assert code == ExitCode.USAGE
    assert "the server has 2 ready models (ok, words); pick one with -m" in capsys.readouterr().err


def test_a_lone_model_is_measured_and_a_tokenizer_unlike_the_servers_is_said_with_both_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `words` counts words where perfkit counts bytes: 16-byte prompts of a few words, and
    # 4 output tokens of "t " each (8 bytes)
    with serving_in_thread(models=("words",)) as url:
        code = _sweep(tmp_path, url, "--endpoint-type", "completions", "--output-tokens-mean", "4",
                      "--synthetic-input-tokens-mean", "16")  # fmt: skip
    err = capsys.readouterr().err
    assert code == ExitCode.UNSTABLE  # measured, without errors; too short a level to be valid
    assert "no -m: measuring 'words', the only model the server lists (GET /v1/models)" in err
    [said] = [line for line in err.splitlines() if "differs from the server's" in line]
    assert said.startswith("the tokenizer (--tokenizer bytes) differs from the server's")
    assert "completion tokens per answer: 4.0 by the server's usage, 8.0 by bytes" in said
    assert "prompt tokens per answer:" in said and "16.0 by bytes" in said
    tokens = read_sweep(next(tmp_path.glob("sweep-*.json"))).levels[0].tokens
    assert tokens is not None and tokens.token_source == "bytes" and tokens.token_notes == (said,)
    assert tokens.output_tokens.mean == 8.0  # ISL/OSL stay --tokenizer's counts, as said


def test_answers_without_usage_are_counted_by_perfkits_tokenizer_and_said_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with serving_in_thread(models=("nousage",)) as url:
        code = _sweep(tmp_path, url, "-m", "nousage", "--endpoint-type", "chat", "--streaming",
                      "--tokenizer", "usage", "--concurrency-range", "1:2")  # fmt: skip
    err = capsys.readouterr().err
    assert code == ExitCode.UNSTABLE  # not a run of "usage missing" errors and exit 4
    assert err.count("--tokenizer usage: the server sent no usage figures") == 1  # two levels, said once
    levels = read_sweep(next(tmp_path.glob("sweep-*.json"))).levels
    assert len(levels) == 2 and all(lv.error_count == 0 for lv in levels)
    for level in levels:
        assert level.tokens is not None and level.tokens.token_source == "bytes"
        assert level.tokens.output_tokens.mean == DEFAULT_TOKENS  # one byte a token
        assert "counted by perfkit's tokenizer" in level.tokens.token_notes[0]


def _notes(endpoint_type: str, tokenizer: str, **tally: int) -> tuple[str, dict[str, str]]:
    return usage_notes(UsageTally(**tally), GenerativeSpec(endpoint_type, tokenizer=tokenizer))


def test_usage_within_the_margin_or_a_chat_template_is_no_mismatch() -> None:
    # an end-of-sequence token an answer, and 10 % apart: the same tokenizer
    assert _notes("completions", "bytes", with_usage=10, server_in=1000, own_in=1000, server_out=110,
                  own_out=100) == ("bytes", {})  # fmt: skip
    assert _notes("completions", "bytes", with_usage=10, server_in=1000, own_in=900, server_out=50,
                  own_out=50) == ("bytes", {})  # fmt: skip
    # a chat prompt's usage counts its template too: more prompt tokens than perfkit's is expected
    assert _notes("chat", "t.json", with_usage=10, server_in=2000, own_in=1000, server_out=50, own_out=50)[1] == {}
    # fewer by far is another tokenizer, on chat as anywhere
    assert (
        "prompt tokens per answer: 25.0 by the server's usage, 100.0 by t.json"
        in _notes("chat", "t.json", with_usage=10, server_in=250, own_in=1000, server_out=50, own_out=50)[1][
            "tokenizer differs"
        ]
    )
    # --tokenizer usage takes the server's counts: nothing to compare them with
    assert _notes("completions", "usage", with_usage=10, server_in=10, own_in=1000, server_out=5, own_out=50)[1] == {}
    # some answers with usage and some without: both sources named
    assert _notes("chat", "usage", with_usage=3, without_usage=2)[0] == "usage, else bytes"
