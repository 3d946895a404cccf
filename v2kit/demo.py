"""The demo model repository: small ONNX models built locally with onnx.helper, a python-backend
model, and an ensemble.

Nothing is downloaded. The weights come from seeded numpy generators with He scaling
(std = sqrt(2 / fan_in)), so every build is byte-identical and the ReLU layers neither die out nor
blow up: the outputs are finite and vary with the input.

- `mlp`: 256 → 1024 → 1024 → 10, about 5 MB of weights; enough work per request that batching
  pays off, which makes it the model for throughput and batching experiments.
- `convnet`: a LeNet-sized CNN on 1×28×28 images; exercises 4-D inputs.
- `identity`: copies its input; the server does almost nothing, so its latency is client and
  transport overhead.
- `python_linear`: a python-backend model (`model.py`) in the pattern most deployments follow:
  `initialize` loads numpy weights (`weights.npy`, `bias.npy`) from its version folder, `execute`
  applies them (64 → 16, ReLU) to each request of the batch the dynamic batcher hands it.
- `mlp_pipeline`: an ensemble (Triton's `platform: "ensemble"`, no model file) of two steps:
  `preprocess` (an ONNX model scaling [0, 1] inputs to [-1, 1]) feeding `mlp`; the shape of the
  model pipelines Triton users deploy.
- with `genai=True` (`--genai`), also the models of `v2kit.genai`: `sim_llm` (a simulated
  engine with known timing), `tiny_decoder` (a small ONNX transformer) and `tiny_embedder` (an
  ONNX embedding model for `/v1/embeddings`). They are
  left out by default: their stubs (one imports onnxruntime) would slow the start of every server
  on the demo repository, which most uses never send text to.

`ensure_demo_repository()` keeps one built copy per BUILDER_VERSION (and per `genai`) in the cache folder. Bump
BUILDER_VERSION whenever the models or configs change, so that old caches are not reused.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["BUILDER_VERSION", "build_demo_repository", "ensure_demo_repository", "main"]

BUILDER_VERSION = 6
# Opset 17 with IR version 8 (the pair onnx released together) loads in every onnxruntime from
# 1.14 on; the installed onnx would otherwise stamp a newer IR version than some runtimes accept.
OPSET = 17
IR_VERSION = 8

_MLP_CONFIG = """\
name: "mlp"
backend: "onnxruntime"
max_batch_size: 64
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 256 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 10 ] } ]
# Requests that queue while the instance is busy are batched even with no delay; the 100 us
# delay also lets near-simultaneous arrivals at an idle instance share a batch, for at most
# 100 us of extra latency at low load.
dynamic_batching { max_queue_delay_microseconds: 100 }
# No kind: on a GPU if there is one, else on the CPU.
instance_group [ { count: 1 } ]
"""

_CONVNET_CONFIG = """\
name: "convnet"
backend: "onnxruntime"
max_batch_size: 32
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1, 28, 28 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 10 ] } ]
dynamic_batching { }
"""

_IDENTITY_CONFIG = """\
name: "identity"
backend: "onnxruntime"
# Batchable, but no dynamic batching: each request runs on its own, so the measured latency is
# the client's and the transport's, not the batcher's.
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { count: 1 } ]
"""


_PREPROCESS_CONFIG = """\
name: "preprocess"
backend: "onnxruntime"
max_batch_size: 64
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 256 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 256 ] } ]
dynamic_batching { max_queue_delay_microseconds: 100 }
"""

_PIPELINE_CONFIG = """\
name: "mlp_pipeline"
platform: "ensemble"
max_batch_size: 64
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 256 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 10 ] } ]
ensemble_scheduling {
  step [
    {
      model_name: "preprocess"
      model_version: -1
      input_map { key: "INPUT0" value: "INPUT0" }
      output_map { key: "OUTPUT0" value: "scaled" }
    },
    {
      model_name: "mlp"
      model_version: -1
      input_map { key: "INPUT0" value: "scaled" }
      output_map { key: "OUTPUT0" value: "OUTPUT0" }
    }
  ]
}
"""


def build_demo_repository(dest: Path, *, genai: bool = False) -> Path:
    """Write the demo models into `dest` in Triton layout, with the generative ones if `genai`;
    return `dest`."""
    models: dict[str, tuple[onnx.ModelProto | None, str]] = {
        "mlp": (_mlp(np.random.default_rng(1)), _MLP_CONFIG),
        "convnet": (_convnet(np.random.default_rng(2)), _CONVNET_CONFIG),
        "identity": (_identity(), _IDENTITY_CONFIG),
        "preprocess": (_preprocess(), _PREPROCESS_CONFIG),
        # An ensemble has no model file, but Triton still wants a version folder.
        "mlp_pipeline": (None, _PIPELINE_CONFIG),
    }
    for name, (model, config) in models.items():
        version_dir = dest / name / "1"
        version_dir.mkdir(parents=True, exist_ok=True)
        if model is not None:
            onnx.checker.check_model(model, full_check=True)
            (version_dir / "model.onnx").write_bytes(model.SerializeToString())
        (dest / name / "config.pbtxt").write_text(config, encoding="utf-8")
    _python_linear(dest / "python_linear", np.random.default_rng(4))
    if genai:
        from v2kit.genai.repository import write_genai_models

        write_genai_models(dest)
    return dest


_PYTHON_LINEAR_CONFIG = """\
name: "python_linear"
backend: "python"
max_batch_size: 16
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 64 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
dynamic_batching { max_queue_delay_microseconds: 100 }
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

