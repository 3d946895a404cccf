"""`tiny_embedder`'s network: byte tokens to a unit-length sentence embedding, written with
onnx.helper at build time and run by onnxruntime.

An embedding table (`VOCAB` x `DIM`, seeded normal draws, so a build is byte-identical), the mean
of the rows of a sequence's tokens, and L2 normalisation: the pooling a sentence-embedding model
puts after its encoder, without the encoder.

Graph inputs: `input_ids` (INT64 [batch, n], byte tokens, padding anything in range) and
`attention_mask` (FLOAT [batch, n]: 1 for a token, 0 for padding, so sequences of different
lengths share one call). Output: `embedding` (FLOAT [batch, DIM]), each row of L2 norm 1.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["DIM", "VOCAB", "build_embedder", "embed_reference"]

VOCAB = 256
DIM = 64
_OPSET = 17
_IR_VERSION = 8


def _table(seed: int) -> npt.NDArray[np.float32]:
    return np.random.default_rng(seed).standard_normal((VOCAB, DIM)).astype(np.float32)


def build_embedder(seed: int = 7) -> onnx.ModelProto:
    """The embedder graph with its table from `numpy.random.default_rng(seed)`."""
    weights: dict[str, npt.NDArray[np.generic]] = {"table": _table(seed), "last_axis": np.array([-1], dtype=np.int64),
               "sequence_axis": np.array([1], dtype=np.int64)}  # fmt: skip
    nodes = [
        helper.make_node("Gather", ["table", "input_ids"], ["tokens"]),
        helper.make_node("Unsqueeze", ["attention_mask", "last_axis"], ["mask3"]),
        helper.make_node("Mul", ["tokens", "mask3"], ["kept"]),
        helper.make_node("ReduceSum", ["kept", "sequence_axis"], ["summed"], keepdims=0),
        helper.make_node("ReduceSum", ["attention_mask", "sequence_axis"], ["count"], keepdims=1),
        helper.make_node("Div", ["summed", "count"], ["mean"]),
        helper.make_node("LpNormalization", ["mean"], ["embedding"], axis=-1, p=2),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_embedder",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "n"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.FLOAT, ["batch", "n"]),
        ],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", DIM])],
        initializer=[numpy_helper.from_array(array, key) for key, array in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", _OPSET)], producer_name="perfkit-demo")
    model.ir_version = _IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    return model


def embed_reference(tokens: list[int], seed: int = 7) -> npt.NDArray[np.float32]:
    """What the graph computes for one sequence, in numpy: the check on the graph and on a server."""
    mean = _table(seed)[np.asarray(tokens, dtype=np.int64)].mean(axis=0)
    unit: npt.NDArray[np.float32] = (mean / np.linalg.norm(mean)).astype(np.float32)
    return unit
