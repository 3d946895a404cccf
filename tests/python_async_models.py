"""Python-backend models for async execute, the response sender outside `execute`, and
cancellation, served alike by real tritonserver and by ours (tests/integration/test_python_async_sender.py).

All take IN INT32 [-1] and answer OUT INT32 [-1], one instance each.

Decoupled:
- `gate`: `async def execute`; each request waits until IN[0] requests are in flight at once in
  the instance (5 s at most, then it raises), then answers OUT = [how many were waiting] and the
  final flag. It completes only when one instance runs its coroutines concurrently.
- `async_raises`: `async def execute`; a negative IN[0] raises ValueError after an await, any
  other value is echoed with the final flag.
- `threaded`: a thread per request (python_backend's examples/decoupled/repeat_model.py pattern),
  started by `execute`, which returns at once: one response per element of IN, then the final
  flag alone.
- `after_final`: answers, sends the final flag, then sends again (Triton refuses that).
- `no_final`: answers and returns without ever sending the final flag.
- `cancel_watch`: `async def execute`; answers once, then polls `is_cancelled()` on the request
  and the sender until both say so (10 s at most), writes the file named by the request
  parameter `marker`, and sends the final flag.

Not decoupled:
- `sender_unary`: answers through the response sender (OUT = IN, then the final flag) and
  returns None; IN[0] picks a misuse: 1 two responses, 2 a response without the final flag,
  3 the final flag alone, 4 a response both sent and returned, 5 nothing sent nor returned,
  6 a response sent from a thread once execute returned. Triton 2.51 leaves 2 and 5 waiting for
  ever; ours answers 2 when execute returns and fails 5 when its sender is dropped. Both answer 6
  when the thread sends.
- `unary_watch`: writes `marker`.started, then polls `request.is_cancelled()` for 10 s at most,
  writes `marker` when it turns True, and answers OUT = [1 if it was cancelled].
- `bls_watch`: calls `unary_watch` through BLS (`exec`, in execute) with the request parameter
  `child_marker` as the child's marker, so that its client leaving must reach the child request.
- `async_bls_watch`: the same from an `async def execute`, awaiting `async_exec()`.

The sources run in Triton's stub (Debian's Python 3.11 with numpy<2): nothing from the checkout.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["DECOUPLED", "write_async_models"]

_GATE = """\
import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.waiting = 0
        self.changed = None

    async def execute(self, requests):
        if self.changed is None:
            self.changed = asyncio.Condition()
        for request in requests:
            want = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            async with self.changed:
                self.waiting += 1
                seen = self.waiting
                self.changed.notify_all()
                await asyncio.wait_for(self.changed.wait_for(lambda: self.waiting >= want), 5.0)
                seen = self.waiting
            out = pb_utils.Tensor("OUT", np.array([seen], np.int32))
            request.get_response_sender().send(
                pb_utils.InferenceResponse([out]), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
            )
"""

_ASYNC_RAISES = """\
import asyncio

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            await asyncio.sleep(0)
            if values[0] < 0:
                raise ValueError(f"negative input {int(values[0])}")
            request.get_response_sender().send(
                pb_utils.InferenceResponse([pb_utils.Tensor("OUT", values.copy())]),
                flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
            )
"""

_THREADED = """\
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().copy()
            sender = request.get_response_sender()
            threading.Thread(target=self._answer, args=(sender, values), daemon=True).start()
        return None

    def _answer(self, sender, values):
        for value in values:
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([value], np.int32))]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

_AFTER_FINAL = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            sender = request.get_response_sender()
            response = pb_utils.InferenceResponse([pb_utils.Tensor("OUT", values.copy())])
            sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            sender.send(response)
        return None
"""

_NO_FINAL = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            request.get_response_sender().send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", values.copy())]))
        return None
"""

_CANCEL_WATCH = """\
import asyncio
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            marker = json.loads(request.parameters()).get("marker", "")
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([0], np.int32))]))
            for _ in range(1000):
                if request.is_cancelled() and sender.is_cancelled():
                    with open(marker + ".tmp", "w") as handle:  # written whole, then renamed
                        handle.write("cancelled")
                    os.replace(marker + ".tmp", marker)
                    break
                await asyncio.sleep(0.01)
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

_SENDER_UNARY = """\
import threading

