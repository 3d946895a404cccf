"""The gRPC front end's HTTP/2 limits as server flags: what one client connection may open, send
unread, reset or leave empty before the engine (`v2kit.h2`) refuses it. tritonserver 2.51 has no
flag for any of them (its `--grpc-http2-*` flags tune keepalive pings, which this server does not
send: `triton_flags`), so they are named in the same style. Their defaults are the engine's, which
follow grpc core and nghttp2 (`v2kit.h2.rules`); docs/server.md, "HTTP/2 limits", lists them.

`add_arguments` adds them to `config.build_parser`; `config_fields` reads them back as
`ServerConfig.grpc_max_concurrent_streams` and `ServerConfig.grpc_http2_limits`.
"""

from __future__ import annotations

import argparse
from typing import Any

from reference_server.frontends.grpc.server import MAX_STREAMS
from v2kit.h2.rules import DEFAULT_H2_LIMITS, H2Limits

__all__ = ["add_arguments", "config_fields"]


def _at_least_one(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got '{text}'") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected 1 or more, got {value}")
    return value


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got '{text}'") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The HTTP/2 limits, in a group of their own."""
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
        "--grpc-http2-max-reset-rate", type=_positive, default=limits.reset_rate_per_s, metavar="PER_SECOND",
        help="streams a client may reset per second once its --grpc-http2-max-reset-burst is spent",
    )  # fmt: skip


def config_fields(args: argparse.Namespace) -> dict[str, Any]:
    """ServerConfig's fields from the flags `add_arguments` defines."""
    return {
        "grpc_max_concurrent_streams": args.grpc_http2_max_concurrent_streams,
        "grpc_http2_limits": H2Limits(
            max_induced=args.grpc_http2_max_unread_answers,
            max_empty_frames=args.grpc_http2_max_empty_frames,
            reset_burst=args.grpc_http2_max_reset_burst,
            reset_rate_per_s=args.grpc_http2_max_reset_rate,
            max_header_block=args.grpc_http2_max_header_block_size,
        ),
    }
