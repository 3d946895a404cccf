"""What one client connection may make a front end hold or do, as server flags: the HTTP/1.1 front
end's request-head sizes, timers and pipelined requests (`frontends/http/limits.py`; docs/reliability.md
lists them), and the gRPC front end's HTTP/2 limits: what a connection may open, send unread,
reset, leave empty or send unread before the engine (`v2kit.h2`) refuses it or makes it wait.
tritonserver 2.51 has no flag for any of them, so they are named in the style of its `--grpc-http2-*`
flags. The HTTP/2 defaults are the engine's, which follow grpc core and nghttp2 (`v2kit.h2.rules`).
And tritonserver's own keepalive and ping-strike flags (`--grpc-keepalive-*`, `--grpc-http2-*ping*`),
with its defaults, which are grpc core's (`v2kit.h2.pings`); docs/server.md, "HTTP/2 limits",
lists them all.

`add_arguments` adds them to `config.build_parser`; `config_fields` reads them back as
ServerConfig's `http_*` limit fields, `grpc_max_concurrent_streams` and `grpc_http2_limits`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from reference_server.frontends.grpc.server import MAX_STREAMS
from reference_server.frontends.http.limits import DEFAULT_LIMITS
from reference_server.triton_flags import at_least, parse_bool, positive_float
from v2kit.h2.frames import DEFAULT_WINDOW, MAX_WINDOW
from v2kit.h2.pings import GRPC_SERVER_PINGS, PingPolicy
from v2kit.h2.rules import DEFAULT_H2_LIMITS, H2Limits

__all__ = ["add_arguments", "config_fields"]


_at_least_one = at_least(1)
_non_negative = at_least(0)


def _window(minimum: int) -> Callable[[str], int]:
    """An argparse type: a window size from `minimum` to 2^31-1 (RFC 9113 §6.9.1)."""
    whole_number = at_least(minimum)

    def window(text: str) -> int:
        value = whole_number(text)
        if value > MAX_WINDOW:
            raise argparse.ArgumentTypeError(f"expected {MAX_WINDOW} (2^31-1) or less, got {value}")
        return value

    return window


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The HTTP/1.1 limits, then the HTTP/2 ones, each in a group of their own."""
    http = parser.add_argument_group("HTTP/1.1 limits, per client connection (docs/reliability.md)")
    http.add_argument(
        "--http-max-request-line",
        type=int,
        default=DEFAULT_LIMITS.max_request_line,
        metavar="BYTES",
        help="longest HTTP request target (path and query); longer gets 414 and the connection closes",
    )
    http.add_argument(
        "--http-max-header-line",
        type=int,
        default=DEFAULT_LIMITS.max_header_line,
        metavar="BYTES",
        help="longest HTTP header line (name and value); longer gets 431 and the connection closes",
    )
    http.add_argument(
        "--http-max-head-size",
        type=int,
        default=DEFAULT_LIMITS.max_head_bytes,
        metavar="BYTES",
        help="largest HTTP request head (target and every header line); larger gets 431 and the connection closes",
    )
    http.add_argument(
        "--http-max-headers",
        type=int,
        default=DEFAULT_LIMITS.max_headers,
        metavar="N",
        help="most header lines in an HTTP request; more get 431 and the connection closes",
    )
    http.add_argument(
        "--http-head-timeout-secs",
        type=float,
        default=DEFAULT_LIMITS.head_timeout_s,
        metavar="SECONDS",
        help="an HTTP request head not all in within SECONDS of its first byte gets 408 and the connection closes",
    )
    http.add_argument(
        "--http-idle-timeout-secs",
        type=float,
        default=DEFAULT_LIMITS.idle_timeout_s,
        metavar="SECONDS",
        help="a kept-alive HTTP connection with no request for SECONDS is closed",
    )
    http.add_argument(
        "--http-max-pipelined-requests",
        type=int,
        default=DEFAULT_LIMITS.max_pipelined,
        metavar="N",
        help="HTTP requests a connection may have waiting behind the one being served; past N it is not read "
        "until half are answered",
    )
    http.add_argument(
        "--http-max-unparsed-bytes",
        type=int,
        default=DEFAULT_LIMITS.max_unparsed,
        metavar="BYTES",
        help="bytes of a connection's reads kept unparsed while its pipelined requests wait; past BYTES it is "
        "answered 429 after the requests already read and closed",
    )
    group = parser.add_argument_group("gRPC HTTP/2 limits, per client connection (docs/server.md: 'HTTP/2 limits')")
    limits = DEFAULT_H2_LIMITS
    group.add_argument(
        "--grpc-http2-max-concurrent-streams", type=_at_least_one, default=MAX_STREAMS, metavar="N",
        help="streams (calls) a client may have open at once on one connection, advertised as "
        "SETTINGS_MAX_CONCURRENT_STREAMS; one more is reset with REFUSED_STREAM",
    )  # fmt: skip
    group.add_argument(
        "--grpc-http2-max-header-block-size", type=_at_least_one, default=limits.max_header_block, metavar="BYTES",
        help="largest header block (HEADERS and its CONTINUATIONs, compressed) a call may send; larger ends the "
        "connection with GOAWAY PROTOCOL_ERROR",
    )  # fmt: skip
    group.add_argument(
        "--grpc-http2-max-unread-answers", type=_at_least_one, default=limits.max_induced, metavar="N",
        help="answers to the client's own frames (PING and SETTINGS ACKs, stream resets) that may wait behind "
        "output it has not read; one more ends the connection with GOAWAY ENHANCE_YOUR_CALM (PING/SETTINGS floods)",
    )  # fmt: skip
    group.add_argument(
        "--grpc-http2-max-empty-frames", type=_at_least_one, default=limits.max_empty_frames, metavar="N",
        help="DATA and CONTINUATION frames in a row that carry and end nothing; one more ends the connection "
        "with GOAWAY ENHANCE_YOUR_CALM (CVE-2019-9518)",
    )  # fmt: skip
    group.add_argument(
        "--grpc-http2-max-reset-burst", type=_at_least_one, default=limits.reset_burst, metavar="N",
        help="streams a client may reset at once, before --grpc-http2-max-reset-rate applies; past both, "
        "GOAWAY ENHANCE_YOUR_CALM (rapid reset, CVE-2023-44487)",
    )  # fmt: skip
    group.add_argument(
        "--grpc-http2-max-reset-rate", type=positive_float, default=limits.reset_rate_per_s, metavar="PER_SECOND",
        help="streams a client may reset per second once its --grpc-http2-max-reset-burst is spent",
    )  # fmt: skip
    group.add_argument(
        "--grpc-http2-stream-window", type=_window(1), default=limits.stream_window, metavar="BYTES",
        help="request bytes a call may send that the server has not taken yet, advertised as "
        "SETTINGS_INITIAL_WINDOW_SIZE; a streaming call's are taken as its model reads them, so a client that "
        "sends faster waits; more is FLOW_CONTROL_ERROR",
    )  # fmt: skip
    group.add_argument(
        "--grpc-http2-connection-window", type=_window(DEFAULT_WINDOW), default=limits.connection_window,
        metavar="BYTES",
        help="the same across every call on one connection, opened by a WINDOW_UPDATE on stream 0 "
        "(65535 at least: HTTP/2 starts there); more ends the connection with FLOW_CONTROL_ERROR",
    )  # fmt: skip
    pings = parser.add_argument_group(
        "gRPC keepalive and ping strikes, tritonserver's (docs/server.md: 'HTTP/2 limits')"
    )
    defaults = GRPC_SERVER_PINGS
    pings.add_argument(
        "--grpc-keepalive-time", type=_at_least_one, default=_ms(defaults.keepalive_time_s), metavar="MS",
        help="the server sends a keepalive PING on a connection every MS while a call is open",
    )  # fmt: skip
    pings.add_argument(
        "--grpc-keepalive-timeout", type=_at_least_one, default=_ms(defaults.keepalive_timeout_s), metavar="MS",
        help="a keepalive PING not acknowledged within MS ends the connection (GOAWAY)",
    )  # fmt: skip
    pings.add_argument(
        "--grpc-keepalive-permit-without-calls", type=parse_bool, default=defaults.permit_without_calls,
        metavar="BOOL",
        help="keepalive PINGs also while no call is open; and a client with no call open may ping every "
        "--grpc-http2-min-recv-ping-interval-without-data (else every 2 hours)",
    )  # fmt: skip
    pings.add_argument(
        "--grpc-http2-max-pings-without-data", type=_non_negative, default=defaults.max_pings_without_data,
        metavar="N",
        help="keepalive PINGs the server sends with no HEADERS or DATA sent between them; then it waits for "
        "some (0: no such cap)",
    )  # fmt: skip
    pings.add_argument(
        "--grpc-http2-min-recv-ping-interval-without-data", type=_non_negative,
        default=_ms(defaults.min_recv_ping_interval_s), metavar="MS",
        help="a client's PING sooner than MS after its last one, with no HEADERS or DATA sent since, is a strike",
    )  # fmt: skip
    pings.add_argument(
        "--grpc-http2-max-ping-strikes", type=_non_negative, default=defaults.max_ping_strikes, metavar="N",
        help="strikes a client may have; one more ends the connection with GOAWAY ENHANCE_YOUR_CALM "
        "'too_many_pings' (0: any number)",
    )  # fmt: skip


