"""Server-side statistics: the statistics extension's cumulative counters, differenced over a
measurement, and perf_analyzer's split of the client latency into network and server parts.

Pure functions over the JSON of `GET v2/models/<model>[/versions/<v>]/stats` (one entry of
`model_stats`; server docs/protocol/extension_statistics.md). Counts and nanoseconds are
cumulative since the model version was loaded, so a measurement snapshots them before and after
and subtracts (perf_analyzer `SummarizeServerStatsHelper`). Fields may be missing (servers that
implement part of the extension) or, from gRPC JSON, be strings; both read as numbers, missing
ones as 0.

An ensemble (and a BLS model named with --bls-composing-models) is measured with its composing
models, as perf_analyzer does (`SummarizeServerStats`): `pick_tree` picks the entry of the model and
of each model it is composed of, recursively, from one statistics response, and `tree_diff`
differences each over the same span, the composing models' figures under the model's.

A counter that goes *down* means the model was reloaded between the snapshots and its counters
restarted. `server_diff` then takes `before` as zero and returns the counts since the reload,
which is the best figure available; `counters_reset` tells the caller so it can say so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from perfkit.results.model import ComposingStats, ServerStats

#: model name → the (name, version) of the models it is composed of; version "" is the server's choice.
ComposingMap = Mapping[str, Sequence[tuple[str, str]]]

_PHASES = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _duration(entry: Mapping[str, Any], phase: str) -> tuple[int, int]:
    d = _map(_map(entry.get("inference_stats")).get(phase))
    return _int(d.get("count")), _int(d.get("ns"))


def _version_number(entry: Mapping[str, Any]) -> int:
    version = str(entry.get("version", ""))
    return int(version) if version.isdigit() else -1


def _entries(stats_json: Mapping[str, Any] | None, model: str) -> list[Mapping[str, Any]]:
    if not stats_json:
        return []
    if "model_stats" not in stats_json:  # a single entry rather than a whole response
        return [stats_json] if stats_json.get("name") == model else []
    entries = stats_json.get("model_stats")
    if not isinstance(entries, list):
        return []
    return [e for e in entries if isinstance(e, Mapping) and e.get("name") == model]


def pick_model_stats(
    stats_json: Mapping[str, Any],
    model: str,
    version: str = "",
    previous: Mapping[str, Any] | None = None,
) -> dict[str, Any] | None:
    """The statistics-extension entry of `model` in a full statistics response, or None.

    With a version, that version's entry. Without one and several versions loaded, perf_analyzer's
    rule (`DetermineStatsModelVersion`): the highest version whose queue count changed since
    `previous`, an earlier full response; when none changed, or without `previous`, the highest
    version. "Changed" rather than perf_analyzer's "increased", so a reloaded version is found too.
    `previous` may also be a single entry (the one picked last time): then only that version can
    be judged, and the others count as unchanged."""
    entries = _entries(stats_json, model)
    if version:
        return next((dict(e) for e in entries if str(e.get("version", "")) == version), None)
    if not entries:
        return None
    if previous is not None and len(entries) > 1:
        before = {str(e.get("version", "")): _duration(e, "queue")[0] for e in _entries(previous, model)}
        absent = 0 if "model_stats" in previous else None  # a version new since a full response moved from 0

        def moved(e: Mapping[str, Any]) -> bool:
            then = before.get(str(e.get("version", "")), absent)
            return then is not None and _duration(e, "queue")[0] != then

        changed = [e for e in entries if moved(e)]
        if changed:
            entries = changed
    best: Mapping[str, Any] = max(entries, key=_version_number)
    return dict(best)


def counters_reset(before: Mapping[str, Any], after: Mapping[str, Any]) -> bool:
    """Whether any cumulative counter went down between the snapshots (the model was reloaded)."""
    if any(_int(after.get(k)) < _int(before.get(k)) for k in ("inference_count", "execution_count")):
        return True
    return any(_duration(after, phase)[i] < _duration(before, phase)[i] for phase in _PHASES for i in (0, 1))


def _batch_executions(entry: Mapping[str, Any]) -> dict[int, int]:
    """Batch size → executions of that size, from `batch_stats` (its compute_infer count)."""
    sizes: dict[int, int] = {}
    batch_stats = entry.get("batch_stats")
    for item in batch_stats if isinstance(batch_stats, list) else []:
        if isinstance(item, Mapping) and _int(item.get("batch_size")) > 0:
            sizes[_int(item["batch_size"])] = _int(_map(item.get("compute_infer")).get("count"))
    return sizes


def _avg_us(count: int, ns: int) -> float:
    return ns / count / 1e3 if count > 0 else 0.0


def server_diff(before: Mapping[str, Any] | None, after: Mapping[str, Any]) -> ServerStats:
    """What the server did between two snapshots of one model version's entry.

    Averages are in µs, each phase's ns over its own count. `avg_batch_size` is
    inference_count / execution_count; `overhead_us` = request − queue − compute, floored at 0, as
    perf_analyzer reports it. `before` None, or a reset (see `counters_reset`), counts from zero."""
    if before is None or counters_reset(before, after):
        before = {}
    phases = {p: tuple(a - b for a, b in zip(_duration(after, p), _duration(before, p))) for p in _PHASES}
    inferences = _int(after.get("inference_count")) - _int(before.get("inference_count"))
    executions = _int(after.get("execution_count")) - _int(before.get("execution_count"))
    request_us = _avg_us(*phases["success"])
    queue_us = _avg_us(*phases["queue"])
    compute_input_us = _avg_us(*phases["compute_input"])
    compute_infer_us = _avg_us(*phases["compute_infer"])
    compute_output_us = _avg_us(*phases["compute_output"])
    earlier = _batch_executions(before)
    batch_sizes = {
        size: count - earlier.get(size, 0)
        for size, count in sorted(_batch_executions(after).items())
        if count - earlier.get(size, 0) > 0
    }
    return ServerStats(
        success_count=phases["success"][0],
        fail_count=phases["fail"][0],
        inference_count=inferences,
        execution_count=executions,
        avg_batch_size=inferences / executions if executions > 0 else 0.0,
        request_us=request_us,
        queue_us=queue_us,
        compute_input_us=compute_input_us,
        compute_infer_us=compute_infer_us,
        compute_output_us=compute_output_us,
        overhead_us=max(request_us - queue_us - compute_input_us - compute_infer_us - compute_output_us, 0.0),
        batch_sizes=batch_sizes,
    )


def network_server_us(
    avg_latency_us: float, client_send_us: float, client_recv_us: float, server: ServerStats
) -> float:
    """perf_analyzer's "Network+Server Send/Recv": the client's average latency less its own send
    and receive time and the server's queue and compute averages, floored at 0 (report_writer.cc;
    no response cache here, so its hit/miss terms are left out)."""
    accounted = server.queue_us + server.compute_input_us + server.compute_infer_us + server.compute_output_us
    return max(avg_latency_us - client_send_us - client_recv_us - accounted, 0.0)


def ensemble_steps(config: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The (model, version) of each step of an ensemble's config (the JSON of the model
    configuration endpoint), once each and in step order; [] for a model that is not an ensemble.
    A step's version -1 (the server's choice) is "" (perf_analyzer's `AddEnsembleComposingModels`)."""
    if config.get("platform") != "ensemble":
        return []
    steps = _map(config.get("ensemble_scheduling")).get("step")
    found: list[tuple[str, str]] = []
    for step in steps if isinstance(steps, list) else []:
        name = str(_map(step).get("model_name", ""))
        number = _int(_map(step).get("model_version", -1))
        model = (name, "" if number < 0 else str(number))
        if name and model not in found:
            found.append(model)
    return found


