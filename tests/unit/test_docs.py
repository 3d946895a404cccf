"""The README as a front page and the docs/ pages behind it: short, its first code block the two
commands a newcomer runs (and the ones .ci/run runs), links that resolve, examples whose paths exist,
and the generated pages (docs/cli.md, docs/figures.md's catalogue) equal to what the code renders."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from perfkit.cli import COMMANDS, build_parser, reference

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = [README, ROOT / "bench" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
QUICK_START = (
    "python3 -m venv .venv && . .venv/bin/activate && pip install -e . && perfkit sweep --concurrency-range 1:8"
)
TEST_COMMAND = ". .venv/bin/activate && pip install -e '.[test]' && python -m pytest -q -n logical --dist loadfile"


def _first_code_block(text: str) -> list[str]:
    found = re.search(r"^```\w*\n(.*?)^```", text, re.S | re.M)
    assert found is not None, "README.md has no code block"
    return [line for line in found.group(1).splitlines() if line.strip() and not line.startswith("#")]


def test_the_readme_is_read_in_five_minutes() -> None:
    lines = README.read_text().count("\n")
    assert lines <= 300, f"README.md has {lines} lines: move the reference into a docs/ page (at most 300)"


def test_the_first_code_block_is_the_quick_start_then_the_tests() -> None:
    commands = _first_code_block(README.read_text())
    assert len(commands) == 2, commands
    assert commands[0].startswith(QUICK_START), commands[0]
    # The quick start installs only what the main job needs: no extras.
    assert "[" not in commands[0].split("&& perfkit")[0]
    assert commands[1] == TEST_COMMAND


def test_ci_installs_the_project_as_the_readme_says() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    installs = [re.sub(r"\s-q\b", "", line.strip()) for line in ci.splitlines() if line.strip().startswith("pip ")]
    assert installs[:2] == ["pip install -e .", "pip install -e '.[test]'"], installs
    commands = _first_code_block(README.read_text())
    assert all(install in " ".join(commands) for install in installs[:2])


def test_the_cli_reference_is_current() -> None:
    assert (ROOT / "docs" / "cli.md").read_text() == reference.render_cli_reference(), (
        "docs/cli.md is stale: regenerate it with `python -m perfkit.cli.reference --write`"
    )


def test_the_figures_catalogue_is_current() -> None:
    page = (ROOT / "docs" / "figures.md").read_text()
    assert reference.with_figures_table(page) == page, (
        "docs/figures.md's catalogue is stale: regenerate it with `python -m perfkit.cli.reference --write`"
    )


def test_the_generator_writes_both_pages(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "figures.md").write_text(f"intro\n{reference.FIGURES_START}old\n{reference.FIGURES_END}\nafter\n")
    assert reference.main(["--write", "--docs", str(tmp_path)]) == 0
    assert (tmp_path / "cli.md").read_text() == reference.render_cli_reference()
    figures = (tmp_path / "figures.md").read_text()
    assert "old" not in figures and "| `p99_ms` | ms | lower |" in figures and figures.endswith("\nafter\n")
    assert reference.main([]) == 0
    assert capsys.readouterr().out == reference.render_cli_reference()


def test_the_cli_reference_lists_every_flag_of_every_command() -> None:
    page = reference.render_cli_reference()
    for name, command in COMMANDS.items():
        assert f"## perfkit {name}\n" in page
        for action in command.parser()._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert f"`{flag}`" in page, f"perfkit {name} {flag} is missing from docs/cli.md"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path) -> None:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0]
        assert (page.parent / path).exists(), f"{page.relative_to(ROOT)} links to {target}, which does not exist"


def test_tune_examples_name_configs_the_demo_build_creates(demo_repository: Path) -> None:
    # `python -m v2kit.demo demo_models` is build_demo_repository("demo_models"): demo_repository is one.
    configs = set()
    for page in (README, ROOT / "docs" / "tune.md"):
        text = page.read_text()
        assert "python -m v2kit.demo demo_models" in text, f"{page.name} does not say how to build demo_models"
        examples = "".join(re.findall(r"^\s*```\w*\n(.*?)^\s*```", text, re.S | re.M))
        for line in re.findall(r"perfkit tune [^\n]*", examples):
            for path in re.findall(r"\S+\.pbtxt", line):
                assert path.startswith(("demo_models/", "my_models/")), f"{page.name}: {path} is not a demo path"
                if path.startswith("demo_models/"):
                    configs.add(path.removeprefix("demo_models/"))
    assert "mlp/config.pbtxt" in configs
    missing = sorted(c for c in configs if not (demo_repository / c).is_file())
    assert not missing, f"the tune examples name configs the demo build does not create: {missing}"


def test_every_server_flag_is_documented() -> None:
    # perfkit-server's parser is the reference server's (perfkit never imports it, so docs/cli.md
    # cannot list it): its flags are in docs/server.md's tables and docs/reliability.md's.
    from reference_server.config import build_parser

    pages = (ROOT / "docs" / "server.md").read_text() + (ROOT / "docs" / "reliability.md").read_text()
    flags = [flag for action in build_parser()._actions for flag in action.option_strings if flag.startswith("--")]
    missing = [flag for flag in flags if f"`{flag}" not in pages and flag != "--help"]
    assert not missing, f"perfkit-server flags not in docs/server.md or docs/reliability.md: {missing}"


def _examples(page: Path) -> list[str]:
    """The `perfkit ...` command lines of a page's code blocks, continuations joined, comments and
    [optional] parts left out."""
    blocks = re.findall(r"^\s*```\w*\n(.*?)^\s*```", page.read_text(), re.S | re.M)
    lines = "\n".join(blocks).replace("\\\n", " ").splitlines()
    commands = [re.split(r"\s+#\s", line.strip())[0] for line in lines if line.strip().startswith("perfkit ")]
    return [re.sub(r"\[[^\]]*--[^\]]*\]", "", command) for command in commands]


HAND_WRITTEN = [README, *(p for p in sorted((ROOT / "docs").glob("*.md")) if p.name != "cli.md")]


@pytest.mark.parametrize("page", HAND_WRITTEN, ids=lambda p: p.name)
def test_the_examples_parse(page: Path) -> None:
    for command in _examples(page):
        try:
            build_parser().parse_args(shlex.split(command)[1:])
        except SystemExit:
            pytest.fail(f"{page.name}: `{command}` no longer parses")


def test_ci_runs_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    pytest_lines = [line.strip() for line in ci.splitlines() if line.strip().startswith("python -m pytest")]
    readme_pytest = TEST_COMMAND.split("&& ")[-1]
    assert pytest_lines and pytest_lines[0].replace(" -p no:cacheprovider", "") == readme_pytest, pytest_lines
