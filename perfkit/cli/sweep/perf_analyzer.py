"""perf_analyzer's flags that `perfkit sweep`'s own do not cover, so that a perf_analyzer command
line runs unchanged. `PERF_ANALYZER_FLAGS` says, for every flag perf_analyzer lists, which of four
things the sweep does with it: the sweep's own flag of that name, mapped onto one of the sweep's
(perf_analyzer's deprecated `-t`, `-c`, `-d`, `-z`, `--data-directory`), accepted with one note where
it has no meaning here (`--async`, `--sync`, `--max-threads`: perfkit's client is asyncio; the trace
flags: perfkit leaves the server's trace settings alone), or refused with the reason, as a usage
error of the sweep (`--service-kind tfserving`, `--periodic-concurrency-range`, `--enable-mpi`).
`resolved` turns the mapped ones into the sweep's own before the spec is built; `perf_analyzer_notes`
says what was mapped or ignored.
"""

from __future__ import annotations

import argparse
import copy
from pathlib import Path

from perfkit._version import __version__
from perfkit.errors import PerfkitError

__all__ = [
    "PERF_ANALYZER_FLAGS",
    "add_perf_analyzer_arguments",
    "endpoint_path",
    "endpoint_type",
    "perf_analyzer_notes",
    "resolved",
]

_OWN, _MAPPED, _IGNORED, _REFUSED = "own", "mapped", "ignored", "refused"
_ASYNCIO = "perfkit's client is one asyncio event loop, which keeps any concurrency outstanding without threads"
#: Every flag of perf_analyzer 2.48 (its --help, and `--enable-mpi`, which its parser takes unlisted),
#: and what `perfkit sweep` does with it: ("own", "") the sweep's flag of that name; ("mapped", what)
#: read as the sweep's flags named; ("ignored", why) accepted, with one note saying why; ("refused",
#: why) a usage error of the sweep saying why. A test holds this to perf_analyzer's --help.
PERF_ANALYZER_FLAGS: dict[str, tuple[str, str]] = {
    **dict.fromkeys(
        """-m -x --bls-composing-models --endpoint -v -p --measurement-interval --measurement-mode
        --measurement-request-count --concurrency-range --request-parameter --request-rate-range
        --request-distribution --request-intervals --serial-sequences --binary-search --num-of-sequences -l
        --latency-threshold -s --stability-percentage -r --max-trials --percentile --request-count -b --input-data
        --shared-memory --output-shared-memory-size --shape --sequence-length --sequence-length-variation
        --sequence-id-range --string-length --string-data --input-tensor-format --output-tensor-format -u -i
        --ssl-grpc-use-ssl --ssl-grpc-root-certifications-file --ssl-grpc-private-key-file
        --ssl-grpc-certificate-chain-file --ssl-https-verify-peer --ssl-https-verify-host
        --ssl-https-ca-certificates-file --ssl-https-client-certificate-file --ssl-https-client-certificate-type
        --ssl-https-private-key-file --ssl-https-private-key-type -f --profile-export-file -H --streaming
        --grpc-compression-algorithm --verbose-csv --collect-metrics --metrics-url --metrics-interval
        --service-kind""".split(),
        (_OWN, ""),
    ),
    "--version": (_OWN, "prints perfkit's version"),
    "-t": (_MAPPED, "--concurrency-range N (deprecated in perf_analyzer too)"),
    "-d": (_MAPPED, "--concurrency-range START:C, START from -t (default 1), C from -c (default 0: up to -l)"),
    "-c": (_MAPPED, "the end of -d's --concurrency-range (alone, ignored, as perf_analyzer does)"),
    "-z": (_MAPPED, "--input-data zero"),
    "--data-directory": (_MAPPED, "--input-data DIR"),
    **dict.fromkeys(("-a", "--async", "--sync", "--max-threads"), (_IGNORED, _ASYNCIO)),
    "--model-signature-name": (_IGNORED, "TensorFlow Serving's, which perf_analyzer ignores for any other "
                               "--service-kind"),  # fmt: skip
    "--triton-server-directory": (_IGNORED, "--service-kind triton_c_api's, which perfkit does not run"),
    "--model-repository": (_IGNORED, "--service-kind triton_c_api's, which perfkit does not run"),
    **dict.fromkeys(("--trace-level", "--trace-rate", "--trace-count", "--log-frequency"),
                    (_IGNORED, "perfkit leaves the server's trace settings as they are: set them on the server "
                     "(tritonserver --trace-config, or POST /v2/trace/setting)")),  # fmt: skip
    "--periodic-concurrency-range": (_REFUSED, "perfkit measures each level until stable; use --concurrency-range"),
    "--request-period": (_REFUSED, "it paces --periodic-concurrency-range"),
    "--enable-mpi": (_REFUSED, "perfkit spreads load over processes with --workers N (Ray), not MPI ranks"),
}

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


