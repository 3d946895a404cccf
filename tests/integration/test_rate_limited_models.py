"""--rate-limit execution_count on a running server: two instance groups that share one resource run
one execution at a time (the same model without rate_limiter runs two), and a model that asks for more
than --rate-limit-resource gives fails to load with Triton's message.

Each execution of the python models below appends "+PID" when it starts and "-PID" when it ends to
one file (O_APPEND: each line lands whole), so the test counts how many ran at once from what the
models themselves saw, not from timing.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from reference_server.server import ReferenceServer, running_server
from tests.servers import loopback_config, write_identity_model
from v2kit.demo import build_demo_repository

pytestmark = pytest.mark.integration

MODEL = """
import json
import os
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.log = json.loads(args["model_config"])["parameters"]["log"]["string_value"]

    def execute(self, requests):
        fd = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, f"+{os.getpid()}\\n".encode())
            time.sleep(0.1)  # long enough for the other instance to start, if it may
            os.write(fd, f"-{os.getpid()}\\n".encode())
        finally:
            os.close(fd)
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())])
            for r in requests
        ]
"""


def write_model(repository: Path, name: str, limits: tuple[str, str], log: Path) -> None:
    folder = repository / name
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(MODEL)
    first, second = limits
    (folder / "config.pbtxt").write_text(
        textwrap.dedent(f"""\
        name: "{name}"
        backend: "python"
        max_batch_size: 0
        input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 1 ] }} ]
        output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 1 ] }} ]
        instance_group [
          {{ name: "first" count: 1 kind: KIND_CPU {first} }},
          {{ name: "second" count: 1 kind: KIND_CPU {second} }}
        ]
        parameters {{ key: "log" value {{ string_value: "{log}" }} }}
        """)
    )


SHARED = 'rate_limiter { resources [ { name: "R" count: 1 } ] }'


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ReferenceServer, Path]]:
    root = tmp_path_factory.mktemp("rate_limit")
    repository = build_demo_repository(root / "models")
    write_model(repository, "limited", (SHARED, SHARED.replace("} ] }", "} ] priority: 2 }")), root / "limited.log")
    write_model(repository, "free", ("", ""), root / "free.log")
    greedy = 'instance_group [ { kind: KIND_CPU rate_limiter { resources [ { name: "R" count: 2 } ] } } ]'
    write_identity_model(repository, "greedy", greedy)
    config = loopback_config(
        repository, load=("limited", "free", "greedy"), rate_limit="execution_count",
        rate_limit_resources=(("R", 1, None),),
    )  # fmt: skip
    with running_server(config) as server:
        yield server, root


def most_at_once(log: Path) -> tuple[int, set[str]]:
    running: set[str] = set()
    most = 0
    pids = set()
    for line in log.read_text().split():
        sign, pid = line[0], line[1:]
        pids.add(pid)
        if sign == "+":
            running.add(pid)
            most = max(most, len(running))
        else:
            running.discard(pid)
    return most, pids


@pytest.mark.parametrize(("model", "expected"), [("limited", 1), ("free", 2)])
def test_instances_sharing_a_resource_run_one_at_a_time(
    setup: tuple[ReferenceServer, Path], model: str, expected: int
) -> None:
    server, root = setup
    client = httpclient.InferenceServerClient(server.http_url, concurrency=6)
    pending = []
    for i in range(6):
        inp = httpclient.InferInput("IN", [1], "FP32")
        inp.set_data_from_numpy(np.array([i], np.float32))
        pending.append(client.async_infer(model, [inp]))
    answers = [float(p.get_result(timeout=30).as_numpy("OUT")[0]) for p in pending]
    assert answers == [float(i) for i in range(6)]
    most, pids = most_at_once(root / f"{model}.log")
    assert most == expected
    assert len(pids) == 2  # both instances worked
    stats = client.get_inference_statistics(model)["model_stats"][0]
    assert stats["execution_count"] == 6


def test_asking_for_more_than_the_flag_gives_fails_the_load(setup: tuple[ReferenceServer, Path]) -> None:
    server, _ = setup
    client = httpclient.InferenceServerClient(server.http_url)
    entry = {m["name"]: m for m in client.get_model_repository_index()}["greedy"]
    assert entry["state"] == "UNAVAILABLE"
    assert (
        'Resource count for "R" is limited to 1 which will prevent scheduling of one or more model instances, '
        "the minimum required count is 2" in entry["reason"]
    )
    assert client.is_model_ready("limited")