import triton_python_backend_utils as pb_utils

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def send_late(sender, returned, response):
    returned.wait()
    try:
        sender.send(response, flags=FINAL)
    except pb_utils.TritonModelException:
        pass


class TritonPythonModel:
    def execute(self, requests):
        returned = []
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            response = pb_utils.InferenceResponse([pb_utils.Tensor("OUT", values.copy())])
            sender = request.get_response_sender()
            mode = int(values[0])
            returned.append(None)
            if mode == 1:
                sender.send(response)
                sender.send(response, flags=FINAL)
            elif mode == 2:
                sender.send(response)
            elif mode == 3:
                sender.send(flags=FINAL)
            elif mode == 4:
                sender.send(response, flags=FINAL)
                returned[-1] = response
            elif mode == 5:
                pass
            elif mode == 6:
                returned_event = threading.Event()
                threading.Thread(target=send_late, args=(sender, returned_event, response), daemon=True).start()
                self.returned = returned_event
            else:
                sender.send(response, flags=FINAL)
        late = getattr(self, "returned", None)
        if late is not None:
            threading.Timer(0.1, late.set).start()  # after execute has returned
            self.returned = None
        return returned if any(r is not None for r in returned) else None
"""

_UNARY_WATCH = """\
import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            marker = json.loads(request.parameters()).get("marker", "")
            if marker:  # started: the test's client leaves now (each marker is written whole, then renamed)
                with open(marker + ".tmp", "w") as handle:
                    handle.write("started")
                os.replace(marker + ".tmp", marker + ".started")
            cancelled = 0
            for _ in range(1000):
                if request.is_cancelled():
                    cancelled = 1
                    with open(marker + ".tmp", "w") as handle:
                        handle.write("cancelled")
                    os.replace(marker + ".tmp", marker)
                    break
                time.sleep(0.01)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([cancelled], np.int32))]))
        return responses
"""

_BLS_WATCH = """\
import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            child = pb_utils.InferenceRequest(
                model_name="unary_watch",
                inputs=[pb_utils.get_input_tensor_by_name(request, "IN")],
                requested_output_names=["OUT"],
                parameters={"marker": json.loads(request.parameters()).get("child_marker", "")},
            )
            answer = child.exec()
            if answer.has_error():
                responses.append(pb_utils.InferenceResponse(error=answer.error()))
            else:
                responses.append(pb_utils.InferenceResponse([pb_utils.get_output_tensor_by_name(answer, "OUT")]))
        return responses
"""

_ASYNC_BLS_WATCH = _BLS_WATCH.replace("    def execute(", "    async def execute(").replace(
    "answer = child.exec()", "answer = await child.async_exec()"
)

#: name → (source, decoupled)
_MODELS = {
    "gate": (_GATE, True),
    "async_raises": (_ASYNC_RAISES, True),
    "threaded": (_THREADED, True),
    "after_final": (_AFTER_FINAL, True),
    "no_final": (_NO_FINAL, True),
    "cancel_watch": (_CANCEL_WATCH, True),
    "sender_unary": (_SENDER_UNARY, False),
    "unary_watch": (_UNARY_WATCH, False),
    "bls_watch": (_BLS_WATCH, False),
    "async_bls_watch": (_ASYNC_BLS_WATCH, False),
}

DECOUPLED = frozenset(name for name, (_, decoupled) in _MODELS.items() if decoupled)


def write_async_models(repository: Path) -> list[str]:
    """Write every model above into `repository`; returns their names."""
    for name, (source, decoupled) in _MODELS.items():
        folder = repository / name
        (folder / "1").mkdir(parents=True, exist_ok=True)
        (folder / "1" / "model.py").write_text(source)
        policy = "model_transaction_policy { decoupled: true }\n" if decoupled else ""
        (folder / "config.pbtxt").write_text(
            f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n'
            'input [ { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] } ]\n'
            'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] } ]\n'
            f"{policy}instance_group [ {{ count: 1 kind: KIND_CPU }} ]\n"
        )
    return list(_MODELS)
