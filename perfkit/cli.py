"""perfkit's command line. `main()` returns the exit code; PerfkitError prints as one line."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence

from perfkit._version import __version__
from perfkit.errors import ExitCode, PerfkitError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="perfkit",
        description="Load testing and performance analysis for KServe v2 / Triton inference servers.",
    )
    parser.add_argument("--version", action="version", version=f"perfkit {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    probe = commands.add_parser(
        "probe",
        help="check a server: health, metadata, and a few inferences per model",
        description="Check a KServe v2 server. With no -u, starts the bundled reference server on the "
        "demo model repository and probes that.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    probe.add_argument("-u", "--url", metavar="HOST:PORT", help="HTTP endpoint of the server (default: embedded)")
    probe.add_argument(
        "-m",
        "--model-name",
        action="append",
        default=[],
        metavar="MODEL",
        help="model to probe (repeatable; default: every ready model)",
    )
    probe.add_argument("-n", "--requests", type=int, default=20, metavar="N", help="requests per model")
    probe.add_argument("--seed", type=int, default=0, help="seed of the random input data")
    return parser


def _run_probe(args: argparse.Namespace) -> int:
    from perfkit.probe import probe, render_probe

    if args.requests < 1:
        raise PerfkitError("-n/--requests must be at least 1")

    def go(url: str) -> int:
        result = asyncio.run(probe(url, args.model_name, args.requests, args.seed))
        print("\n".join(render_probe(result)))
        return ExitCode.OK if result.ok else ExitCode.FAILED

    if args.url:
        return go(args.url)
    from perfkit.embedded import reference_server_process

    print("starting the embedded reference server on the demo models...", file=sys.stderr, flush=True)
    with reference_server_process() as server:
        return go(server.http_url)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "probe":
            return _run_probe(args)
    except PerfkitError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return int(exc.exit_code)
    return ExitCode.USAGE
