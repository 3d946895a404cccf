"""Writes the generative demo models into a model repository (Triton layout).

- `sim_llm`: the simulated engine of `sim_engine.py`; its costs and limits are config.pbtxt
  `parameters`, so a test or a benchmark reads the truth from the same file the model does.
- `tiny_decoder`: `decoder.py`'s ONNX transformer, greedily decoded token by token with onnxruntime
  in the model's stub, one request at a time per instance. It generates printable ASCII (plus
  newline) and may stop at its EOS token (byte 0) unless `ignore_eos` or `min_tokens` says not yet.

Both are python-backend decoupled models (`max_batch_size: 0`) with the vLLM backend's inputs and
outputs (`llm_io.py`), so the generate extension, gRPC streaming and the OpenAI front end all
drive them. `llm_io.py`, `pb_io.py` (and `sim_engine.py` for sim_llm) are copied into the version
folder, which the stub puts on sys.path.
"""

from __future__ import annotations

import shutil
from dataclasses import fields
from pathlib import Path

from v2kit.genai.decoder import CONTEXT, build_decoder
from v2kit.genai.sim_engine import SimTiming

__all__ = ["GENAI_MODELS", "write_genai_models", "write_sim_llm", "write_tiny_decoder"]

#: The generative demo models, by name.
GENAI_MODELS = ("sim_llm", "tiny_decoder")

_HERE = Path(__file__).parent

_IO = """\
max_batch_size: 0
model_transaction_policy { decoupled: true }
input [
  { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "stream" data_type: TYPE_BOOL dims: [ 1 ] optional: true },
  { name: "sampling_parameters" data_type: TYPE_STRING dims: [ 1 ] optional: true },
  { name: "exclude_input_in_output" data_type: TYPE_BOOL dims: [ 1 ] optional: true },
  { name: "return_num_input_tokens" data_type: TYPE_BOOL dims: [ 1 ] optional: true },
  { name: "return_num_output_tokens" data_type: TYPE_BOOL dims: [ 1 ] optional: true }
]
output [
  { name: "text_output" data_type: TYPE_STRING dims: [ -1 ] },
  { name: "num_input_tokens" data_type: TYPE_UINT32 dims: [ 1 ] },
  { name: "num_output_tokens" data_type: TYPE_UINT32 dims: [ 1 ] }
]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

_SIM_LLM_MODEL = """\
import json

import triton_python_backend_utils as pb_utils
from llm_io import GenerationError, output_tensors, read_generation
from pb_io import FINAL, input_array, send
from sim_engine import TEXT, SimEngine, SimSequence, SimTiming, output_length


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.name = config["name"]
        parameters = {key: value["string_value"] for key, value in config.get("parameters", {}).items()}
        self.timing = SimTiming.from_parameters(parameters)
        self.engine = SimEngine(self.timing)

    def execute(self, requests):
        # Each request joins the engine's queue; the engine's thread answers it token by token.
        for request in requests:
            sender = request.get_response_sender()
            try:
                generation = read_generation(lambda name: input_array(request, name), self.name)
                self.engine.submit(self._sequence(generation, request, sender))
            except (GenerationError, ValueError) as exc:
                error = pb_utils.TritonError(str(exc), pb_utils.TritonError.INVALID_ARG)
                sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)
        return None

    def _sequence(self, generation, request, sender):
        length = output_length(self.timing, generation.max_tokens, generation.min_tokens, generation.ignore_eos)
        collected = bytearray()

        def on_token(index, final):
            at = index % len(TEXT)
            token = TEXT[at : at + 1]
            if generation.stream:
                send(sender, output_tensors(generation, token, 1), final)
                return
            collected.extend(token)
            if final:
                send(sender, output_tensors(generation, bytes(collected), length), True)

        return SimSequence(
            len(generation.prompt),
            length,
            on_token,
            on_dropped=lambda: sender.send(flags=FINAL),
            cancelled=request.is_cancelled,
        )

    def finalize(self):
        self.engine.stop()
"""

_TINY_DECODER_MODEL = """\
import json
import os

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils
from llm_io import GenerationError, encode, output_tensors, read_generation
from pb_io import FINAL, input_array, send

