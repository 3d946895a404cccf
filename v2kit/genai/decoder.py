"""`tiny_decoder`'s network: a decoder-only transformer with random weights and an explicit KV
cache, written with onnx.helper at build time and run by onnxruntime.

Byte vocabulary (256), `LAYERS` pre-norm blocks of `HEADS`-head attention and a ReLU MLP, width
`WIDTH`, learned positions up to `CONTEXT`, the output projection tied to the embedding. Weights
are seeded normal draws with 1/sqrt(fan_in) scaling, so a build is byte-identical.

Graph inputs: `input_ids` and `position_ids` (INT64 [1, n]), `attention_bias` (FLOAT [n, past +
n]: 0 where a position may attend, a large negative number where not; the caller builds the
causal mask, which keeps the graph free of shape arithmetic), and per layer `past_key_L` and
`past_value_L` (FLOAT [1, HEADS, past, WIDTH / HEADS]). Outputs: `logits` (FLOAT [1, n, 256]) and
`present_key_L` / `present_value_L`, the past with the n new positions appended. A prefill feeds
the prompt with an empty past; each decode step feeds one token and the previous present.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["CONTEXT", "HEADS", "LAYERS", "VOCAB", "WIDTH", "build_decoder"]

VOCAB = 256
WIDTH = 64
HEADS = 4
LAYERS = 2
CONTEXT = 1024
_MLP = 4 * WIDTH
_OPSET = 17
_IR_VERSION = 8


def build_decoder(seed: int = 5) -> onnx.ModelProto:
    """The decoder graph with weights from `numpy.random.default_rng(seed)`."""
    rng = np.random.default_rng(seed)
    head = WIDTH // HEADS
    weights: dict[str, npt.NDArray[np.generic]] = {
        "embedding": _normal(rng, (VOCAB, WIDTH), 1.0),
        "positions": _normal(rng, (CONTEXT, WIDTH), 0.1),
        "ones": np.ones(WIDTH, dtype=np.float32),
        "zeros": np.zeros(WIDTH, dtype=np.float32),
        "split_heads": np.array([0, 0, HEADS, head], dtype=np.int64),
        "merge_heads": np.array([0, 0, WIDTH], dtype=np.int64),
        "scale": np.array(1.0 / np.sqrt(head), dtype=np.float32),
    }
    weights["unembedding"] = np.ascontiguousarray(weights["embedding"].T)
    nodes = [
        helper.make_node("Gather", ["embedding", "input_ids"], ["tokens"]),
        helper.make_node("Gather", ["positions", "position_ids"], ["placed"]),
        helper.make_node("Add", ["tokens", "placed"], ["h0"]),
    ]
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, "n"]),
        helper.make_tensor_value_info("position_ids", TensorProto.INT64, [1, "n"]),
        helper.make_tensor_value_info("attention_bias", TensorProto.FLOAT, ["n", "total"]),
    ]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, "n", VOCAB])]
    hidden = "h0"
    for layer in range(LAYERS):
        p = f"l{layer}_"
        for name, shape in (
            ("wq", (WIDTH, WIDTH)),
            ("wk", (WIDTH, WIDTH)),
            ("wv", (WIDTH, WIDTH)),
            ("wo", (WIDTH, WIDTH)),
        ):
            weights[p + name] = _normal(rng, shape, 1.0 / np.sqrt(WIDTH))
        weights[p + "w1"] = _normal(rng, (WIDTH, _MLP), 1.0 / np.sqrt(WIDTH))
        weights[p + "w2"] = _normal(rng, (_MLP, WIDTH), 1.0 / np.sqrt(_MLP))
        past_k, past_v = f"past_key_{layer}", f"past_value_{layer}"
        present_k, present_v = f"present_key_{layer}", f"present_value_{layer}"
        inputs += [
            helper.make_tensor_value_info(past_k, TensorProto.FLOAT, [1, HEADS, "past", head]),
            helper.make_tensor_value_info(past_v, TensorProto.FLOAT, [1, HEADS, "past", head]),
        ]
        outputs += [
            helper.make_tensor_value_info(present_k, TensorProto.FLOAT, [1, HEADS, "total", head]),
            helper.make_tensor_value_info(present_v, TensorProto.FLOAT, [1, HEADS, "total", head]),
        ]
        nodes += [
            helper.make_node("LayerNormalization", [hidden, "ones", "zeros"], [p + "n1"], axis=-1),
            *_heads(p, "q", p + "n1"),
            *_heads(p, "k", p + "n1"),
            *_heads(p, "v", p + "n1"),
            helper.make_node("Concat", [past_k, p + "k_heads"], [present_k], axis=2),
            helper.make_node("Concat", [past_v, p + "v_heads"], [present_v], axis=2),
            helper.make_node("Transpose", [present_k], [p + "kt"], perm=[0, 1, 3, 2]),
            helper.make_node("MatMul", [p + "q_heads", p + "kt"], [p + "scores"]),
            helper.make_node("Mul", [p + "scores", "scale"], [p + "scaled"]),
            helper.make_node("Add", [p + "scaled", "attention_bias"], [p + "masked"]),
            helper.make_node("Softmax", [p + "masked"], [p + "attn"], axis=-1),
            helper.make_node("MatMul", [p + "attn", present_v], [p + "mixed"]),
            helper.make_node("Transpose", [p + "mixed"], [p + "mixed_t"], perm=[0, 2, 1, 3]),
            helper.make_node("Reshape", [p + "mixed_t", "merge_heads"], [p + "merged"]),
            helper.make_node("MatMul", [p + "merged", p + "wo"], [p + "attn_out"]),
            helper.make_node("Add", [hidden, p + "attn_out"], [p + "h1"]),
            helper.make_node("LayerNormalization", [p + "h1", "ones", "zeros"], [p + "n2"], axis=-1),
            helper.make_node("MatMul", [p + "n2", p + "w1"], [p + "up"]),
            helper.make_node("Relu", [p + "up"], [p + "act"]),
            helper.make_node("MatMul", [p + "act", p + "w2"], [p + "down"]),
            helper.make_node("Add", [p + "h1", p + "down"], [p + "out"]),
        ]
        hidden = p + "out"
    nodes += [
        helper.make_node("LayerNormalization", [hidden, "ones", "zeros"], ["final"], axis=-1),
        helper.make_node("MatMul", ["final", "unembedding"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny_decoder",
        inputs,
        outputs,
        initializer=[numpy_helper.from_array(array, key) for key, array in weights.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", _OPSET)], producer_name="perfkit-demo")
    model.ir_version = _IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    return model


def _heads(p: str, which: str, source: str) -> list[onnx.NodeProto]:
    """x @ W, split into heads: [1, n, WIDTH] -> [1, HEADS, n, WIDTH / HEADS]."""
    return [
        helper.make_node("MatMul", [source, f"{p}w{which}"], [f"{p}{which}"]),
        helper.make_node("Reshape", [f"{p}{which}", "split_heads"], [f"{p}{which}_split"]),
        helper.make_node("Transpose", [f"{p}{which}_split"], [f"{p}{which}_heads"], perm=[0, 2, 1, 3]),
    ]


def _normal(rng: np.random.Generator, shape: tuple[int, ...], std: float) -> npt.NDArray[np.float32]:
    draws: npt.NDArray[np.float32] = (rng.standard_normal(shape) * std).astype(np.float32)
    return draws
