"""The scheduling part of a Triton model config: max_batch_size, dynamic_batching and its queue policy;
and the batch-forming rules `scheduler.Scheduler` applies with it.

*Which requests form the batch?* `take_batch` replays Triton's `GetDynamicBatch` (core
`dynamic_batch_scheduler.cc`) on the head of the queue:

- Requests join in arrival order while they are batchable with the first one (same input names,
  dtypes and shapes apart from dim 0; Triton enforces equal shapes for non-ragged inputs) and
  the total of their dim 0 stays within `max_batch_size`. The first mismatch ends the scan:
  Triton never reorders to find a better partner.
- If a prefix totals a preferred batch size, the largest such prefix is sent at once.
  Without configured preferred sizes, Triton's config normaliser uses `[max_batch_size]`.
- If the scan passes the largest preferred size first, the prefix before that point counts as
  the preferred batch, so preferred sizes also cap batches (Triton's `max_preferred_batch_size_`).
- Otherwise the whole prefix is sent when it cannot grow (size limit or mismatch), when
  `max_queue_delay` is 0, or when the oldest request in it has waited the delay. Else the
  scheduler sleeps until that moment; an arrival that completes a preferred batch sends it
  earlier. Once the delay has expired, the whole prefix (up to `max_batch_size`) goes, even if a
  smaller preferred size fits.

Without `dynamic_batching` (or with `max_batch_size: 0`) each request runs alone, FIFO, on the
next free instance. Its own dim 0 is still its batch size when `max_batch_size > 0`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from tritonclient.grpc import model_config_pb2

from reference_server.errors import InvalidArgument, ModelConfigError
from reference_server.scheduling.execute import Tensors

if TYPE_CHECKING:
    from reference_server.scheduling.queued import QueuedRequest

__all__ = ["BatchingPolicy", "TimeoutAction", "batch_key", "take_batch"]

TimeoutAction = Literal["REJECT", "DELAY"]


@dataclass(frozen=True, slots=True)
class BatchingPolicy:
    """How a model version's requests are queued and batched (see `Scheduler`)."""

    max_batch_size: int = 0
    dynamic: bool = False
    #: As configured (deduplicated, ascending); empty means Triton's default `[max_batch_size]`.
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_ns: int = 0
    preserve_ordering: bool = False
    #: 0 = unbounded.
    max_queue_size: int = 0
    #: 0 = no timeout.
    default_timeout_ns: int = 0
    timeout_action: TimeoutAction = "REJECT"
    allow_timeout_override: bool = False
    #: model_transaction_policy { decoupled: true }: 0..N responses per request (`Scheduler.infer_stream`).
    decoupled: bool = False

    def __post_init__(self) -> None:
        if self.max_batch_size < 0:
            raise ModelConfigError(f"max_batch_size must be >= 0, got {self.max_batch_size}")
        for size in self.preferred_batch_sizes:
            if not 0 < size <= self.max_batch_size:
                raise ModelConfigError(
                    f"dynamic_batching preferred_batch_size {size} must be positive and <= "
                    f"max_batch_size ({self.max_batch_size})"
                )
        if self.timeout_action not in ("REJECT", "DELAY"):
            raise ModelConfigError(f"timeout_action must be REJECT or DELAY, got {self.timeout_action!r}")

    @classmethod
    def from_config(cls, cfg: model_config_pb2.ModelConfig) -> BatchingPolicy:
        """Read `max_batch_size` and `dynamic_batching` from a parsed config.pbtxt."""
        decoupled = cfg.model_transaction_policy.decoupled
        if not cfg.HasField("dynamic_batching"):
            return cls(max_batch_size=cfg.max_batch_size, decoupled=decoupled)
        db = cfg.dynamic_batching
        qp = db.default_queue_policy
        return cls(
            max_batch_size=cfg.max_batch_size,
            dynamic=True,
            preferred_batch_sizes=tuple(sorted(set(db.preferred_batch_size))),
            max_queue_delay_ns=db.max_queue_delay_microseconds * 1000,
            preserve_ordering=db.preserve_ordering,
            max_queue_size=qp.max_queue_size,
            default_timeout_ns=qp.default_timeout_microseconds * 1000,
            timeout_action="DELAY" if qp.timeout_action == qp.DELAY else "REJECT",
            allow_timeout_override=qp.allow_timeout_override,
            decoupled=decoupled,
        )


def batch_key(policy: BatchingPolicy, batching: bool, inputs: Tensors) -> tuple[int, object]:
    """A request's batch size and batching key (what it must share with others to batch), or
    InvalidArgument for a bad batch dimension. `batching`: the dynamic batcher is on."""
    max_batch_size = policy.max_batch_size
    if max_batch_size == 0:
        return 1, None
    batch_size = -1
    for name, array in inputs.items():
        if array.ndim == 0:
            raise InvalidArgument(f"input '{name}' has no batch dimension but the model batches")
        if batch_size < 0:
            batch_size = array.shape[0]
        elif array.shape[0] != batch_size:
            raise InvalidArgument(
                f"input '{name}' batch size {array.shape[0]} does not match other inputs' batch size {batch_size}"
            )
    if batch_size < 1:
        raise InvalidArgument("inference request batch-size must be >= 1")
    if batch_size > max_batch_size:
        raise InvalidArgument(f"inference request batch-size must be <= {max_batch_size}")
    if not batching:
        return batch_size, None
    if len(inputs) == 1:
        ((name, array),) = inputs.items()
        return batch_size, ((name, array.dtype, array.shape[1:]),)
    # Sorted so that two clients listing the same inputs in another order still batch.
    return batch_size, tuple(sorted((n, a.dtype, a.shape[1:]) for n, a in inputs.items()))


def take_batch(
    policy: BatchingPolicy,
    preferred: frozenset[int],
    max_preferred: int,
    candidates: Iterable[QueuedRequest],
    now: int,
    closing: bool,
) -> tuple[int, int]:
    """(count, wake_ns): how many requests from the head of `candidates` to batch now (see the
    module's docstring); with count 0, the moment (perf_counter_ns) to look again.

    `preferred` holds the preferred batch sizes (Triton's default `{max_batch_size}` without any),
    `max_preferred` the largest. While `closing`, nobody else will come to fill a batch: it goes."""
    max_batch_size = policy.max_batch_size
    total = count = best = 0
    oldest = now
    key: object = None
    send_now = False
    for request in candidates:
        size = request.batch_size
        if count == 0:
            key = request.key
        else:
            if best == 0 and total + size > max_preferred:
                best = count  # what fits under the largest preferred size
            if total + size > max_batch_size or request.key != key:
                send_now = True
                break
        total += size
        count += 1
        if request.enqueued_ns < oldest:
            oldest = request.enqueued_ns
        if total in preferred:
            best = count
    delay = policy.max_queue_delay_ns
    delay_expired = delay > 0 and (now - oldest >= delay or closing)
    if best and not delay_expired:
        return best, 0
    if send_now or total >= max_preferred or delay == 0 or delay_expired:
        return count, 0
    return 0, oldest + delay