EOS = 0
MASKED = np.float32(-1e9)
# What it may generate: printable ASCII and newline (each token is a character), and EOS.
PRINTABLE = np.zeros(256, dtype=bool)
PRINTABLE[32:127] = True
PRINTABLE[10] = True
WITH_EOS = PRINTABLE.copy()
WITH_EOS[EOS] = True


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.name = config["name"]
        self.context = int(config["parameters"]["context"]["string_value"])
        folder = os.path.join(args["model_repository"], args["model_version"])
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(
            os.path.join(folder, "model.onnx"), options, providers=["CPUExecutionProvider"]
        )
        self.output_names = [output.name for output in self.session.get_outputs()]
        self.past = {}
        for graph_input in self.session.get_inputs():
            if graph_input.name.startswith("past_"):
                _, heads, _, head = graph_input.shape
                self.past[graph_input.name] = np.zeros((1, heads, 0, head), dtype=np.float32)

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                generation = read_generation(lambda name: input_array(request, name), self.name)
                tokens = encode(generation.prompt)
                if len(tokens) + generation.max_tokens > self.context:
                    raise GenerationError(
                        f"{self.name}: prompt ({len(tokens)} tokens) plus max_tokens ({generation.max_tokens}) "
                        f"exceeds the context of {self.context} tokens"
                    )
            except GenerationError as exc:
                error = pb_utils.TritonError(str(exc), pb_utils.TritonError.INVALID_ARG)
                sender.send(pb_utils.InferenceResponse(error=error), flags=FINAL)
                continue
            self._generate(request, sender, generation, tokens)
        return None

    def _generate(self, request, sender, generation, tokens):
        n = len(tokens)
        feeds = {
            "input_ids": np.array([tokens], dtype=np.int64),
            "position_ids": np.arange(n, dtype=np.int64)[None],
            "attention_bias": np.triu(np.full((n, n), MASKED, dtype=np.float32), 1),
            **self.past,
        }
        produced = bytearray()
        for index in range(generation.max_tokens):
            if request.is_cancelled():
                sender.send(flags=FINAL)
                return
            results = dict(zip(self.output_names, self.session.run(None, feeds)))
            may_stop = not generation.ignore_eos and index >= generation.min_tokens
            allowed = WITH_EOS if may_stop else PRINTABLE
            token = int(np.argmax(np.where(allowed, results["logits"][0, -1], MASKED)))
            final = token == EOS or index + 1 == generation.max_tokens
            text = b"" if token == EOS else bytes([token])
            if generation.stream:
                send(sender, output_tensors(generation, text, len(text)), final)
            else:
                produced.extend(text)
                if final:
                    send(sender, output_tensors(generation, bytes(produced), len(produced)), True)
            if final:
                return
            position = n + index
            feeds = {
                "input_ids": np.array([[token]], dtype=np.int64),
                "position_ids": np.array([[position]], dtype=np.int64),
                "attention_bias": np.zeros((1, position + 1), dtype=np.float32),
            }
            for name in self.past:
                feeds[name] = results[name.replace("past_", "present_")]
"""


def _parameters(values: dict[str, object]) -> str:
    entries = ",\n".join(f'  {{ key: "{key}" value: {{ string_value: "{value}" }} }}' for key, value in values.items())
    return f"parameters [\n{entries}\n]\n"


def write_sim_llm(repository: Path, timing: SimTiming | None = None, name: str = "sim_llm") -> Path:
    """Write the simulated engine as `name`, its costs and limits from `timing` (defaults if None)."""
    timing = timing or SimTiming()
    values: dict[str, object] = {spec.name: getattr(timing, spec.name) for spec in fields(SimTiming)}
    return _write(repository, name, _SIM_LLM_MODEL, _parameters(values), ("llm_io.py", "pb_io.py", "sim_engine.py"))


def write_tiny_decoder(repository: Path, name: str = "tiny_decoder") -> Path:
    """Write the ONNX decoder and the model that decodes with it as `name`."""
    folder = _write(repository, name, _TINY_DECODER_MODEL, _parameters({"context": CONTEXT}), ("llm_io.py", "pb_io.py"))
    (folder / "1" / "model.onnx").write_bytes(build_decoder().SerializeToString())
    return folder


def write_genai_models(repository: Path) -> list[str]:
    """Write every generative demo model into `repository`; returns their names."""
    write_sim_llm(repository)
    write_tiny_decoder(repository)
    return list(GENAI_MODELS)


def _write(repository: Path, name: str, source: str, parameters: str, modules: tuple[str, ...]) -> Path:
    folder = repository / name
    version = folder / "1"
    version.mkdir(parents=True, exist_ok=True)
    (version / "model.py").write_text(source, encoding="utf-8")
    for module in modules:
        shutil.copyfile(_HERE / module, version / module)
    config = f'name: "{name}"\nbackend: "python"\n{_IO}{parameters}'
    (folder / "config.pbtxt").write_text(config, encoding="utf-8")
    return folder
