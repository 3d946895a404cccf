"""The scheduling part of a Triton model config: max_batch_size, dynamic_batching and its queue policy."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tritonclient.grpc import model_config_pb2

from reference_server.errors import ModelConfigError

__all__ = ["BatchingPolicy", "TimeoutAction"]

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
