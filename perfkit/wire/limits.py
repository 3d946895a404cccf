"""What one reply may cost the load generator: the bounds its lean clients (`http_pool`, `grpc.connection`)
hold a server to, so that a hostile or broken server makes a request fail, counted, and never makes
the load generator grow without bound or hang.

Why these values:
- `MAX_REPLY_HEAD`: an inference server's reply head (status line and headers, interim replies such
  as 100 Continue included) is well under 1 KiB; aiohttp's client refuses header lines over 8 KiB and
  h11 heads over 16 KiB. 64 KiB leaves room for any proxy's headers and still bounds an endless
  header line, endless headers or an endless run of 1xx replies.
- `MAX_REPLY_BODY`: an inference answer is a protobuf message over gRPC, which cannot reach 2 GiB,
  and tritonclient and perf_analyzer accept up to that (INT32_MAX) where grpc's 4 MiB default would
  refuse real image outputs. Half of it, 1 GiB, is larger than any answer a load test measures, and it
  bounds what one outstanding request may hold: a connection (HTTP) or stream (gRPC) holds at most
  one reply, so the load generator holds at most this much per outstanding request.
- `MAX_CONTROL_REPLY`: a control-plane answer (health, metadata, config, statistics, the repository
  index, read through aiohttp and grpc.aio) is JSON or protobuf of a few KiB, a few MiB for the
  statistics of hundreds of models; 64 MiB bounds one that never ends.
- `LOAD_TIMEOUT_S`: how long a repository load may take to answer. A load builds sessions and
  instances and runs warmup, which takes far longer than an inference (`--request-timeout`); 300 s
  bounds a load that never ends.
"""

from __future__ import annotations

__all__ = ["LOAD_TIMEOUT_S", "MAX_CONTROL_REPLY", "MAX_REPLY_BODY", "MAX_REPLY_HEAD"]

MAX_REPLY_HEAD = 64 << 10
MAX_REPLY_BODY = 1 << 30
MAX_CONTROL_REPLY = 64 << 20
LOAD_TIMEOUT_S = 300.0
