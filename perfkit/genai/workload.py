"""What a generative measurement sends: the endpoint settings (`GenerativeSpec`) and the prompts.

Prompts are built once, before the load starts, from `--seed` (STYLE practice 7): input lengths
and requested output lengths are drawn from normal distributions (mean, standard deviation),
rounded and floored at one token, as AIPerf's synthetic inputs are; each prompt is words from a
fixed vocabulary, cut to its length with the counting tokenizer, so with `bytes` a prompt of N
tokens is N bytes. Or prompts come from `--input-file`: JSON lines with a `text` field (AIPerf's
single-turn format) or plain lines, each a prompt, counted with the same tokenizer.

A requested output length is sent as `max_tokens`; `--output-tokens-mean-deterministic` adds
`min_tokens` (the same number) and `--ignore-eos` adds `ignore_eos`, so that the server produces
exactly what was asked; the results then check that it did (`records.py`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from perfkit.errors import PerfkitError
from perfkit.genai.goodput import DEFAULT_ATTAINMENT_PCT, STREAMED_FIGURES, Slo
from perfkit.genai.tokenizer import BYTES, USAGE, Tokenizer

__all__ = ["ENDPOINT_TYPES", "GenerativeSpec", "Prompt", "SessionSpec", "WorkloadSpec", "build_prompts", "draw_lengths"]

ENDPOINT_TYPES = ("kserve-infer", "chat", "completions", "embeddings", "kserve-generate")
#: How errors name the session flags (each has an AIPerf alias: --num-sessions, --session-turns-mean, ...).
SESSION_FLAGS = "--conversation-num/--conversation-turn-*"
_VOCABULARY = (
    "the quick brown fox jumps over a lazy dog while seven tired engineers measure latency of large "
    "language models serving tokens across busy clusters under steady and bursty load every night"
).split()


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    input_tokens_mean: int = 128
    input_tokens_stddev: float = 0.0
    output_tokens_mean: int = 0  # 0: no max_tokens sent, the server decides
    output_tokens_stddev: float = 0.0
    deterministic_output: bool = False  # send min_tokens = max_tokens
    ignore_eos: bool = False
    input_file: Path | None = None
    trace_file: Path | None = None  # a Mooncake trace: prompts and send times (trace.py)
    prompt_count: int = 100
    seed: int = 0


@dataclass(frozen=True, slots=True)
class SessionSpec:
    """The session flags; `enabled` once any is given (or the input file is multi_turn)."""

    enabled: bool = False
    count: int = 100  # --conversation-num
    turns_mean: int = 1
    turns_stddev: float = 0.0
    delay_mean_ms: float = 0.0
    delay_stddev_ms: float = 0.0
    delay_ratio: float = 1.0

    def validate(self) -> None:
        if self.count < 1:
            raise PerfkitError(f"--conversation-num must be at least 1, got {self.count}")
        if self.turns_mean < 1 or self.turns_stddev < 0:
            raise PerfkitError("--conversation-turn-mean must be >= 1 and --conversation-turn-stddev >= 0")
        if self.delay_mean_ms < 0 or self.delay_stddev_ms < 0 or self.delay_ratio < 0:
            raise PerfkitError(
                "--conversation-turn-delay-mean, --conversation-turn-delay-stddev and "
                "--conversation-turn-delay-ratio must not be negative"
            )


@dataclass(frozen=True, slots=True)
class GenerativeSpec:
    """`--endpoint-type` and its settings; `kserve-infer` (the default) is the tensor path of old."""

    endpoint_type: str = "kserve-infer"
    endpoint: str = ""  # a path replacing the type's default one
    streaming: bool = False
    tokenizer: str = BYTES
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    goodput: tuple[Slo, ...] = ()
    attainment_pct: float = DEFAULT_ATTAINMENT_PCT  # goodput holds at a level when this share met it
    sessions: SessionSpec = field(default_factory=SessionSpec)  # multi-turn sessions (sessions.py)

    @property
    def enabled(self) -> bool:
        return self.endpoint_type != "kserve-infer"

    @property
    def exact_output(self) -> bool:
        """The server was asked for exactly the requested number of output tokens."""
        w = self.workload
        return w.output_tokens_mean > 0 and (w.deterministic_output or w.ignore_eos)

    def validate(self) -> None:
        w = self.workload
        if self.endpoint_type not in ENDPOINT_TYPES:
            raise PerfkitError(f"--endpoint-type {self.endpoint_type}: choose from {', '.join(ENDPOINT_TYPES)}")
        if not self.enabled:
            for flag, given in (("--goodput", self.goodput), ("--trace-file", w.trace_file),
                                (SESSION_FLAGS, self.sessions.enabled)):  # fmt: skip
                if given:
                    raise PerfkitError(f"{flag} needs a generative --endpoint-type (chat, completions, ...)")
            return
        if self.sessions.enabled:
            self.sessions.validate()
            if self.endpoint_type == "embeddings":
                raise PerfkitError(f"{SESSION_FLAGS}: embeddings have no answer to carry into a next turn; "
                                   "use chat, completions or kserve-generate")  # fmt: skip
            if w.trace_file is not None:
                raise PerfkitError(f"{SESSION_FLAGS}: --trace-file replays single requests at its own times; "
                                   "drop one of them")  # fmt: skip
        if self.endpoint and not self.endpoint.startswith("/"):
            raise PerfkitError(f"--endpoint {self.endpoint}: give a path starting with '/', e.g. /v1/chat/completions")
        if self.streaming and self.endpoint_type == "embeddings":
            raise PerfkitError("--streaming: embeddings answer once; drop --streaming for --endpoint-type embeddings")
        if w.input_tokens_mean < 1 or w.input_tokens_stddev < 0:
            raise PerfkitError("--synthetic-input-tokens-mean must be >= 1 and --synthetic-input-tokens-stddev >= 0")
        if w.output_tokens_mean < 0 or w.output_tokens_stddev < 0:
            raise PerfkitError("--output-tokens-mean and --output-tokens-stddev must not be negative")
        if (w.deterministic_output or w.ignore_eos) and w.output_tokens_mean == 0:
            raise PerfkitError(
                "--output-tokens-mean-deterministic and --ignore-eos need --output-tokens-mean N (the length asked for)"
            )
        if w.prompt_count < 1:
            raise PerfkitError("--num-prompts must be at least 1")
        if w.trace_file is not None and w.input_file is not None:
            raise PerfkitError("--trace-file brings its own prompts: drop --input-file")
        if w.input_file is not None and not w.input_file.is_file():
            raise PerfkitError(f"--input-file {w.input_file}: no such file")
        if not 0 < self.attainment_pct <= 100:
            raise PerfkitError(f"--goodput-attainment must be in (0, 100], not {self.attainment_pct:g}")
        streamed = [str(s) for s in self.goodput if s.figure in STREAMED_FIGURES]
        if streamed and not self.streaming:
            raise PerfkitError(f"--goodput {','.join(streamed)}: token timings need --streaming")
        if self.tokenizer == USAGE and self.endpoint_type == "kserve-generate":
            raise PerfkitError("--tokenizer usage: Triton's generate endpoint reports no usage; use bytes or a file")


@dataclass(frozen=True, slots=True)
class Prompt:
    text: str
    input_tokens: int  # as the counting tokenizer counts it
    max_tokens: int = 0  # output tokens to ask for; 0: none asked


def draw_lengths(rng: np.random.Generator, mean: int, stddev: float, count: int) -> list[int]:
    """`count` values from a normal distribution, rounded and floored at 1; all 0 for a mean of 0."""
    if mean == 0:
        return [0] * count
    drawn = rng.normal(mean, stddev, count) if stddev > 0 else np.full(count, float(mean))
    return [max(1, int(round(x))) for x in drawn]


def synthetic_text(rng: np.random.Generator, tokens: int, tokenizer: Tokenizer) -> str:
    words: list[str] = []
    text = ""
    # Words are at least a token each, so this many always reach the length.
    while tokenizer.count(text) < tokens:
        words.extend(rng.choice(_VOCABULARY, size=tokens + 1).tolist())
        text = " ".join(words)
    return tokenizer.truncate(text, tokens)


def _file_prompts(path: Path) -> list[str]:
    prompts: list[str] = []
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise PerfkitError(f"--input-file {path}: cannot read it ({exc})") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if line.lstrip().startswith("{"):
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise PerfkitError(f"--input-file {path}:{number}: not JSON ({exc.msg})") from None
            text = record.get("text") if isinstance(record, dict) else None
            if not isinstance(text, str):
                raise PerfkitError(f'--input-file {path}:{number}: a JSON line needs a "text" string')
            prompts.append(text)
        else:
            prompts.append(line)
    if not prompts:
        raise PerfkitError(f"--input-file {path}: no prompts in it")
    return prompts


def build_prompts(spec: WorkloadSpec, tokenizer: Tokenizer) -> list[Prompt]:
    """The prompts of a run, in the order they are sent (cycled), from `spec.seed`."""
    rng = np.random.default_rng(spec.seed)
    if spec.input_file is not None:
        texts = _file_prompts(spec.input_file)
    else:
        lengths = draw_lengths(rng, spec.input_tokens_mean, spec.input_tokens_stddev, spec.prompt_count)
        texts = [synthetic_text(rng, n, tokenizer) for n in lengths]
    outputs = draw_lengths(rng, spec.output_tokens_mean, spec.output_tokens_stddev, len(texts))
    return [Prompt(text, tokenizer.count(text), out) for text, out in zip(texts, outputs)]
