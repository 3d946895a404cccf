"""The custom metric registry (`backends/custom_metrics.py`) and how the metrics endpoint prints it:
Triton core's rules and words, prometheus-cpp's lines, and labels in Triton's order."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from reference_server.backends.custom_metrics import COUNTER, GAUGE, HISTOGRAM, CustomMetrics, MetricError
from reference_server.frontends.metrics import custom_families, model_families, render_exposition
from reference_server.scheduling.stats import ModelStats


def _text(metrics: CustomMetrics) -> str:
    return render_exposition(custom_families(metrics))


def test_counter_gauge_and_histogram_print_as_triton_prints_them() -> None:
    metrics = CustomMetrics()
    counter = metrics.family_new("a", "requests_seen", "Requests seen", COUNTER)
    gauge = metrics.family_new("a", "queue_depth", "Queue depth", GAUGE)
    histogram = metrics.family_new("a", "latency_ms", "Latency", HISTOGRAM)
    seen = metrics.metric_new("a", counter, {"zeta": "2", "alpha": 'q"\\\n'}, None)
    depth = metrics.metric_new("a", gauge, {}, None)
    latency = metrics.metric_new("a", histogram, {"model": "m"}, [1.0, 2.5, 10])
    metrics.increment(seen, 2)
    metrics.increment(depth, -3)
    metrics.set(depth, 7.5)
    for value in (1.0, 1.5, 100):
        metrics.observe(latency, value)
    assert metrics.value(seen) == 2 and metrics.value(depth) == 7.5
    assert _text(metrics) == (
        "# HELP requests_seen Requests seen\n# TYPE requests_seen counter\n"
        'requests_seen{alpha="q\\"\\\\\\n",zeta="2"} 2\n'
        "# HELP queue_depth Queue depth\n# TYPE queue_depth gauge\nqueue_depth 7.5\n"
        "# HELP latency_ms Latency\n# TYPE latency_ms histogram\n"
        'latency_ms_count{model="m"} 3\nlatency_ms_sum{model="m"} 102.5\n'
        'latency_ms_bucket{model="m",le="1"} 1\nlatency_ms_bucket{model="m",le="2.5"} 2\n'
        'latency_ms_bucket{model="m",le="10"} 2\nlatency_ms_bucket{model="m",le="+Inf"} 3\n'
    )


def test_misuse_is_refused_in_core_words() -> None:
    metrics = CustomMetrics()
    counter = metrics.family_new("a", "c", "C", COUNTER)
    histogram = metrics.family_new("a", "h", "H", HISTOGRAM)
    count = metrics.metric_new("a", counter, {"k": "v"}, None)
    observed = metrics.metric_new("a", histogram, {}, [1.0])
    cases: list[tuple[Callable[[], object], str]] = [
        (lambda: metrics.increment(count, -1),
         "TRITONSERVER_METRIC_KIND_COUNTER can only be incremented monotonically by non-negative values."),
        (lambda: metrics.set(count, 1), "TRITONSERVER_METRIC_KIND_COUNTER does not support Set"),
        (lambda: metrics.observe(count, 1), "TRITONSERVER_METRIC_KIND_COUNTER does not support Observe"),
        (lambda: metrics.value(observed), "TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Value"),
        (lambda: metrics.increment(observed, 1), "TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Increment"),
        (lambda: metrics.family_new("a", "c", "C", GAUGE), "Family name already exists with different type"),
        (lambda: metrics.family_new("a", "bad-name", "C", GAUGE), "Invalid metric name"),
        (lambda: metrics.metric_new("a", counter, {"bad label": "x"}, None), "Invalid label name"),
        (lambda: metrics.metric_new("a", counter, {"__reserved": "x"}, None), "Invalid label name"),
        (lambda: metrics.metric_new("a", histogram, {"le": "1"}, [1.0]), "Invalid label name"),
        (lambda: metrics.metric_new("a", counter, {"k": 1}, None),  # type: ignore[dict-item]
         "attempt to access JSON non-string as string"),
        (lambda: metrics.metric_new("a", histogram, {}, [2.0, 1.0]), "Bucket Boundaries must be strictly sorted"),
        (lambda: metrics.metric_new("a", histogram, {}, None), "Bucket boundaries not found in Metric args."),
    ]  # fmt: skip
    for call, words in cases:
        with pytest.raises(MetricError) as caught:
            call()
        assert str(caught.value) == words


def test_same_name_is_one_family_and_same_labels_one_series() -> None:
    metrics = CustomMetrics()
    first = metrics.family_new("a", "c", "first help", COUNTER)
    again = metrics.family_new("b", "c", "other help", COUNTER)  # kept: the first description
    one = metrics.metric_new("a", first, {"k": "v"}, None)
    two = metrics.metric_new("b", again, {"k": "v"}, None)
    metrics.increment(one, 1)
    metrics.increment(two, 2)
    assert metrics.value(one) == metrics.value(two) == 3
    assert _text(metrics) == '# HELP c first help\n# TYPE c counter\nc{k="v"} 3\n'
    metrics.release("a")  # the series lives while another owner holds it
    assert 'c{k="v"} 3' in _text(metrics)
    metrics.release("b")
    assert _text(metrics) == "\n" and len(metrics) == 0


def test_an_owner_going_takes_its_families_and_a_deleted_metric_its_series() -> None:
    metrics = CustomMetrics()
    family = metrics.family_new("stub-1", "g", "G", GAUGE)
    kept = metrics.metric_new("stub-1", family, {"k": "kept"}, None)
    dropped = metrics.metric_new("stub-1", family, {"k": "dropped"}, None)
    metrics.metric_delete(dropped)
    assert 'g{k="kept"} 0' in _text(metrics) and "dropped" not in _text(metrics)
    with pytest.raises(MetricError, match="Metric has been invalidated"):
        metrics.set(dropped, 1)
    other = metrics.family_new("stub-2", "other", "O", COUNTER)
    metrics.metric_new("stub-2", other, {}, None)
    metrics.release("stub-1")
    assert len(metrics) == 1 and "# TYPE g" not in _text(metrics)
    with pytest.raises(MetricError, match="invalidated"):
        metrics.value(kept)
    # The name is free again, even for another kind.
    metrics.family_new("stub-3", "g", "G", COUNTER)


def test_nv_labels_print_sorted_by_name_as_triton_prints_them() -> None:
    text = render_exposition(model_families([("m", "1", ModelStats())]))
    assert 'nv_inference_request_success{model="m",version="1"} 0' in text
    assert 'nv_inference_request_failure{model="m",reason="REJECTED",version="1"} 0' in text
