"""What the sub-commands share: the `Command` each module declares, the -H and TLS flags of sweep,
tune and probe, the window flags of sweep and tune, the regression-gate flags of compare and run,
and writing files at the edge."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfkit.analysis.compare import GATE_METRICS, Thresholds, gated, parse_percent
from perfkit.errors import PerfkitError
from perfkit.measure.level import DEFAULT_LENGTHENINGS, DEFAULT_MAX_TRIALS, WindowSpec
from perfkit.results.files import load_result, write_text_atomic
from perfkit.results.model import SweepResult
from perfkit.results.pa_csv import composing_csvs, sweep_from_pa_csv
from perfkit.target import TlsSpec


@dataclass(frozen=True, slots=True)
class Command:
    """A sub-command: its line in `perfkit --help`, its parser's texts, its arguments, and `run`,
    which takes the parsed arguments and perfkit's whole argv (the results record it), returns the
    exit code, and raises PerfkitError for what the user can fix."""

    name: str
    help: str
    description: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, list[str]], int]
    epilog: str | None = None
    formatter_class: type[argparse.HelpFormatter] = argparse.HelpFormatter

    def add_to(self, commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
        parser = commands.add_parser(self.name, help=self.help, **self._texts())
        self.add_arguments(parser)
        show_defaults(parser)

    def parser(self) -> argparse.ArgumentParser:
        """The command's parser on its own, parsing as `perfkit NAME` does (for scenario files)."""
        parser = argparse.ArgumentParser(prog=f"perfkit {self.name}", **self._texts())
        self.add_arguments(parser)
        show_defaults(parser)
        return parser

    def _texts(self) -> dict[str, Any]:
        return {"description": self.description, "epilog": self.epilog, "formatter_class": self.formatter_class}


def show_defaults(parser: argparse.ArgumentParser) -> None:
    """Say each flag's default in its --help line, as "(default X)", where the help does not already
    say it: every flag that has one, help text or not. Unlike argparse's ArgumentDefaultsHelpFormatter,
    a flag without a default (None, off, an empty list) says nothing rather than "(default: None)"."""
    for action in parser._actions:
        default = action.default
        if action.nargs == 0 or default in (None, "", argparse.SUPPRESS) or default == [] or default == ():
            continue  # switches, and flags whose absence is the default
        if "default" in (action.help or "") or action.help == argparse.SUPPRESS:
            continue
        text = (f"{default:g}" if isinstance(default, float) else str(default)).replace("%", "%%")  # %-formatted
        action.help = f"{action.help} (default {text})" if action.help else f"default {text}"


def say(text: str) -> None:
    print(text, file=sys.stderr)


def write(path: Path, text: str) -> None:
    """Write an output file, its folder made if need be, and say so."""
    if not path.parent.is_dir():
        path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, text)
    say(f"wrote {path}")


# --------------------------------------------------------------------------------------------------
# -H and TLS (sweep, tune and probe), and the measurement windows (sweep and tune)


def _use_ssl_value(text: str) -> bool:
    # perf_analyzer's help writes `--ssl-grpc-use-ssl <bool>`, but its parser takes a switch and
    # leaves the word after it unread: `--ssl-grpc-use-ssl false` connects over TLS there.
    if text.lower() == "true":
        return True
    raise argparse.ArgumentTypeError(
        f"'{text}': a switch (perf_analyzer's --help writes <bool>, but it reads the flag alone and uses TLS even "
        "after 'false'); give --ssl-grpc-use-ssl alone for TLS, or drop it for a plain channel"
    )


def _pem(text: str) -> str:
    if text.upper() != "PEM":
        raise argparse.ArgumentTypeError(
            f"'{text}': Python's ssl loads PEM only; convert the file (openssl x509 -inform DER -in CERT -out "
            "CERT.pem; openssl pkey -inform DER -in KEY -out KEY.pem) and give the PEM one"
        )
    return "PEM"


