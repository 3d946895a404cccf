"""Custom metrics from model.py (`pb_utils.MetricFamily`, python_backend README "Custom Metrics"): what
a model registers is listed on the metrics port in Prometheus' text beside the `nv_*` families.

- A counter, a gauge and a histogram print the same lines on tritonserver 2.51 and on ours: HELP and
  TYPE, labels sorted by name (the `nv_*` ones too), a histogram's `_count`, `_sum` and `_bucket`
  lines with "le" last.
- On ours only, since tritonserver 2.51 may abort (boost lock_exception, the whole server) on any
  refused metric call (2 runs in 8 for the bad label at load below; most calls from `execute`): a
  model whose `initialize` registers a metric with a bad label fails to load with Triton's words
  (those of the runs where 2.51 did not abort), and the server serves the others; a bad label in
  `execute` fails that request with Triton's words; misuse (a negative counter increment, `set` on a
  counter, `observe` on a gauge, another kind for a registered name, a histogram without buckets...)
  raises TritonModelException with core's words; and an unloaded model's families leave the metrics
  port (Triton 2.51 keeps them until the model deletes its MetricFamily objects), as does a Metric
  the model drops.
- With `--frontend-workers 2` the core, where python models run, lists them on the metrics port.
"""

from __future__ import annotations

import json
import shutil
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from reference_server.server import running_server
from tests.servers import http_client, loopback_config, running_triton

pytestmark = [pytest.mark.integration]

COUNTED = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        labels = {"version": args["model_version"], "model": args["model_name"]}
        kind = pb_utils.MetricFamily
        # The families are kept: on Triton a family that is garbage-collected invalidates its metrics.
        self.families = [
            kind(name="counted_requests", description="Requests counted by the model", kind=kind.COUNTER),
            kind(name="counted_last", description="Last input seen", kind=kind.GAUGE),
            kind(name="counted_input", description="Inputs seen", kind=kind.HISTOGRAM),
        ]
        self.requests = self.families[0].Metric(labels=labels)
        self.last = self.families[1].Metric(labels=labels)
        self.inputs = self.families[2].Metric(labels=labels, buckets=[1.0, 2.5, 10.0])

    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN")
            x = float(value.as_numpy()[0])
            self.requests.increment(1)
            self.last.set(x)
            self.inputs.observe(x)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", value.as_numpy())]))
        return responses
"""

BAD_LABEL_INIT = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.family = pb_utils.MetricFamily(name="bad_label_init_family", description="d",
                                            kind=pb_utils.MetricFamily.COUNTER)
        self.metric = self.family.Metric(labels={"bad label": "x"})

    def execute(self, requests):
        return None
"""

BAD_LABEL_EXECUTE = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.family = pb_utils.MetricFamily(name="bad_label_execute_family", description="d",
                                            kind=pb_utils.MetricFamily.COUNTER)

    def execute(self, requests):
        self.family.Metric(labels={"model-name": "x"})
"""

TRANSIENT = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.family = pb_utils.MetricFamily(name="transient_seen", description="Seen",
                                            kind=pb_utils.MetricFamily.GAUGE)
        self.kept = self.family.Metric(labels={"k": "kept"})

    def execute(self, requests):
        temporary = self.family.Metric(labels={"k": "temporary"})
        temporary.set(5)
        del temporary
        self.kept.set(len(requests))
        out = [pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy()) for r in requests]
        return [pb_utils.InferenceResponse([tensor]) for tensor in out]
"""

MISUSE = """\
import json

import numpy as np
import triton_python_backend_utils as pb_utils


def refusal(call):
    try:
        call()
    except pb_utils.TritonModelException as exc:
        return exc.message()
    return None


class TritonPythonModel:
    def execute(self, requests):
        kind = pb_utils.MetricFamily
        counter = kind(name="misuse_counter", description="c", kind=kind.COUNTER)
        gauge = kind(name="misuse_gauge", description="g", kind=kind.GAUGE)
        histogram = kind(name="misuse_histogram", description="h", kind=kind.HISTOGRAM)
        count, level = counter.Metric(labels={"k": "v"}), gauge.Metric()
        observed = histogram.Metric(buckets=[1.0])
        found = {
            "increment_negative": refusal(lambda: count.increment(-1)),
            "set_counter": refusal(lambda: count.set(1)),
            "observe_gauge": refusal(lambda: level.observe(1)),
            "value_histogram": refusal(lambda: observed.value()),
            "other_kind": refusal(lambda: kind(name="misuse_counter", description="c", kind=kind.GAUGE)),
            "no_buckets": refusal(lambda: histogram.Metric(labels={"k": "v"})),
            "buckets_on_gauge": refusal(lambda: gauge.Metric(buckets=[1.0])),
            "labels_not_dict": refusal(lambda: counter.Metric(labels="k")),
            "unsorted_buckets": refusal(lambda: histogram.Metric(labels={"k": "u"}, buckets=[2.0, 1.0])),
        }
        out = np.array([json.dumps(found).encode()], dtype=np.object_)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", out)]) for _ in requests]
"""


