"""perf_analyzer's flags that `perfkit sweep`'s own do not cover, so that a perf_analyzer command
line runs unchanged: accepted with one note where they have no meaning here (`--async`, `--sync`,
`--max-threads`: perfkit's client is asyncio), mapped where they do (`--service-kind openai` with
perf_analyzer's relative `--endpoint` picks the generative endpoint type), and refused with the
reason otherwise, as a usage error of the sweep (`--service-kind tfserving|torchserve|triton_c_api`,
`--periodic-concurrency-range`, `--request-period`). perf_analyzer's `-v` and `--verbose-csv` are
the sweep's own output flags.
"""

from __future__ import annotations

import argparse

from perfkit.errors import PerfkitError

__all__ = ["add_perf_analyzer_arguments", "endpoint_path", "endpoint_type", "perf_analyzer_notes"]

#: perf_analyzer's --service-kind values perfkit cannot measure, and why.
_REFUSED_SERVICE_KINDS = {
    "tfserving": "TensorFlow Serving's API is not KServe v2; perfkit measures KServe v2 (triton) and "
    "OpenAI-compatible (openai) servers",
    "torchserve": "TorchServe's API is not KServe v2; perfkit measures KServe v2 (triton) and "
    "OpenAI-compatible (openai) servers",
    "triton_c_api": "the C API runs Triton inside perf_analyzer's process; perfkit measures a server over the "
    "network: start tritonserver and give -u",
}
#: perf_analyzer's --endpoint paths under --service-kind openai, and the --endpoint-type they mean.
_OPENAI_ENDPOINTS = (("chat/completions", "chat"), ("completions", "completions"), ("embeddings", "embeddings"))


def _service_kind(text: str) -> str:
    if text in _REFUSED_SERVICE_KINDS:
        raise argparse.ArgumentTypeError(f"'{text}' is not supported: {_REFUSED_SERVICE_KINDS[text]}")
    if text not in ("triton", "openai"):
        raise argparse.ArgumentTypeError(f"invalid choice: '{text}' (choose triton or openai)")
    return text


def _periodic_concurrency(text: str) -> str:
    raise argparse.ArgumentTypeError(
        "not supported: perfkit measures each concurrency level until it is stable, and does not ramp "
        "concurrency within one run by responses received; use --concurrency-range START:END:STEP "
        "(with -i grpc --streaming for a decoupled model)"
    )


def _request_period(text: str) -> str:
    raise argparse.ArgumentTypeError("not supported: it paces --periodic-concurrency-range, which perfkit does not do")


def add_perf_analyzer_arguments(p: argparse.ArgumentParser) -> None:
    """perf_analyzer's flags that perfkit's own do not cover, so that its command lines run unchanged:
    accepted with a note where they have no meaning here, mapped where they do, refused with the
    reason otherwise (a usage error of this command)."""
    g = p.add_argument_group("perf_analyzer's other flags (so its command lines run unchanged)")
    g.add_argument("-a", "--async", dest="pa_async", action="store_true",
                   help="accepted, no effect: perfkit's client is asynchronous (asyncio) at every concurrency")  # fmt: skip
    g.add_argument("--sync", dest="pa_sync", action="store_true", help="accepted, no effect (see --async)")
    g.add_argument("--max-threads", type=int, metavar="N", help="accepted, no effect: no threads send requests here")
    g.add_argument("--service-kind", type=_service_kind, default="triton", metavar="triton|openai",
                   help="triton: KServe v2 (default); openai: --endpoint v1/chat/completions, v1/completions or "
                   "v1/embeddings picks the --endpoint-type")  # fmt: skip
    g.add_argument("--periodic-concurrency-range", type=_periodic_concurrency, metavar="START:END:STEP",
                   help="not supported (use --concurrency-range)")  # fmt: skip
    g.add_argument("--request-period", type=_request_period, metavar="N", help="not supported")


def perf_analyzer_notes(args: argparse.Namespace) -> list[str]:
    """One note naming the perf_analyzer flags given that have no meaning here."""
    ignored = [flag for flag, given in (("--async", args.pa_async), ("--sync", args.pa_sync),
               ("--max-threads", args.max_threads is not None)) if given]  # fmt: skip
    if not ignored:
        return []
    return [f"note: {', '.join(ignored)} ignored: perfkit's client is one asyncio event loop, which keeps any "
            "concurrency outstanding without threads"]  # fmt: skip


def endpoint_path(args: argparse.Namespace) -> str:
    """--endpoint; perf_analyzer's under --service-kind openai is relative to -u (v1/chat/completions)."""
    relative = args.service_kind == "openai" and args.endpoint[:1] not in ("", "/")
    return f"/{args.endpoint}" if relative else str(args.endpoint)


def endpoint_type(args: argparse.Namespace) -> str:
    """--endpoint-type, or under --service-kind openai the one perf_analyzer's --endpoint names."""
    if args.service_kind != "openai" or args.endpoint_type != "kserve-infer":
        return str(args.endpoint_type)
    path = args.endpoint.strip("/")
    for suffix, kind in _OPENAI_ENDPOINTS:
        if path.endswith(suffix):
            return kind
    raise PerfkitError("--service-kind openai needs --endpoint v1/chat/completions, v1/completions or "
                       "v1/embeddings (or give --endpoint-type)")  # fmt: skip