class _Refused(argparse.Action):
    """A switch refused with its reason, as a usage error of the sweep (argparse's own wording)."""

    def __call__(self, parser: argparse.ArgumentParser, *_: object) -> None:
        flag = self.option_strings[0]
        parser.error(f"argument {flag}: not supported: {PERF_ANALYZER_FLAGS[flag][1]}")


def add_perf_analyzer_arguments(p: argparse.ArgumentParser) -> None:
    """perf_analyzer's flags that perfkit's own do not cover, so that its command lines run unchanged:
    accepted with a note where they have no meaning here, mapped where they do, refused with the
    reason otherwise (a usage error of this command)."""
    g = p.add_argument_group("perf_analyzer's other flags (so its command lines run unchanged)")
    g.add_argument("--version", action="version", version=f"perfkit {__version__}", help="print perfkit's version")
    g.add_argument("--output-tensor-format", choices=("binary", "json"), default=None,
                   help="HTTP: ask for outputs as binary data or in the JSON body (default binary where the "
                   "server lists the binary_tensor_data extension, else json)")  # fmt: skip
    g.add_argument("--grpc-compression-algorithm", choices=("none", "gzip", "deflate"), default="none",
                   help="-i grpc: compress each request message (grpc-encoding) (default none)")  # fmt: skip
    g.add_argument("-t", dest="pa_concurrency", type=int, metavar="N", help="deprecated: --concurrency-range N")
    g.add_argument("-d", dest="pa_dynamic", action="store_true",
                   help="deprecated: --concurrency-range from -t (default 1) to -c (default 0: up to -l)")  # fmt: skip
    g.add_argument("-c", dest="pa_max_concurrency", type=int, metavar="N", help="deprecated: the end of -d's range")
    g.add_argument("-z", dest="pa_zero", action="store_true", help="deprecated: --input-data zero")
    g.add_argument("--data-directory", type=Path, metavar="DIR", help="deprecated: --input-data DIR")
    g.add_argument("-a", "--async", dest="pa_async", action="store_true",
                   help="accepted, no effect: perfkit's client is asynchronous (asyncio) at every concurrency")  # fmt: skip
    g.add_argument("--sync", dest="pa_sync", action="store_true", help="accepted, no effect (see --async)")
    g.add_argument("--max-threads", type=int, metavar="N", help="accepted, no effect: no threads send requests here")
    g.add_argument("--model-signature-name", metavar="NAME", help="accepted, no effect: TensorFlow Serving's")
    g.add_argument("--triton-server-directory", metavar="DIR", help="accepted, no effect: the C API's")
    g.add_argument("--model-repository", metavar="DIR", help="accepted, no effect: the C API's")
    g.add_argument("--trace-level", action="append", choices=("OFF", "TIMESTAMPS", "TENSORS"),
                   help="accepted, no effect: perfkit leaves the server's trace settings as they are")  # fmt: skip
    for flag in ("--trace-rate", "--trace-count", "--log-frequency"):
        g.add_argument(flag, type=int, metavar="N", help="accepted, no effect (see --trace-level)")
    g.add_argument("--service-kind", type=_service_kind, default="triton", metavar="triton|openai",
                   help="triton: KServe v2 (default); openai: --endpoint v1/chat/completions, v1/completions or "
                   "v1/embeddings picks the --endpoint-type")  # fmt: skip
    g.add_argument("--periodic-concurrency-range", type=_periodic_concurrency, metavar="START:END:STEP",
                   help="not supported (use --concurrency-range)")  # fmt: skip
    g.add_argument("--request-period", type=_request_period, metavar="N", help="not supported")
    g.add_argument("--enable-mpi", nargs=0, action=_Refused, help="not supported (use --workers)")