def add_connection_flags(
    parser: argparse.ArgumentParser, target: argparse._ArgumentGroup, *, use_ssl_word: bool = False
) -> None:
    """-H into the `target` group, and a TLS group with perf_analyzer's client TLS options. Read them
    back with `headers_from_args` and `tls_from_args`; `TargetSpec` validation checks them together
    with -u and -i. `use_ssl_word`: --ssl-grpc-use-ssl may be followed by `true`, as perf_analyzer
    scripts write it (only where no positional argument could be taken for it)."""
    target.add_argument(
        "-H", "--header", action="append", default=[], metavar="'NAME: VALUE'", help="extra HTTP header (repeatable)"
    )
    tls = parser.add_argument_group("TLS", "HTTPS: give -u https://HOST:PORT. gRPC: add --ssl-grpc-use-ssl.")
    if use_ssl_word:
        tls.add_argument("--ssl-grpc-use-ssl", nargs="?", const=True, type=_use_ssl_value, metavar="true",
                         help="connect to the gRPC server over TLS (a 'true' after it is taken, as perf_analyzer's "
                         "scripts write it)")  # fmt: skip
    else:
        tls.add_argument("--ssl-grpc-use-ssl", action="store_true", help="connect to the gRPC server over TLS")
    tls.add_argument(
        "--ssl-grpc-root-certifications-file",
        type=Path,
        metavar="PEM",
        help="CA certificates to verify the gRPC server with (default: the system's)",
    )
    tls.add_argument("--ssl-grpc-private-key-file", type=Path, metavar="PEM",
                     help="the client's private key, for a server that asks for a client certificate")  # fmt: skip
    tls.add_argument("--ssl-grpc-certificate-chain-file", type=Path, metavar="PEM",
                     help="the client's certificate chain (with --ssl-grpc-private-key-file)")  # fmt: skip
    tls.add_argument(
        "--ssl-https-ca-certificates-file",
        type=Path,
        metavar="PEM",
        help="CA certificates to verify the HTTPS server with (default: the system's)",
    )
    tls.add_argument(
        "--ssl-https-verify-peer",
        type=int,
        choices=(0, 1),
        default=1,
        metavar="0|1",
        help="0: do not verify the HTTPS server's certificate (default 1)",
    )
    tls.add_argument("--ssl-https-verify-host", type=int, choices=(0, 1, 2), default=2, metavar="0|1|2",
                     help="0: do not check the HTTPS server's name against its certificate; 1 and 2 check it, as "
                     "libcurl (default 2)")  # fmt: skip
    tls.add_argument("--ssl-https-client-certificate-file", type=Path, metavar="PEM",
                     help="the client's certificate, for a server that asks for one (may hold the key too)")  # fmt: skip
    tls.add_argument("--ssl-https-private-key-file", type=Path, metavar="PEM", help="the client certificate's key")
    for flag in ("--ssl-https-client-certificate-type", "--ssl-https-private-key-type"):
        tls.add_argument(flag, type=_pem, default="PEM", metavar="PEM", help="PEM only (default PEM)")


def json_format(chosen: str | None) -> bool | None:
    """--input-tensor-format / --output-tensor-format as TargetSpec keeps it: whether JSON, None when
    the flag is not given (the server's extensions decide: TargetSpec.with_tensor_format)."""
    return None if chosen is None else chosen == "json"


def headers_from_args(args: argparse.Namespace) -> tuple[tuple[str, str], ...]:
    headers = []
    for value in args.header:
        name, sep, content = value.partition(":")
        if not sep or not name.strip():
            raise PerfkitError(f"-H '{value}' must look like 'Name: value'")
        headers.append((name.strip(), content.strip()))
    return tuple(headers)


def tls_from_args(args: argparse.Namespace) -> TlsSpec:
    return TlsSpec(
        grpc_use_ssl=bool(args.ssl_grpc_use_ssl),  # None when not given (sweep's may take a word)
        grpc_root_certs=args.ssl_grpc_root_certifications_file,
        https_ca_certs=args.ssl_https_ca_certificates_file,
        https_verify_peer=bool(args.ssl_https_verify_peer),
        https_verify_host=bool(args.ssl_https_verify_host),
        grpc_client_key=args.ssl_grpc_private_key_file,
        grpc_client_chain=args.ssl_grpc_certificate_chain_file,
        https_client_cert=args.ssl_https_client_certificate_file,
        https_client_key=args.ssl_https_private_key_file,
    )


