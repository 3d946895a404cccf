"""`perfkit probe`: check a server (health, metadata, a few inferences per model) before a long
measurement. The probe itself is `perfkit.measure.probe`; its lines, `perfkit.report.summary`."""

from __future__ import annotations

import argparse
import sys

from perfkit.cli.common import Command, add_connection_flags, headers_from_args, json_format, tls_from_args
from perfkit.errors import ExitCode, PerfkitError
from perfkit.measure.probe import probe
from perfkit.report.summary import render_probe
from perfkit.target import TargetSpec, checked_url, endpoints_of, open_target
from v2kit.runtime import eventloop


def add_arguments(p: argparse.ArgumentParser) -> None:
    target = p.add_argument_group("target")
    target.add_argument(
        "-u",
        "--url",
        metavar="HOST:PORT",
        help="server endpoint (default: embedded server); a HOST alone means port 8000, 8001 with -i grpc",
    )
    target.add_argument("-i", "--protocol", choices=("http", "grpc"), default="http")
    add_connection_flags(p, target)
    p.add_argument(
        "-m",
        "--model-name",
        action="append",
        default=[],
        metavar="MODEL",
        help="model to probe (repeatable; default: every ready model)",
    )
    p.add_argument("-n", "--requests", type=int, default=20, metavar="N", help="requests per model (default 20)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random input data (default 0)")
    for flag, what in (("--input-tensor-format", "tensor encoding"), ("--output-tensor-format", "outputs asked for")):
        target.add_argument(flag, choices=("binary", "json"), default=None,
                            help=f"HTTP {what} (default binary where the server lists the binary_tensor_data "
                            "extension, else json)")  # fmt: skip


def run(args: argparse.Namespace, argv: list[str]) -> int:
    """0 every model answered; 1 the server is down, serves no model, or a request failed."""
    if args.requests < 1:
        raise PerfkitError("-n/--requests must be at least 1")
    url = checked_url(args.url, args.protocol)
    target = TargetSpec(
        url, args.protocol, headers=headers_from_args(args), tls=tls_from_args(args),
        json_tensors=json_format(args.input_tensor_format), json_outputs=json_format(args.output_tensor_format),
    )  # fmt: skip
    target.validate()  # -u, -i, -H and TLS by the sweep's rules
    if url and len(endpoints_of(url)) > 1:
        raise PerfkitError("probe checks one server: give one -u HOST:PORT (several are for perfkit sweep)")

    if not url:
        print("starting the embedded reference server on the demo models...", file=sys.stderr, flush=True)
    with open_target(url, args.protocol) as opened:
        result = eventloop.run(
            probe(opened.url, args.model_name, args.requests, args.seed, args.protocol, headers=target.headers,
                  tls=target.tls, tensor_format=(target.json_tensors, target.json_outputs))
        )  # fmt: skip
    print("\n".join(render_probe(result)))
    return ExitCode.OK if result.ok else ExitCode.FAILED


COMMAND = Command(
    "probe",
    help="check a server: health, metadata, and a few inferences per model",
    description="Check a KServe v2 server. With no -u, starts the bundled reference server on the "
    "demo model repository and probes that.",
    add_arguments=add_arguments,
    run=run,
)