#: The ignored flags by their argparse names, so that a note can name those given.
_IGNORED_DESTS = {"pa_async": "--async", "pa_sync": "--sync", "max_threads": "--max-threads",
                  "model_signature_name": "--model-signature-name", "triton_server_directory": "--triton-server-directory",
                  "model_repository": "--model-repository", "trace_level": "--trace-level", "trace_rate": "--trace-rate",
                  "trace_count": "--trace-count", "log_frequency": "--log-frequency"}  # fmt: skip


def _deprecated_concurrency(args: argparse.Namespace) -> str | None:
    """perf_analyzer's -t/-c/-d as a --concurrency-range, as its parser reads them: -t N alone is one
    level; -d goes from -t (default 1) to -c (default 0: until -l); -c without -d changes nothing."""
    if args.pa_concurrency is None and not args.pa_dynamic and args.pa_max_concurrency is None:
        return None
    others = [flag for flag, value in (("--concurrency-range", args.concurrency_range),
              ("--request-rate-range", args.request_rate_range), ("--request-intervals", args.request_intervals),
              ("--trace-file", args.trace_file)) if value is not None]  # fmt: skip
    if others:
        raise PerfkitError(f"-t, -c and -d are perf_analyzer's deprecated concurrency flags: give them or "
                           f"{others[0]}, not both")  # fmt: skip
    start = 1 if args.pa_concurrency is None else args.pa_concurrency
    if not args.pa_dynamic:
        return str(start)
    return f"{start}:{args.pa_max_concurrency or 0}:1"


def resolved(args: argparse.Namespace) -> argparse.Namespace:
    """`args` with perf_analyzer's deprecated flags read as the sweep's own (a copy: the notes read
    what was given)."""
    out = copy.copy(args)
    out.concurrency_range = _deprecated_concurrency(args) or args.concurrency_range
    same = "zero" if args.pa_zero else "random"  # -z and --input-data zero say the same
    data = [flag for flag, given in (("-z", args.pa_zero), ("--data-directory", args.data_directory is not None),
            (f"--input-data {args.input_data}", args.input_data not in ("random", same))) if given]  # fmt: skip
    if len(data) > 1:
        raise PerfkitError(f"{' and '.join(data)} both say what to send: give one")
    if args.pa_zero:
        out.input_data = "zero"
    elif args.data_directory is not None:
        if not args.data_directory.is_dir():
            raise PerfkitError(f"--data-directory {args.data_directory}: not a directory (one file per input, named "
                               "as the input)")  # fmt: skip
        out.input_data = str(args.data_directory)
    return out


def perf_analyzer_notes(args: argparse.Namespace) -> list[str]:
    """perf_analyzer's flags given that have no meaning here, one note for each reason why; and the
    deprecated ones given, with what they were read as."""
    notes = []
    if (concurrency := _deprecated_concurrency(args)) is not None:
        read = args.pa_max_concurrency is not None and args.pa_dynamic
        given = [flag for flag, on in (("-t", args.pa_concurrency is not None), ("-c", read), ("-d", args.pa_dynamic))
                 if on]  # fmt: skip
        if given:
            notes.append(f"note: {', '.join(given)} read as --concurrency-range {concurrency}: deprecated in "
                         "perf_analyzer too")  # fmt: skip
        if args.pa_max_concurrency is not None and not args.pa_dynamic:
            notes.append("note: -c ignored: it is the end of -d's range, and perf_analyzer ignores it without -d")
    if args.pa_zero or args.data_directory is not None:
        flag, value = ("-z", "zero") if args.pa_zero else ("--data-directory", args.data_directory)
        notes.append(f"note: {flag} read as --input-data {value}: it is deprecated in perf_analyzer too")
    by_reason: dict[str, list[str]] = {}
    for dest, flag in _IGNORED_DESTS.items():
        if getattr(args, dest) is not None and getattr(args, dest) is not False:  # 0 is a value given
            by_reason.setdefault(PERF_ANALYZER_FLAGS[flag][1], []).append(flag)
    notes += [f"note: {', '.join(flags)} ignored: {reason}" for reason, flags in by_reason.items()]
    return notes


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
