"""PING policy for a server's HTTP/2 connection, grpc core's (and so tritonserver's): keepalive
pings it sends, and strikes against a peer that pings too often (grpc/doc/keepalive.md,
chttp2's ping_abuse_policy). `v2kit.h2.connection` applies a `PingPolicy` when it is given one;
a connection without (perfkit's client) sends no pings and answers every PING.

- *Keepalive.* Every `keepalive_time_s` a PING goes out (only while calls are open unless
  `permit_without_calls`); its ACK not back within `keepalive_timeout_s` ends the connection.
  At most `max_pings_without_data` of them go out with no HEADERS or DATA sent in between
  (0: no such cap); past it the keepalive waits for the next period.
- *Ping strikes.* A PING that comes sooner than `min_recv_ping_interval_s` after the last one,
  with no HEADERS or DATA sent since, is a strike (with no calls open and without
  `permit_without_calls`, sooner than two hours, as TCP keep-alive's floor, RFC 1122); more than
  `max_ping_strikes` strikes (0: any number) end the connection with GOAWAY ENHANCE_YOUR_CALM and
  the debug data "too_many_pings", on which grpc clients double their keepalive time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["GRPC_SERVER_PINGS", "IDLE_PING_INTERVAL_S", "TOO_MANY_PINGS", "PingPolicy", "PingStrikes"]

#: The least time between a client's PINGs while it has no calls open and keepalive without calls
#: is not permitted: RFC 1122's floor for TCP keep-alive, grpc core's too.
IDLE_PING_INTERVAL_S = 7200.0
#: GOAWAY's debug data past the strikes: grpc clients match it to back off.
TOO_MANY_PINGS = b"too_many_pings"


@dataclass(frozen=True, slots=True)
class PingPolicy:
    """One server connection's pings; the defaults are grpc core's and tritonserver's (its
    --grpc-keepalive-* and --grpc-http2-*-ping* flags, in seconds here where they are in ms)."""

    keepalive_time_s: float = 7200.0
    keepalive_timeout_s: float = 20.0
    permit_without_calls: bool = False
    max_pings_without_data: int = 2
    min_recv_ping_interval_s: float = 300.0
    max_ping_strikes: int = 2


GRPC_SERVER_PINGS = PingPolicy()


class PingStrikes:
    """The strikes a peer's PINGs earn (see the module's docstring); `data_sent` is the count of
    HEADERS and DATA we have sent, which the connection keeps: any sent since the last PING
    forgives the strikes, as grpc core resets them when it writes a header or data frame."""

    __slots__ = ("_policy", "_last_at", "_strikes", "_data_seen")

    def __init__(self, policy: PingPolicy) -> None:
        self._policy = policy
        self._last_at = -math.inf
        self._strikes = 0
        self._data_seen = 0

    def too_many(self, now: float, data_sent: int, calls_open: bool) -> bool:
        """Count a PING that came at `now`; True once it is one strike past the policy's."""
        policy = self._policy
        if data_sent != self._data_seen:
            self._data_seen = data_sent
            self._last_at, self._strikes = -math.inf, 0
        idle = not calls_open and not policy.permit_without_calls
        allowed_at = self._last_at + (IDLE_PING_INTERVAL_S if idle else policy.min_recv_ping_interval_s)
        self._last_at = now
        if allowed_at <= now:
            return False
        self._strikes += 1
        return policy.max_ping_strikes != 0 and self._strikes > policy.max_ping_strikes