def _config(name: str, out_type: str = "TYPE_FP32") -> str:
    return (
        f'name: "{name}"\nbackend: "python"\n'
        'input [ { name: "IN" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        f'output [ {{ name: "OUT" data_type: {out_type} dims: [ 1 ] }} ]\n'
        "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
    )


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("custom_metrics") / "models"
    for name, source, out_type in (
        ("counted", COUNTED, "TYPE_FP32"),
        ("bad_label_init", BAD_LABEL_INIT, "TYPE_FP32"),
        ("bad_label_execute", BAD_LABEL_EXECUTE, "TYPE_FP32"),
        ("misuse", MISUSE, "TYPE_STRING"),
        ("transient", TRANSIENT, "TYPE_FP32"),
    ):
        (root / name / "1").mkdir(parents=True)
        (root / name / "1" / "model.py").write_text(source)
        (root / name / "config.pbtxt").write_text(_config(name, out_type))
    return root


EXPECTED = """\
# HELP counted_requests Requests counted by the model
# TYPE counted_requests counter
counted_requests{model="counted",version="1"} 3
# HELP counted_last Last input seen
# TYPE counted_last gauge
counted_last{model="counted",version="1"} 50
# HELP counted_input Inputs seen
# TYPE counted_input histogram
counted_input_count{model="counted",version="1"} 3
counted_input_sum{model="counted",version="1"} 52.5
counted_input_bucket{model="counted",version="1",le="1"} 1
counted_input_bucket{model="counted",version="1",le="2.5"} 2
counted_input_bucket{model="counted",version="1",le="10"} 2
counted_input_bucket{model="counted",version="1",le="+Inf"} 3"""

BAD_LABEL_WORDS = (
    "Error when creating Metric: Failed to process the request for model '{instance}', message: Invalid label name"
)


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text: str = response.read().decode()
    return text


def _family_lines(text: str, prefix: str) -> str:
    return "\n".join(
        line for line in text.splitlines() if line.startswith(prefix) or line.startswith(("# HELP " + prefix,
                                                                                           "# TYPE " + prefix))
    )  # fmt: skip


def _infer(client: httpclient.InferenceServerClient, model: str, value: float) -> httpclient.InferResult:
    tensor = httpclient.InferInput("IN", [1], "FP32")
    tensor.set_data_from_numpy(np.array([value], dtype=np.float32))
    return client.infer(model, [tensor])


def _count_and_check(client: httpclient.InferenceServerClient, metrics_port: int) -> str:
    """Three requests to `counted`; the metrics text, whose custom families must be EXPECTED."""
    for value in (0.5, 2.0, 50.0):
        _infer(client, "counted", value)
    text = _scrape(metrics_port)
    assert _family_lines(text, "counted_") == EXPECTED
    return text