def pick_tree(
    stats_json: Mapping[str, Any],
    model: str,
    version: str,
    composing: ComposingMap,
    previous: Mapping[str, Any] | None = None,
) -> dict[str, dict[str, Any]] | None:
    """The entries of `model` and of every model it is composed of (through `composing`,
    recursively), by name, each picked as `pick_model_stats` picks one; None when `model` has no
    entry. A composing model without an entry is left out (a response-cache hit on the ensemble
    ran none of its steps)."""
    top = pick_model_stats(stats_json, model, version, previous)
    if top is None:
        return None
    picked = {model: top}
    pending = list(composing.get(model, ()))
    while pending:
        name, wanted = pending.pop(0)
        if name in picked:
            continue
        entry = pick_model_stats(stats_json, name, wanted, previous)
        if entry is not None:
            picked[name] = entry
            pending.extend(composing.get(name, ()))
    return picked


def tree_diff(
    before: Mapping[str, Mapping[str, Any]] | None,
    after: Mapping[str, Mapping[str, Any]],
    model: str,
    composing: ComposingMap,
) -> ServerStats:
    """`server_diff` of `model` between two `pick_tree` snapshots, with each composing model's own
    difference under it, sorted by name as perf_analyzer lists them."""
    return _tree_diff(before or {}, after, model, composing, frozenset())


def _tree_diff(
    before: Mapping[str, Mapping[str, Any]],
    after: Mapping[str, Mapping[str, Any]],
    model: str,
    composing: ComposingMap,
    above: frozenset[str],
) -> ServerStats:
    stats = server_diff(before.get(model), after[model])
    names = sorted({name for name, _ in composing.get(model, ()) if name in after and name not in above | {model}})
    children = tuple(
        ComposingStats(name, str(after[name].get("version", "")),
                       _tree_diff(before, after, name, composing, above | {model}))
        for name in names
    )  # fmt: skip
    return dataclasses.replace(stats, composing=children)
