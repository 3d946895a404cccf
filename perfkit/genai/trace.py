"""Trace replay: the public Mooncake trace format, sent open loop at its own timestamps.

Each line of the JSON-lines file is one request: `timestamp` (ms since the trace began),
`input_length` and `output_length` (tokens), and optionally `hash_ids`, the ids of the prompt's
512-token blocks, equal ids meaning a shared prefix (kvcache-ai/Mooncake, FAST'25 traces; AIPerf's
`mooncake_trace` dataset). Replay keeps the order and the gaps: request i is sent at its
timestamp's offset from the first, through the open-loop scheduler's custom intervals (latency
from the intended send, late sends counted), with a prompt of `input_length` tokens asking for
`output_length`. Blocks named by the same hash id get the same text (seeded by the id), so a
server's prefix cache sees the reuse the trace recorded. When a level outlasts the trace, it
starts again after the trace's mean gap.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from perfkit.errors import PerfkitError
from perfkit.genai.tokenizer import Tokenizer
from perfkit.genai.workload import Prompt, synthetic_text

__all__ = ["BLOCK_TOKENS", "TraceRequest", "read_trace", "trace_intervals_ns", "trace_prompts"]

#: Mooncake's hash block: 512 tokens.
BLOCK_TOKENS = 512


@dataclass(frozen=True, slots=True)
class TraceRequest:
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...] = ()


def read_trace(path: Path) -> list[TraceRequest]:
    flag = f"--trace-file {path}"
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise PerfkitError(f"{flag}: cannot read it ({exc})") from None
    requests: list[TraceRequest] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            request = TraceRequest(
                float(record["timestamp"]), int(record["input_length"]), int(record["output_length"]),
                tuple(int(h) for h in record.get("hash_ids", ())),
            )  # fmt: skip
        except (ValueError, KeyError, TypeError) as exc:
            raise PerfkitError(
                f"{flag}:{number}: want a JSON object with timestamp (ms), input_length and output_length ({exc!r})"
            ) from None
        if request.input_length < 1 or request.output_length < 0 or request.timestamp_ms < 0:
            raise PerfkitError(f"{flag}:{number}: lengths and the timestamp must not be negative (input_length >= 1)")
        if requests and request.timestamp_ms < requests[-1].timestamp_ms:
            raise PerfkitError(f"{flag}:{number}: timestamps must not decrease ({request.timestamp_ms:g} ms)")
        requests.append(request)
    if not requests:
        raise PerfkitError(f"{flag}: no requests in it")
    return requests


def trace_intervals_ns(requests: list[TraceRequest]) -> tuple[int, ...]:
    """The open-loop scheduler's intervals: the first is the mean gap (sent once the trace wraps),
    then each request's gap from the one before; at least 1 ns, as intervals must be positive."""
    stamps = np.array([r.timestamp_ms for r in requests], dtype=np.float64) * 1e6
    gaps = np.diff(stamps)
    mean = float(gaps.mean()) if len(gaps) else 1e6
    return tuple(max(1, int(round(g))) for g in (mean, *gaps))


def trace_prompts(requests: list[TraceRequest], tokenizer: Tokenizer, seed: int) -> list[Prompt]:
    """A prompt per trace request, its shared blocks identical wherever their hash ids recur."""
    blocks: dict[int, str] = {}

    def block(hash_id: int) -> str:
        if hash_id not in blocks:
            rng = np.random.default_rng([seed, hash_id])
            blocks[hash_id] = synthetic_text(rng, BLOCK_TOKENS, tokenizer)
        return blocks[hash_id]

    prompts = []
    for index, request in enumerate(requests):
        if request.hash_ids:
            text = "".join(block(h) for h in request.hash_ids)
        else:
            text = synthetic_text(np.random.default_rng([seed, 1 << 40, index]), request.input_length, tokenizer)
        if tokenizer.count(text) < request.input_length:  # the last block was partial in the trace, or short
            text += synthetic_text(np.random.default_rng([seed, 1 << 41, index]), request.input_length, tokenizer)
        text = tokenizer.truncate(text, request.input_length)
        prompts.append(Prompt(text, tokenizer.count(text), request.output_length))
    return prompts
