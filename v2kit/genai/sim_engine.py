"""A simulated LLM engine with known timing: continuous batching over a bounded KV cache, as vLLM
schedules, with sleeps in place of the GPU, so that a client's measured time to first token (TTFT)
and inter-token latency (ITL) can be checked against the truth.

*Theory of operation.* Requests wait in arrival order. Before each step the scheduler admits from
the head of the queue while a running slot is free (at most `max_num_seqs` running) and the KV
cache has room for the request's whole reservation, prompt plus planned output (vLLM's scheduler
without chunked prefill or preemption; a request too big for the whole cache is refused). A step
is either

- a *prefill* of the requests just admitted: it costs `prefill_us_per_token` per prompt token,
  summed over them, and ends with each one's first token; the running ones wait meanwhile; or
- a *decode* step of every running request: it costs `decode_step_us + decode_us_per_sequence *
  running` and ends with one more token for each.

A request that has its planned tokens finishes, freeing its slot and its reservation. So at
concurrency 1, for a prompt of P tokens: TTFT = P * prefill_us_per_token and every ITL =
decode_step_us + decode_us_per_sequence, plus the transport's time.

*Planned output.* The engine "emits EOS" after `eos_after_tokens` tokens (0: never): a request
gets min(max_tokens, max(eos_after_tokens, min_tokens)) tokens, or max_tokens with `ignore_eos`.
The token bytes are a fixed ASCII text, cycled.

*Timing.* `SimScheduler` is pure (what runs next, what each step ends with) and is tested with a
simulated clock; `SimEngine` runs it on a thread. Steps run back to back on a deadline: a step
begins when the previous one was due to end (or when the first request comes to an idle engine),
so a sleep that overshoots is made up by the next step, up to `CATCH_UP_S`, and does not add up.

This module is copied beside sim_llm's model.py: standard library only.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields

__all__ = ["CATCH_UP_S", "TEXT", "SimEngine", "SimScheduler", "SimSequence", "SimTiming", "Step", "output_length"]

#: The bytes the engine generates, cycled (printable ASCII: each token is one character).
TEXT = b"The quick brown fox jumps over the lazy dog. "
#: How far a late step may start before "now" to make up a previous step's overshoot.
CATCH_UP_S = 0.001


@dataclass(frozen=True, slots=True)
class SimTiming:
    """The engine's costs and limits: config.pbtxt `parameters` of the same names."""

    prefill_us_per_token: float = 200.0
    decode_step_us: float = 10_000.0
    decode_us_per_sequence: float = 0.0
    max_num_seqs: int = 8
    kv_cache_tokens: int = 16_384
    eos_after_tokens: int = 48

    @classmethod
    def from_parameters(cls, parameters: Mapping[str, str]) -> SimTiming:
        """The timing that config parameters set (missing ones keep their defaults)."""
        values: dict[str, float | int] = {}
        for spec in fields(cls):
            raw = parameters.get(spec.name)
            if raw is None:
                continue
            kind = float if spec.type == "float" else int
            try:
                value = kind(raw)
            except ValueError:
                raise ValueError(f"sim_llm: parameter '{spec.name}' must be a number, got {raw!r:.40}") from None
            least = 1 if spec.name in ("max_num_seqs", "kv_cache_tokens") else 0
            if value < least:
                raise ValueError(f"sim_llm: parameter '{spec.name}' must be >= {least}, got {raw}")
            values[spec.name] = value
        return cls(**values)  # type: ignore[arg-type]

    def prefill_s(self, prompt_tokens: int) -> float:
        return prompt_tokens * self.prefill_us_per_token / 1e6

    def decode_step_s(self, running: int) -> float:
        return (self.decode_step_us + self.decode_us_per_sequence * running) / 1e6


def output_length(timing: SimTiming, max_tokens: int, min_tokens: int = 0, ignore_eos: bool = False) -> int:
    """How many tokens a request gets (see the module's docstring)."""
    if ignore_eos or timing.eos_after_tokens == 0:
        return max_tokens
    return min(max_tokens, max(timing.eos_after_tokens, min_tokens))


class SimSequence:
    """One request in the engine. `on_token(index, final)` is called (on the engine's thread) with
    each token's index, `final` with the last; `on_dropped()` when a cancelled request is dropped;
    `cancelled()` is asked before each step."""

    __slots__ = ("prompt_tokens", "output_tokens", "on_token", "on_dropped", "cancelled", "generated")

    def __init__(
        self,
        prompt_tokens: int,
        output_tokens: int,
        on_token: Callable[[int, bool], None],
        on_dropped: Callable[[], None] = lambda: None,
        cancelled: Callable[[], bool] = lambda: False,
    ) -> None:
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.on_token = on_token
        self.on_dropped = on_dropped
        self.cancelled = cancelled
        self.generated = 0

    @property
    def kv_tokens(self) -> int:
        """The KV-cache tokens it holds while running: prompt and planned output."""
        return self.prompt_tokens + self.output_tokens