_PYTHON_LINEAR_MODEL = """\
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        folder = os.path.join(args["model_repository"], args["model_version"])
        self.weights = np.load(os.path.join(folder, "weights.npy"))
        self.bias = np.load(os.path.join(folder, "bias.npy"))
        config = json.loads(args["model_config"])
        output = pb_utils.get_output_config_by_name(config, "OUTPUT0")
        self.dtype = pb_utils.triton_string_to_numpy(output["data_type"])

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            y = np.maximum(x @ self.weights + self.bias, 0).astype(self.dtype)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT0", y)]))
        return responses
"""


def _python_linear(folder: Path, rng: np.random.Generator) -> None:
    """The python-backend demo: model.py and its numpy weights (64 → 16, ReLU)."""
    version_dir = folder / "1"
    version_dir.mkdir(parents=True, exist_ok=True)
    np.save(version_dir / "weights.npy", _he(rng, (64, 16), 64))
    np.save(version_dir / "bias.npy", _bias(rng, 16))
    (version_dir / "model.py").write_text(_PYTHON_LINEAR_MODEL, encoding="utf-8")
    (folder / "config.pbtxt").write_text(_PYTHON_LINEAR_CONFIG, encoding="utf-8")


def ensure_demo_repository(*, genai: bool = False) -> Path:
    """A built demo repository in `$PERFKIT_CACHE_DIR` (default `~/.cache/perfkit`), built once
    (with the generative models if `genai`, in a folder of its own).

    The build goes to a temporary sibling folder that is renamed into place, so a reader never
    sees a half-built repository, and when two processes race the loser discards its copy.
    """
    cache = Path(os.environ.get("PERFKIT_CACHE_DIR") or Path.home() / ".cache" / "perfkit")
    target = cache / f"demo-models{'-genai' if genai else ''}-v{BUILDER_VERSION}"
    if target.is_dir():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=cache))
    try:
        build_demo_repository(staging, genai=genai)
        os.rename(staging, target)
    except OSError:
        # Another process renamed its build into place first (rename onto a non-empty folder fails).
        if not target.is_dir():
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m v2kit.demo DEST`: build the demo repository into DEST."""
    parser = argparse.ArgumentParser(
        prog="python -m v2kit.demo",
        description="Build the demo model repository (mlp, convnet, identity, preprocess, mlp_pipeline, python_linear).",
    )
    parser.add_argument("dest", metavar="DEST", type=Path, help="folder to write the model repository into")
    parser.add_argument(
        "--genai",
        action="store_true",
        help="also write the generative models sim_llm and tiny_decoder (decoupled, vLLM-style inputs)",
    )
    args = parser.parse_args(argv)
    try:
        path = build_demo_repository(args.dest, genai=args.genai)
    except OSError as exc:
        print(f"error: cannot write the demo repository to {args.dest}: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


# --------------------------------------------------------------------------------------------
# Graphs


def _he(rng: np.random.Generator, shape: tuple[int, ...], fan_in: int) -> npt.NDArray[np.float32]:
    weights: npt.NDArray[np.float32] = (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)
    return weights


def _bias(rng: np.random.Generator, size: int) -> npt.NDArray[np.float32]:
    return (rng.standard_normal(size) * 0.01).astype(np.float32)


def _model(
    name: str,
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    weights: dict[str, npt.NDArray[np.float32]],
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        name,
        inputs,
        outputs,
        initializer=[numpy_helper.from_array(array, key) for key, array in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="perfkit-demo")
    model.ir_version = IR_VERSION
    return model


def _mlp(rng: np.random.Generator) -> onnx.ModelProto:
    sizes = [256, 1024, 1024, 10]
    nodes: list[onnx.NodeProto] = []
    weights: dict[str, npt.NDArray[np.float32]] = {}
    current = "INPUT0"
    for layer, (fan_in, fan_out) in enumerate(zip(sizes, sizes[1:])):
        weights[f"w{layer}"] = _he(rng, (fan_out, fan_in), fan_in)
        weights[f"b{layer}"] = _bias(rng, fan_out)
        last = layer == len(sizes) - 2
        gemm_out = "OUTPUT0" if last else f"gemm{layer}"
        nodes.append(helper.make_node("Gemm", [current, f"w{layer}", f"b{layer}"], [gemm_out], transB=1))
        if not last:
            nodes.append(helper.make_node("Relu", [gemm_out], [f"relu{layer}"]))
            current = f"relu{layer}"
    return _model(
        "mlp",
        nodes,
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", 256])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", 10])],
        weights,
    )


def _convnet(rng: np.random.Generator) -> onnx.ModelProto:
    weights = {
        "conv0_w": _he(rng, (8, 1, 3, 3), 1 * 3 * 3),
        "conv0_b": _bias(rng, 8),
        "conv1_w": _he(rng, (16, 8, 3, 3), 8 * 3 * 3),
        "conv1_b": _bias(rng, 16),
        # 28 -pool-> 14 -conv(no pad)-> 12 -pool-> 6: 16 * 6 * 6 features.
        "fc_w": _he(rng, (10, 16 * 6 * 6), 16 * 6 * 6),
        "fc_b": _bias(rng, 10),
    }
    nodes = [
        helper.make_node("Conv", ["INPUT0", "conv0_w", "conv0_b"], ["conv0"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv0"], ["relu0"]),
        helper.make_node("MaxPool", ["relu0"], ["pool0"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["pool0", "conv1_w", "conv1_b"], ["conv1"], kernel_shape=[3, 3]),
        helper.make_node("Relu", ["conv1"], ["relu1"]),
        helper.make_node("MaxPool", ["relu1"], ["pool1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["pool1"], ["flat"], axis=1),
        helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["OUTPUT0"], transB=1),
    ]
    return _model(
        "convnet",
        nodes,
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", 1, 28, 28])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", 10])],
        weights,
    )


def _identity() -> onnx.ModelProto:
    return _model(
        "identity",
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", "n"])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", "n"])],
        {},
    )


def _preprocess() -> onnx.ModelProto:
    """(x - 0.5) * 2: [0, 1] pixels to [-1, 1]."""
    return _model(
        "preprocess",
        [
            helper.make_node("Sub", ["INPUT0", "half"], ["centred"]),
            helper.make_node("Mul", ["centred", "two"], ["OUTPUT0"]),
        ],
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", 256])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", 256])],
        {"half": np.array(0.5, dtype=np.float32), "two": np.array(2.0, dtype=np.float32)},
    )


if __name__ == "__main__":
    sys.exit(main())
