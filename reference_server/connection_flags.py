"""What one client connection may make a front end hold or do, as server flags: the HTTP/1.1 front
end's request-head sizes, timers and pipelined requests (`frontends/http/limits.py`; docs/reliability.md
lists them), and the gRPC front end's HTTP/2 limits: what a connection may open, send unread,
reset or leave empty before the engine (`v2kit.h2`) refuses it. tritonserver 2.51 has no flag for
any of them (its `--grpc-http2-*` flags tune keepalive pings, which this server does not send:
`triton_flags`), so they are named in the same style. The HTTP/2 defaults are the engine's, which
follow grpc core and nghttp2 (`v2kit.h2.rules`); docs/server.md, "HTTP/2 limits", lists them.

`add_arguments` adds them to `config.build_parser`; `config_fields` reads them back as
ServerConfig's `http_*` limit fields, `grpc_max_concurrent_streams` and `grpc_http2_limits`.
"""

from __future__ import annotations

import argparse
from typing import Any

from reference_server.frontends.grpc.server import MAX_STREAMS
from reference_server.frontends.http.limits import DEFAULT_LIMITS
from reference_server.triton_flags import at_least, positive_float
from v2kit.h2.rules import DEFAULT_H2_LIMITS, H2Limits

__all__ = ["add_arguments", "config_fields"]


_at_least_one = at_least(1)


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
        "grpc_max_concurrent_streams": args.grpc_http2_max_concurrent_streams,
        "grpc_http2_limits": H2Limits(
            max_induced=args.grpc_http2_max_unread_answers,
            max_empty_frames=args.grpc_http2_max_empty_frames,
            reset_burst=args.grpc_http2_max_reset_burst,
            reset_rate_per_s=args.grpc_http2_max_reset_rate,
            max_header_block=args.grpc_http2_max_header_block_size,
        ),
    }