@dataclass(frozen=True, slots=True)
class Step:
    """One engine iteration: `prefill` of newly admitted sequences, or `decode` of the running ones."""

    kind: str
    duration_s: float
    sequences: tuple[SimSequence, ...]


class SimScheduler:
    """What runs next, and what a step ends with. Pure: no clock, no thread."""

    def __init__(self, timing: SimTiming) -> None:
        self.timing = timing
        self.waiting: deque[SimSequence] = deque()
        self.running: list[SimSequence] = []
        self.kv_used = 0

    def add(self, sequence: SimSequence) -> None:
        """Queue a request; ValueError for one that could never fit the KV cache."""
        if sequence.kv_tokens > self.timing.kv_cache_tokens:
            raise ValueError(
                f"sim_llm: the request needs {sequence.kv_tokens} KV-cache tokens (prompt "
                f"{sequence.prompt_tokens} + output {sequence.output_tokens}), more than the "
                f"cache's {self.timing.kv_cache_tokens}; send a shorter prompt or a smaller max_tokens"
            )
        self.waiting.append(sequence)

    def next_step(self) -> Step | None:
        """Admit what fits, then the step to run: a prefill of the admitted, else a decode step of
        the running, else None (idle)."""
        timing = self.timing
        admitted: list[SimSequence] = []
        while (
            self.waiting
            and len(self.running) + len(admitted) < timing.max_num_seqs
            and self.kv_used + self.waiting[0].kv_tokens <= timing.kv_cache_tokens
        ):
            sequence = self.waiting.popleft()
            self.kv_used += sequence.kv_tokens
            admitted.append(sequence)
        if admitted:
            return Step("prefill", timing.prefill_s(sum(s.prompt_tokens for s in admitted)), tuple(admitted))
        if self.running:
            return Step("decode", timing.decode_step_s(len(self.running)), tuple(self.running))
        return None

    def complete(self, step: Step) -> list[tuple[SimSequence, int, bool]]:
        """The step has run: each of its sequences has one more token. Returns (sequence, token
        index, final) for each; the finished ones leave and free their reservation."""
        emitted: list[tuple[SimSequence, int, bool]] = []
        for sequence in step.sequences:
            if step.kind == "decode" and sequence not in self.running:
                continue  # dropped while the step ran
            index = sequence.generated
            sequence.generated += 1
            final = sequence.generated >= sequence.output_tokens
            emitted.append((sequence, index, final))
            if final:
                self._release(sequence)
            elif step.kind == "prefill":
                self.running.append(sequence)
        return emitted

    def drop(self, sequence: SimSequence) -> None:
        """Remove a request wherever it is (its client went away)."""
        if sequence in self.waiting:
            self.waiting.remove(sequence)
        elif sequence in self.running:
            self._release(sequence)

    def _release(self, sequence: SimSequence) -> None:
        if sequence in self.running:
            self.running.remove(sequence)
        self.kv_used -= sequence.kv_tokens


class SimEngine:
    """`SimScheduler` on a daemon thread, sleeping each step's cost."""

    def __init__(self, timing: SimTiming, clock: Callable[[], float] = time.perf_counter) -> None:
        self.scheduler = SimScheduler(timing)
        self._clock = clock
        self._changed = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="sim-engine", daemon=True)
        self._thread.start()

    def submit(self, sequence: SimSequence) -> None:
        """Queue a request (ValueError if it can never fit)."""
        with self._changed:
            self.scheduler.add(sequence)
            self._changed.notify()

    def stop(self) -> None:
        with self._changed:
            self._stopping = True
            self._changed.notify()
        self._thread.join(5)

    def _run(self) -> None:
        deadline: float | None = None  # when the previous step was due to end; None when idle
        while True:
            self._drop_cancelled()
            with self._changed:
                step = self.scheduler.next_step()
                while step is None and not self._stopping:
                    deadline = None
                    self._changed.wait()
                    step = self.scheduler.next_step()
                if self._stopping or step is None:
                    return
            now = self._clock()
            begin = now if deadline is None else max(deadline, now - CATCH_UP_S)
            deadline = begin + step.duration_s
            remaining = deadline - self._clock()
            if remaining > 0:
                time.sleep(remaining)
            with self._changed:
                emitted = self.scheduler.complete(step)
            for sequence, index, final in emitted:
                try:
                    sequence.on_token(index, final)
                except Exception:  # the request's sender is gone: nothing more to send it
                    with self._changed:
                        self.scheduler.drop(sequence)

    def _drop_cancelled(self) -> None:
        with self._changed:
            candidates = [*self.scheduler.running, *self.scheduler.waiting]
        for sequence in candidates:
            if sequence.cancelled():
                with self._changed:
                    self.scheduler.drop(sequence)
                try:
                    sequence.on_dropped()
                except Exception:  # its sender is gone already
                    pass
