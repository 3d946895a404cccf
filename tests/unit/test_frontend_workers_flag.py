"""--frontend-workers N|auto: auto keeps one process on small machines; on larger ones it takes a
worker per instance of the largest model the workers could run (at most one per CPU and
AUTO_WORKERS_MAX), and at least half the CPUs up to AUTO_CORE_WORKERS_MAX; a number is taken as given."""

from __future__ import annotations

from pathlib import Path

import pytest

from reference_server.config import (
    AUTO_FRONTEND_WORKERS,
    AUTO_WORKERS_MAX,
    auto_frontend_workers,
    config_from_args,
)


@pytest.mark.parametrize(
    ("cpus", "counts", "workers"),
    [
        (1, (), 1), (2, (8,), 1), (3, (3,), 1),  # small machines: one process
        (4, (), 2), (8, (), 4), (64, (), 4), (8, (1, 2), 4),  # the core runs every model
        (8, (8,), 8), (8, (6, 1), 6), (8, (32,), 8), (64, (32,), 16), (16, (3,), 4),  # a worker per instance
    ],
)  # fmt: skip
def test_auto_by_usable_cpus_and_instance_counts(cpus: int, counts: tuple[int, ...], workers: int) -> None:
    assert auto_frontend_workers(cpus, counts) == workers
    assert auto_frontend_workers(cpus, counts) <= AUTO_WORKERS_MAX


def test_auto_is_the_default_and_is_chosen_at_start(tmp_path: Path) -> None:
    config = config_from_args(["--model-repository", str(tmp_path)])
    assert config.frontend_workers == AUTO_FRONTEND_WORKERS


def test_a_number_is_taken_as_given(tmp_path: Path) -> None:
    config = config_from_args(["--model-repository", str(tmp_path), "--frontend-workers", "3"])
    assert config.frontend_workers == 3


@pytest.mark.parametrize("value", ["two", "0", "65"])
def test_a_bad_value_names_the_flag(tmp_path: Path, value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        config_from_args(["--model-repository", str(tmp_path), "--frontend-workers", value])
    assert "--frontend-workers" in capsys.readouterr().err