def _bad_label_at_load(client: httpclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as caught:
        client.load_model("bad_label_init")
    message = caught.value.message()
    assert BAD_LABEL_WORDS.format(instance="bad_label_init_0_0") in message
    assert "load failed for model 'bad_label_init'" in message
    assert _infer(client, "counted", 1.0).as_numpy("OUT").tolist() == [1.0]  # the others still serve


@pytest.fixture(scope="module")
def ours(repository: Path) -> Iterator[tuple[httpclient.InferenceServerClient, int]]:
    load = ("counted", "misuse", "bad_label_execute", "transient")
    with running_server(loopback_config(repository, load=load)) as server:
        client = http_client(server)
        assert server.metrics_port is not None
        yield client, server.metrics_port
        client.close()


def _unload_and_wait(client: httpclient.InferenceServerClient, metrics_port: int) -> None:
    client.unload_model("counted")
    deadline = time.monotonic() + 15
    while "counted_" in _scrape(metrics_port):
        assert time.monotonic() < deadline, "the unloaded model's families are still listed"
        time.sleep(0.05)


def test_custom_families_print_in_prometheus_text_and_leave_with_their_model(
    ours: tuple[httpclient.InferenceServerClient, int],
) -> None:
    client, metrics_port = ours
    _unload_and_wait(client, metrics_port)  # from scratch, whatever other tests counted
    client.load_model("counted")
    text = _count_and_check(client, metrics_port)
    assert 'nv_inference_request_failure{model="counted",reason="BACKEND",version="1"} 0' in text
    _unload_and_wait(client, metrics_port)
    client.load_model("counted")  # registered again, from zero
    assert _family_lines(_scrape(metrics_port), "counted_requests") == (
        "# HELP counted_requests Requests counted by the model\n# TYPE counted_requests counter\n"
        'counted_requests{model="counted",version="1"} 0'
    )


def test_a_bad_label_fails_the_load_or_the_request_in_tritons_words(
    ours: tuple[httpclient.InferenceServerClient, int],
) -> None:
    client, _ = ours
    _bad_label_at_load(client)
    with pytest.raises(InferenceServerException) as caught:
        _infer(client, "bad_label_execute", 1.0)
    assert BAD_LABEL_WORDS.format(instance="bad_label_execute_0_0") in caught.value.message()
    assert _infer(client, "counted", 2.0).as_numpy("OUT").tolist() == [2.0]


def test_misuse_raises_with_cores_words(ours: tuple[httpclient.InferenceServerClient, int]) -> None:
    client, _ = ours
    found = json.loads(_infer(client, "misuse", 0.0).as_numpy("OUT")[0])

    def server(words: str) -> str:
        return f"Failed to process the request for model 'misuse_0_0', message: {words}"

    assert found == {
        "increment_negative": "Failed to increment metric value: " + server(
            "TRITONSERVER_METRIC_KIND_COUNTER can only be incremented monotonically by non-negative values."),
        "set_counter": "Failed to set metric value: " + server("TRITONSERVER_METRIC_KIND_COUNTER does not support Set"),
        "observe_gauge": "Failed to observe metric value: " + server(
            "TRITONSERVER_METRIC_KIND_GAUGE does not support Observe"),
        "value_histogram": "Failed to get metric value: " + server(
            "TRITONSERVER_METRIC_KIND_HISTOGRAM does not support Value"),
        "other_kind": "Error when creating MetricFamily: " + server("Family name already exists with different type"),
        "no_buckets": "Failed to create metric. Missing required buckets.",
        "buckets_on_gauge": "Failed to create metric. Unexpected buckets found.",
        "labels_not_dict": "Failed to create metric. Labels must be a dictionary.",
        "unsorted_buckets": "Error when creating Metric: " + server("Bucket Boundaries must be strictly sorted"),
    }  # fmt: skip


def test_a_metric_the_model_drops_leaves_the_metrics_port(ours: tuple[httpclient.InferenceServerClient, int]) -> None:
    client, metrics_port = ours
    _infer(client, "transient", 1.0)
    assert _family_lines(_scrape(metrics_port), "transient_") == (
        '# HELP transient_seen Seen\n# TYPE transient_seen gauge\ntransient_seen{k="kept"} 1'
    )


def test_with_frontend_workers_the_core_lists_them(repository: Path, tmp_path: Path) -> None:
    shutil.copytree(repository / "counted", tmp_path / "counted")
    with running_server(loopback_config(tmp_path, frontend_workers=2)) as server:
        client = http_client(server)
        assert server.metrics_port is not None
        try:
            _count_and_check(client, server.metrics_port)
        finally:
            client.close()


@pytest.mark.peers
def test_triton_prints_the_same_lines(peers: Path, repository: Path) -> None:
    with running_triton(
        peers, repository, extra_args=["--model-control-mode=explicit", "--load-model=counted"], auto_complete=False
    ) as t:
        client = httpclient.InferenceServerClient(t.http_url)
        try:
            text = _count_and_check(client, t.metrics_port)
            success = 'nv_inference_request_success{model="counted",version="1"} 3'
            deadline = time.monotonic() + 10  # Triton counts a success once the response has left
            while success not in text and time.monotonic() < deadline:
                time.sleep(0.05)
                text = _scrape(t.metrics_port)
            assert success in text
            assert 'nv_inference_request_failure{model="counted",reason="BACKEND",version="1"} 0' in text
        finally:
            client.close()
