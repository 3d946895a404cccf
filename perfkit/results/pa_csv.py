"""perf_analyzer's `-f` CSV read back as a sweep, so that `perfkit compare` gates on the files users keep.

The layout is `report.export.render_pa_csv`'s, which is perf_analyzer's own (`report_writer.cc`,
checked against perf_analyzer 2.48.0): a header whose first column is `Concurrency` or `Request
Rate`, then `Inferences/Second`, client and server times and `pNN latency` columns in integer µs,
`Avg latency` in verbose CSVs only, one row per level. perf_analyzer writes its own CSVs and
perfkit's `-f` writes the same, so both read here.

Such a file holds one figure per level and metric, not the per-window samples a perfkit JSON result
keeps: the sweep it becomes has no windows and says so in its provenance (`per_window_samples`),
and `perfkit compare` then gates on thresholds alone. Statistics the file does not hold (p99.9, the
latency from the intended send time, the mean of a non-verbose CSV, the p99 confidence interval)
are NaN, which compare reports as not measured, never as zero. The model and batch size are not in
the file: the model is left empty and the batch size is 1 (compare adopts the other run's).

For an ensemble (or --bls-composing-models) perf_analyzer writes, beside `NAME.csv`, one
`MODEL_vVERSION.NAME.csv` per composing model: the level, its share of the throughput, and its
server-side breakdown (`report.export.render_composing_csvs` writes the same). `composing_csvs`
finds them and `sweep_from_pa_csv` puts each row under its level's server figures.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import re
from collections.abc import Sequence
from pathlib import Path

from perfkit.errors import PerfkitError
from perfkit.results.model import ComposingStats, LatencyStats, LevelResult, ResourceUsage, ServerStats, SweepResult

__all__ = ["PA_CSV_FORMAT", "composing_csvs", "has_window_samples", "sweep_from_pa_csv"]

#: The provenance `source_format` of a sweep read from a perf_analyzer CSV.
PA_CSV_FORMAT = "perf_analyzer csv"

_LEVEL_COLUMNS = {"Concurrency": "concurrency", "Request Rate": "request_rate"}
_PERCENTILE = re.compile(r"^p(\d+(?:\.\d+)?) latency$")
_EXPECTED = (
    "a perf_analyzer -f CSV (header starting with Concurrency or Request Rate, then Inferences/Second, "
    "..., p50 latency, ..., p99 latency) or a perfkit JSON result"
)
_SERVER_COLUMNS = ("Server Queue", "Server Compute Input", "Server Compute Infer", "Server Compute Output")


def has_window_samples(result: SweepResult) -> bool:
    """Whether the sweep kept per-window samples (a JSON result) or not (read from a CSV)."""
    return bool(result.provenance.get("per_window_samples", True))


def _number(row: dict[str, str], column: str, where: str) -> float:
    text = (row.get(column) or "").strip()
    try:
        value = float(text)
    except ValueError:
        raise PerfkitError(f"{where}: column '{column}' holds '{text}', not a number") from None
    if not math.isfinite(value):
        raise PerfkitError(f"{where}: column '{column}' holds '{text}', not a finite number")
    return value


def _optional(row: dict[str, str], column: str, where: str) -> float:
    return _number(row, column, where) if column in row else math.nan


def _level(row: dict[str, str], mode: str, level_column: str, percentiles: dict[float, str], where: str) -> LevelResult:
    level = _number(row, level_column, where)
    throughput = _number(row, "Inferences/Second", where)
    by_p = {p: _number(row, column, where) for p, column in percentiles.items()}
    standard = {50.0, 90.0, 95.0, 99.0}
    custom = next((p for p in by_p if p not in standard), None)
    latency = LatencyStats(
        count=1,  # unknown; the file only says that requests succeeded (a level with none has no row)
        mean_us=_optional(row, "Avg latency", where),
        std_us=math.nan,
        min_us=math.nan,
        max_us=math.nan,
        p50_us=by_p.get(50.0, math.nan),
        p90_us=by_p.get(90.0, math.nan),
        p95_us=by_p.get(95.0, math.nan),
        p99_us=by_p.get(99.0, math.nan),
        p999_us=math.nan,
        p99_ci_low_us=math.nan,
        p99_ci_high_us=math.nan,
        custom_percentile=custom,
        custom_us=None if custom is None else by_p[custom],
    )
    server = None
    if all(column in row for column in _SERVER_COLUMNS):
        queue, c_in, c_infer, c_out = (_number(row, column, where) for column in _SERVER_COLUMNS)
        server = ServerStats(queue_us=queue, compute_input_us=c_in, compute_infer_us=c_infer, compute_output_us=c_out)
    return LevelResult(
        mode=mode,
        level=level,
        batch_size=1,
        stable=True,  # perf_analyzer writes a row only for a level that stabilised (or that it reports anyway)
        duration_s=math.nan,
        request_count=0,
        ok_count=0,
        error_count=0,
        errors={},
        throughput_infer_per_s=throughput,
        throughput_ci_low=math.nan,
        throughput_ci_high=math.nan,
        send_rate_per_s=math.nan,
        latency=latency,
        latency_from_intended=LatencyStats(),  # count 0: not measured
        delayed_pct=math.nan,
        max_send_lag_us=math.nan,
        client_send_us=_optional(row, "Client Send", where),
        client_recv_us=_optional(row, "Client Recv", where),
        network_server_us=_optional(row, "Network+Server Send/Recv", where),
        server=server,
        resources=ResourceUsage(notes=("read from a perf_analyzer CSV",)),
        windows=(),
        checks=(),
    )


_COMPOSING_FILE = re.compile(r"^(?P<model>.+)_v(?P<version>\d*)\.(?P<main>.+)$")
_COMPOSING_OVERHEAD = "Network+Server Send/Recv"


def composing_csvs(path: Path) -> list[tuple[str, str, str]]:
    """(model, version, text) of the composing models' CSVs perf_analyzer wrote beside the CSV at
    `path` (`MODEL_vVERSION.<its name>`), sorted by model."""
    found = []
    for sibling in sorted(path.parent.iterdir()) if path.parent.is_dir() else ():
        match = _COMPOSING_FILE.match(sibling.name)
        if match and match["main"] == path.name and sibling.is_file():
            found.append((match["model"], match["version"], sibling.read_text(encoding="utf-8")))
    return found


def _composing_rows(model: str, version: str, text: str, source: Path | str) -> dict[float, ServerStats]:
    where = f"{source}: composing model {model}'s CSV"
    rows = list(csv.reader(io.StringIO(text.lstrip("\ufeff"))))
    header = [cell.strip() for cell in rows[0]] if rows else []
    needed = (_COMPOSING_OVERHEAD, *_SERVER_COLUMNS)
    if not header or header[0] not in _LEVEL_COLUMNS or any(column not in header for column in needed):
        raise PerfkitError(f"{where} has the header {header}; expected perf_analyzer's composing-model layout "
                           f"({', '.join(needed)})")  # fmt: skip
    by_level = {}
    for number, cells in enumerate(rows[1:], start=2):
        row = dict(zip(header, (cell.strip() for cell in cells)))
        here = f"{where}, line {number}"
        overhead, queue, c_in, c_infer, c_out = (_number(row, column, here) for column in needed)
        request = overhead + queue + c_in + c_infer + c_out
        by_level[_number(row, header[0], here)] = ServerStats(
            request_us=request, queue_us=queue, compute_input_us=c_in, compute_infer_us=c_infer,
            compute_output_us=c_out, overhead_us=overhead,
        )  # fmt: skip
    return by_level


def _with_composing(level: LevelResult, composing: list[ComposingStats]) -> LevelResult:
    server = level.server or ServerStats()
    return dataclasses.replace(level, server=dataclasses.replace(server, composing=tuple(composing)))


def sweep_from_pa_csv(text: str, source: Path | str, composing: Sequence[tuple[str, str, str]] = ()) -> SweepResult:
    """The levels of a perf_analyzer `-f` CSV as a sweep without per-window samples, with the
    composing models' rows (`composing_csvs`) under each level's server figures. Raises
    PerfkitError naming `source` and the expected layout when the text is not such a CSV."""
    lines = text.lstrip("\ufeff").splitlines()
    # perf_analyzer follows an ensemble's rows with a blank line and its composing models' sections.
    block = lines[: lines.index("")] if "" in lines else lines
    rows = list(csv.reader(io.StringIO("\n".join(block))))
    header = [cell.strip() for cell in rows[0]] if rows else []
    level_column = header[0] if header else ""
    if level_column not in _LEVEL_COLUMNS or "Inferences/Second" not in header:
        first = (lines[0][:60] + "...") if lines and len(lines[0]) > 60 else (lines[0] if lines else "(empty)")
        hint = " (that is perfkit's tidy CSV)" if level_column in ("schema_version", "run_id") else ""
        raise PerfkitError(f"{source} is not a result compare can read{hint}: its first line is '{first}'; "
                           f"expected {_EXPECTED}")  # fmt: skip
    percentiles = {float(m.group(1)): column for column in header if (m := _PERCENTILE.match(column))}
    if not percentiles:
        hint = ""
        if _COMPOSING_FILE.match(Path(source).name) and _COMPOSING_OVERHEAD in header:
            hint = " (it is a composing model's CSV; give the ensemble's, which is read with it)"
        raise PerfkitError(f"{source}: a perf_analyzer CSV has 'pNN latency' columns and this one has none{hint}; "
                           f"expected {_EXPECTED}")  # fmt: skip
    mode = _LEVEL_COLUMNS[level_column]
    levels = []
    for number, cells in enumerate(rows[1:], start=2):
        if len(cells) != len(header):
            raise PerfkitError(f"{source}, line {number}: {len(cells)} cells under a header of {len(header)} columns")
        row = dict(zip(header, (cell.strip() for cell in cells)))
        levels.append(_level(row, mode, level_column, percentiles, f"{source}, line {number}"))
    if not levels:
        raise PerfkitError(f"{source}: a perf_analyzer CSV header without rows; the run measured no level")
    if composing:
        tables = [(model, version, _composing_rows(model, version, body, source)) for model, version, body in composing]
        levels = [
            _with_composing(level, [ComposingStats(m, v, rows[level.level]) for m, v, rows in tables if level.level in rows])
            for level in levels
        ]  # fmt: skip
    provenance = {"source": str(source), "source_format": PA_CSV_FORMAT, "per_window_samples": False}
    return SweepResult("", "", "", "", mode, tuple(levels), provenance)