def config_fields(args: argparse.Namespace) -> dict[str, Any]:
    """ServerConfig's fields from the flags `add_arguments` defines."""
    return {
        "http_max_request_line": args.http_max_request_line,
        "http_max_header_line": args.http_max_header_line,
        "http_max_head_size": args.http_max_head_size,
        "http_max_headers": args.http_max_headers,
        "http_head_timeout_secs": args.http_head_timeout_secs,
        "http_idle_timeout_secs": args.http_idle_timeout_secs,
        "http_max_pipelined_requests": args.http_max_pipelined_requests,
        "http_max_unparsed_bytes": args.http_max_unparsed_bytes,
        "grpc_max_concurrent_streams": args.grpc_http2_max_concurrent_streams,
        "grpc_http2_limits": H2Limits(
            max_induced=args.grpc_http2_max_unread_answers,
            max_empty_frames=args.grpc_http2_max_empty_frames,
            reset_burst=args.grpc_http2_max_reset_burst,
            reset_rate_per_s=args.grpc_http2_max_reset_rate,
            max_header_block=args.grpc_http2_max_header_block_size,
            stream_window=args.grpc_http2_stream_window,
            connection_window=args.grpc_http2_connection_window,
            pings=PingPolicy(
                keepalive_time_s=args.grpc_keepalive_time / 1000,
                keepalive_timeout_s=args.grpc_keepalive_timeout / 1000,
                permit_without_calls=args.grpc_keepalive_permit_without_calls,
                max_pings_without_data=args.grpc_http2_max_pings_without_data,
                min_recv_ping_interval_s=args.grpc_http2_min_recv_ping_interval_without_data / 1000,
                max_ping_strikes=args.grpc_http2_max_ping_strikes,
            ),
        ),
    }