def windows_from_args(args: argparse.Namespace) -> WindowSpec:
    """The measurement flags of sweep and tune (their defaults differ). Sweep lengthens the windows of
    a level that does not stabilise unless -r alone bounds it; tune, which measures many variants,
    keeps perf_analyzer's rule."""
    lengthenings = getattr(args, "window_lengthenings", 0)
    if lengthenings is None:
        lengthenings = 0 if args.max_trials is not None else DEFAULT_LENGTHENINGS
    return WindowSpec(
        mode=args.measurement_mode,
        interval_ms=args.measurement_interval,
        request_count=args.measurement_request_count,
        stability_pct=args.stability_percentage,
        max_trials=DEFAULT_MAX_TRIALS if args.max_trials is None else args.max_trials,
        lengthenings=lengthenings,
        percentile=args.percentile,
        warmup_request_count=args.warmup_request_count,
        request_limit=getattr(args, "request_count", 0),  # sweep only
    )


# --------------------------------------------------------------------------------------------------
# The regression gate: compare and run


def _gate_spelling(text: str) -> str:
    # Any spelling of a gated metric passes --metric's choices as the gate's name (p99_ms -> p99),
    # so that an unknown one still gets argparse's message listing the choices.
    metric = gated(text)
    return metric.gate if metric is not None and metric.gate else text


def add_gate_arguments(parser: argparse.ArgumentParser, suppress: bool) -> None:
    """The thresholds of a comparison. With `suppress`, flags not given leave no attribute, so
    that a scenario's own values stand (STYLE practice 12: the SUPPRESS trick)."""

    def default(value: Any) -> Any:
        return argparse.SUPPRESS if suppress else value

    g = parser.add_argument_group("regression gate")
    g.add_argument(
        "--max-throughput-drop",
        metavar="PCT",
        default=default("5%"),
        help="a throughput drop beyond PCT (and beyond noise) is a regression (default 5%%)",
    )
    g.add_argument(
        "--max-latency-increase",
        metavar="PCT",
        default=default("10%"),
        help="a latency increase beyond PCT (and beyond noise) is a regression (default 10%%)",
    )
    g.add_argument(
        "--metric",
        action="extend",
        nargs="+",
        type=_gate_spelling,
        choices=list(GATE_METRICS),
        default=default(None),
        metavar="METRIC",
        help=f"metrics to gate on (default: throughput p99); any of {', '.join(GATE_METRICS)}",
    )
    g.add_argument(
        "--alpha",
        type=float,
        default=default(0.05),
        metavar="P",
        help="significance level of the noise tests (default 0.05)",
    )
    g.add_argument(
        "--junit", type=Path, default=default(None), metavar="OUT.xml", help="also write the verdicts as JUnit XML"
    )


def thresholds_from(values: dict[str, Any], base: Thresholds | None = None) -> Thresholds:
    """Thresholds from parsed gate flags: those present override `base` (default: the defaults)."""
    base = base or Thresholds()
    return Thresholds(
        parse_percent(values["max_throughput_drop"], "--max-throughput-drop")
        if "max_throughput_drop" in values
        else base.max_throughput_drop_pct,
        parse_percent(values["max_latency_increase"], "--max-latency-increase")
        if "max_latency_increase" in values
        else base.max_latency_increase_pct,
        tuple(values["metric"]) if values.get("metric") else base.metrics,
        float(values["alpha"]) if "alpha" in values else base.alpha,
    )


def load_sweep(path: Path, role: str) -> SweepResult:
    """A sweep to gate on: a perfkit JSON result, or a perf_analyzer `-f` CSV (no per-window samples)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise PerfkitError(f"cannot read {role} {path}: {getattr(exc, 'strerror', None) or exc}") from None
    if not text.lstrip("\ufeff \t\r\n").startswith(("{", "[")):
        return sweep_from_pa_csv(text, path, composing_csvs(path))
    item = load_result(path)
    if not isinstance(item.result, SweepResult):
        raise PerfkitError(f"{role} {path} is a {item.kind} result; compare takes two sweep results")
    return item.result
