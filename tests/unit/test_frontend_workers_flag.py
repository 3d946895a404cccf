"""--frontend-workers N|auto: auto keeps one process on small machines and takes one worker per
CPU, at most AUTO_WORKERS_MAX, on larger ones; a number is taken as given."""

from __future__ import annotations

from pathlib import Path

import pytest

from reference_server.config import AUTO_WORKERS_MAX, auto_frontend_workers, config_from_args
from v2kit.runtime.cpus import usable_cpus


@pytest.mark.parametrize(("cpus", "workers"), [(1, 1), (2, 1), (3, 1), (4, 4), (6, 6), (8, 8), (16, 16), (64, 16)])
def test_auto_by_usable_cpus(cpus: int, workers: int) -> None:
    assert auto_frontend_workers(cpus) == workers
    assert auto_frontend_workers(cpus) <= AUTO_WORKERS_MAX


def test_auto_is_the_default_and_follows_this_process_cpus(tmp_path: Path) -> None:
    config = config_from_args(["--model-repository", str(tmp_path)])
    assert config.frontend_workers == auto_frontend_workers(usable_cpus())


def test_a_number_is_taken_as_given(tmp_path: Path) -> None:
    config = config_from_args(["--model-repository", str(tmp_path), "--frontend-workers", "3"])
    assert config.frontend_workers == 3


@pytest.mark.parametrize("value", ["two", "0", "65"])
def test_a_bad_value_names_the_flag(tmp_path: Path, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        config_from_args(["--model-repository", str(tmp_path), "--frontend-workers", value])
    assert "--frontend-workers" in capsys.readouterr().err
