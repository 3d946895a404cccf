"""Writes the generative demo models into a model repository (Triton layout).

- `sim_llm`: the simulated engine of `sim_engine.py`; its costs and limits are config.pbtxt
  `parameters`, so a test or a benchmark reads the truth from the same file the model does.
- `tiny_decoder`: `decoder.py`'s ONNX transformer, greedily decoded token by token with onnxruntime
  in the model's stub, one request at a time per instance. It generates printable ASCII (plus
  newline) and may stop at its EOS token (byte 0) unless `ignore_eos` or `min_tokens` says not yet.
- `tiny_embedder`: `embedder.py`'s ONNX pooling, run by onnxruntime in the model's stub on a whole
  dynamic batch at once (rows padded to the longest, the mask keeping padding out of the mean).

The first two are python-backend decoupled models (`max_batch_size: 0`) with the vLLM backend's
inputs and outputs (`llm_io.py`), so the generate extension, gRPC streaming and the OpenAI front
end all drive them. `tiny_embedder` answers once (`max_batch_size: 8`, dynamic batching): it takes
`text_input` (BYTES, tokenised as the others are, a byte a token) or `input_ids` (INT64 token ids,
below 256), one of the two, and returns `embedding` (FP32 [64]) and `num_input_tokens` (UINT32),
which the OpenAI front end's `/v1/embeddings` reads. `llm_io.py`, `pb_io.py` (and `sim_engine.py`
for sim_llm) are copied into the version folder, which the stub puts on sys.path.
"""

from __future__ import annotations

import shutil
from dataclasses import fields
from pathlib import Path

from v2kit.genai.decoder import CONTEXT, build_decoder
from v2kit.genai.embedder import DIM, VOCAB, build_embedder
from v2kit.genai.sim_engine import SimTiming

__all__ = ["GENAI_MODELS", "write_genai_models", "write_sim_llm", "write_tiny_decoder", "write_tiny_embedder"]

#: The generative demo models, by name.
GENAI_MODELS = ("sim_llm", "tiny_decoder", "tiny_embedder")
#: The longest input tiny_embedder takes, in tokens (OpenAI's embedding models' limit).
EMBEDDER_CONTEXT = 8192

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

import numpy as np
import triton_python_backend_utils as pb_utils
from llm_io import GenerationError, encode, output_tensors, read_generation
from pb_io import FINAL, input_array, onnx_session, send

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
        self.session = onnx_session(args)
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


_EMBEDDER_IO = f"""\
max_batch_size: 8
dynamic_batching {{ }}
input [
  {{ name: "text_input" data_type: TYPE_STRING dims: [ 1 ] optional: true }},
  {{ name: "input_ids" data_type: TYPE_INT64 dims: [ -1 ] optional: true }}
]
output [
  {{ name: "embedding" data_type: TYPE_FP32 dims: [ {DIM} ] }},
  {{ name: "num_input_tokens" data_type: TYPE_UINT32 dims: [ 1 ] }}
]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""

_TINY_EMBEDDER_MODEL = f"""\
import json

import numpy as np
import triton_python_backend_utils as pb_utils
from llm_io import encode
from pb_io import input_array, onnx_session

VOCAB = {VOCAB}


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.name = config["name"]
        self.context = int(config["parameters"]["context"]["string_value"])
        self.session = onnx_session(args)

    def execute(self, requests):
        # Every sequence of every request in one onnxruntime call: the batch is what batching buys.
        sequences = []
        for request in requests:
            try:
                sequences.append(self._sequences(request))
            except ValueError as exc:
                sequences.append(exc)
        rows = [row for item in sequences if not isinstance(item, ValueError) for row in item]
        embeddings = self._embed(rows) if rows else None
        responses, at = [], 0
        for item in sequences:
            if isinstance(item, ValueError):
                error = pb_utils.TritonError(str(item), pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            counts = np.array([[len(row)] for row in item], dtype=np.uint32)
            outputs = [pb_utils.Tensor("embedding", embeddings[at : at + len(item)]),
                       pb_utils.Tensor("num_input_tokens", counts)]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
            at += len(item)
        return responses

    def _sequences(self, request):
        # The token ids of each sequence of the request's batch ([k, 1] texts or [k, n] ids).
        text, ids = input_array(request, "text_input"), input_array(request, "input_ids")
        if (text is None) == (ids is None):
            raise ValueError(f"{{self.name}}: send one of 'text_input' (text) and 'input_ids' (token ids)")
        if text is not None:
            rows = [np.array(encode(t if isinstance(t, bytes) else str(t).encode()), dtype=np.int64)
                    for t in text.reshape(-1)]
        else:
            rows = list(ids.reshape(ids.shape[0], -1).astype(np.int64))
        for row in rows:
            if not 0 < len(row) <= self.context:
                raise ValueError(f"{{self.name}}: an input of {{len(row)}} tokens; it takes 1 to {{self.context}}")
            if row.min() < 0 or row.max() >= VOCAB:
                raise ValueError(f"{{self.name}}: token ids must be in [0, {{VOCAB}}) (a byte each), got {{row.max()}}")
        return rows

    def _embed(self, rows):
        width = max(len(row) for row in rows)
        ids = np.zeros((len(rows), width), dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.float32)
        for index, row in enumerate(rows):
            ids[index, : len(row)] = row
            mask[index, : len(row)] = 1.0
        (embeddings,) = self.session.run(["embedding"], {{"input_ids": ids, "attention_mask": mask}})
        return embeddings
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


def write_tiny_embedder(repository: Path, name: str = "tiny_embedder") -> Path:
    """Write the ONNX embedder and the model that batches text or token ids through it as `name`."""
    parameters = _parameters({"context": EMBEDDER_CONTEXT})
    folder = _write(repository, name, _TINY_EMBEDDER_MODEL, parameters, ("llm_io.py", "pb_io.py"), _EMBEDDER_IO)
    (folder / "1" / "model.onnx").write_bytes(build_embedder().SerializeToString())
    return folder


def write_genai_models(repository: Path) -> list[str]:
    """Write every generative demo model into `repository`; returns their names."""
    write_sim_llm(repository)
    write_tiny_decoder(repository)
    write_tiny_embedder(repository)
    return list(GENAI_MODELS)


def _write(repository: Path, name: str, source: str, parameters: str, modules: tuple[str, ...], io: str = _IO) -> Path:
    folder = repository / name
    version = folder / "1"
    version.mkdir(parents=True, exist_ok=True)
    (version / "model.py").write_text(source, encoding="utf-8")
    for module in modules:
        shutil.copyfile(_HERE / module, version / module)
    config = f'name: "{name}"\nbackend: "python"\n{io}{parameters}'
    (folder / "config.pbtxt").write_text(config, encoding="utf-8")
    return folder
