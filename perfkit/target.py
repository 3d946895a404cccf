"""The server a command measures: the one given with -u, or else the embedded default target, the
bundled reference server started as a child process on free loopback ports for the duration of one
command, on the demo model repository unless told otherwise (with its generative models for a
generative endpoint). Sweep and tune open it with `open_target`; where a -u server's metrics are
read without --metrics-url is decided from its identity (perfkit.measure.metrics_source).
`TargetSpec` is what sweep, tune and probe are told about it (-u, -i, headers, TLS), checked by one
`validate()`.

A child process rather than a thread, so that the server's work never competes with the load
generator for the interpreter lock and a crash on one side is seen as such by the other.
"""

from __future__ import annotations

import contextlib
import dataclasses
import queue
import re
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfkit.errors import PerfkitError, TargetError

_GRPC_ROOTS_FLAG = "--ssl-grpc-root-certifications-file"
#: The server metadata's name for binary tensors in the HTTP body (Triton's extension).
BINARY_TENSOR_EXTENSION = "binary_tensor_data"


def lists_extension(metadata: Mapping[str, Any], extension: str) -> bool | None:
    """Whether the server metadata's `extensions` lists `extension`; None where it lists none at
    all (not a list: the metadata does not say)."""
    extensions = metadata.get("extensions")
    return extension in extensions if isinstance(extensions, list) else None


@dataclass(frozen=True, slots=True)
class TlsSpec:
    """Client TLS, with perf_analyzer's options: HTTPS is `-u https://...`; gRPC needs grpc_use_ssl.
    A client certificate (PEM) is offered where the server asks for one (mutual TLS)."""

    grpc_use_ssl: bool = False
    grpc_root_certs: Path | None = None  # PEM CA bundle; None: the system's roots
    https_ca_certs: Path | None = None  # PEM CA bundle; None: the system's roots
    https_verify_peer: bool = True
    https_verify_host: bool = True  # --ssl-https-verify-host 0: the certificate's name is not checked
    grpc_client_key: Path | None = None  # PEM; with grpc_client_chain
    grpc_client_chain: Path | None = None  # PEM certificate chain
    https_client_cert: Path | None = None  # PEM; may hold the key too
    https_client_key: Path | None = None  # PEM

    def https_context(self) -> ssl.SSLContext:
        """The context an https:// server is checked with."""
        if not self.https_verify_peer:  # --ssl-https-verify-peer 0: encrypted, but the server is not checked
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        else:
            try:
                context = ssl.create_default_context(cafile=self.https_ca_certs)
            except (OSError, ssl.SSLError) as exc:
                raise PerfkitError(f"--ssl-https-ca-certificates-file {self.https_ca_certs}: {exc}") from None
            context.check_hostname = self.https_verify_host
        if self.https_client_cert is not None:
            _load_client_certificate(context, self.https_client_cert, self.https_client_key, "--ssl-https-client-certificate-file")
        return context

    def grpc_root_certificates(self) -> bytes | None:
        """The PEM bundle gRPC's TLS checks the server with; None: the system's roots."""
        if self.grpc_root_certs is None:
            return None
        try:
            return self.grpc_root_certs.read_bytes()
        except OSError as exc:
            raise PerfkitError(f"{_GRPC_ROOTS_FLAG} {self.grpc_root_certs}: {exc.strerror or exc}") from None

    def grpc_client_certificate(self) -> tuple[bytes | None, bytes | None]:
        """The client's PEM private key and certificate chain for gRPC (grpcio's credentials take bytes)."""
        if self.grpc_client_chain is None or self.grpc_client_key is None:
            return None, None
        try:
            return self.grpc_client_key.read_bytes(), self.grpc_client_chain.read_bytes()
        except OSError as exc:
            raise PerfkitError(f"--ssl-grpc-private-key-file / --ssl-grpc-certificate-chain-file: {exc}") from None

    def grpc_context(self, roots: bytes | None) -> ssl.SSLContext:
        """The context of gRPC's TLS for the roots `grpc_root_certificates` gave."""
        try:
            context = ssl.create_default_context(cadata=roots.decode("ascii", "replace") if roots else None)
        except ssl.SSLError as exc:
            raise PerfkitError(f"{_GRPC_ROOTS_FLAG} {self.grpc_root_certs}: not PEM certificates ({exc})") from None
        if self.grpc_client_chain is not None:
            _load_client_certificate(context, self.grpc_client_chain, self.grpc_client_key, "--ssl-grpc-certificate-chain-file")
        return context


def _load_client_certificate(context: ssl.SSLContext, cert: Path, key: Path | None, flag: str) -> None:
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise PerfkitError(f"{flag} {cert}: cannot load the client certificate and its key as PEM ({exc})") from None


@dataclass(frozen=True, slots=True)
class TargetSpec:
    url: str | None  # None: start the embedded reference server
    protocol: str = "http"  # http | grpc
    model: str | None = None
    model_version: str = ""
    headers: tuple[tuple[str, str], ...] = ()
    request_timeout_s: float = 30.0
    # --input-tensor-format / --output-tensor-format json: HTTP tensors in the JSON body. None: not
    # chosen, binary where the server lists the binary_tensor_data extension (with_tensor_format).
    json_tensors: bool | None = None
    json_outputs: bool | None = None
    grpc_compression: str = "none"  # --grpc-compression-algorithm: none | gzip | deflate
    tls: TlsSpec = field(default_factory=TlsSpec)
    max_connections: int = 0  # HTTP connections per load process; 0: one per outstanding request
    bls_composing_models: tuple[tuple[str, str], ...] = ()  # --bls-composing-models: (name, version "" = latest)

    def validate(self) -> None:
        """The rules of the target flags, shared by sweep, tune and probe: -i, the tensor format,
        --request-timeout, and the TLS options against -u."""
        if self.protocol not in ("http", "grpc"):
            raise PerfkitError(f"-i must be http or grpc, got '{self.protocol}'")
        if self.json_tensors and self.protocol != "http":
            raise PerfkitError("--input-tensor-format json applies to HTTP only; drop it or use -i http")
        if self.request_timeout_s <= 0:
            raise PerfkitError("--request-timeout must be a positive number of seconds")
        endpoints = endpoints_of(self.url or "")
        if len(endpoints) > 1 and (not all(endpoints) or len(set(endpoints)) != len(endpoints)):
            raise PerfkitError(f"-u takes HOST:PORT, or several alike servers as HOST:PORT,HOST:PORT,... each once; "
                               f"got '{self.url}'")  # fmt: skip
        if self.json_outputs and self.protocol != "http":
            raise PerfkitError("--output-tensor-format json applies to HTTP only; drop it or use -i http")
        if self.grpc_compression != "none" and self.protocol != "grpc":
            raise PerfkitError("--grpc-compression-algorithm applies to -i grpc only; drop it or use -i grpc")
        tls = self.tls
        https = self.protocol == "http" and (
            tls.https_ca_certs is not None or not tls.https_verify_peer or not tls.https_verify_host
            or tls.https_client_cert is not None or tls.https_client_key is not None
        )  # fmt: skip
        if https and not (self.url or "").startswith("https://"):
            raise PerfkitError("--ssl-https-* options apply to an HTTPS server: give -u https://HOST:PORT")
        if tls.grpc_root_certs is not None and not tls.grpc_use_ssl:
            raise PerfkitError("--ssl-grpc-root-certifications-file needs --ssl-grpc-use-ssl")
        if (tls.grpc_client_key is None) != (tls.grpc_client_chain is None):
            raise PerfkitError("--ssl-grpc-private-key-file and --ssl-grpc-certificate-chain-file go together: give both")
        if tls.grpc_client_key is not None and not tls.grpc_use_ssl:
            raise PerfkitError("--ssl-grpc-private-key-file and --ssl-grpc-certificate-chain-file need --ssl-grpc-use-ssl")
        if tls.https_client_key is not None and tls.https_client_cert is None:
            raise PerfkitError("--ssl-https-private-key-file needs --ssl-https-client-certificate-file")
        if tls.grpc_use_ssl and self.url is None:
            raise PerfkitError("--ssl-grpc-use-ssl needs -u: the embedded server listens in the clear on loopback")
        for flag, path in (
            ("--ssl-grpc-root-certifications-file", tls.grpc_root_certs),
            ("--ssl-https-ca-certificates-file", tls.https_ca_certs),
            ("--ssl-grpc-private-key-file", tls.grpc_client_key),
            ("--ssl-grpc-certificate-chain-file", tls.grpc_client_chain),
            ("--ssl-https-client-certificate-file", tls.https_client_cert),
            ("--ssl-https-private-key-file", tls.https_client_key),
        ):
            if path is not None and not path.is_file():
                raise PerfkitError(f"{flag} {path}: no such file")

    def with_tensor_format(self, server: Mapping[str, Any]) -> tuple[TargetSpec, str]:
        """The target with its HTTP tensor formats settled, and the console note saying why ("" when
        there is nothing to say). A format chosen with its flag stays; one not chosen is binary where
        the server metadata `server` lists the binary_tensor_data extension (Triton, the reference
        server), JSON where it does not (MLServer, which fails every binary request). gRPC carries raw
        tensor contents, which every Open Inference Protocol server reads: it has no choice to make."""
        if self.protocol != "http":
            return dataclasses.replace(self, json_tensors=False, json_outputs=False), ""
        listed = bool(lists_extension(server, BINARY_TENSOR_EXTENSION))
        defaulted = [what for what, chosen in (("tensors", self.json_tensors), ("outputs", self.json_outputs))
                     if chosen is None and not listed]  # fmt: skip
        settled = dataclasses.replace(
            self,
            json_tensors=not listed if self.json_tensors is None else self.json_tensors,
            json_outputs=not listed if self.json_outputs is None else self.json_outputs,
        )
        if not defaulted:
            return settled, ""
        name = " ".join(str(server[key]) for key in ("name", "version") if server.get(key)) or "the server"
        flag = "--input-tensor-format" if "tensors" in defaulted else "--output-tensor-format"
        what = "JSON tensors" if "tensors" in defaulted else "JSON outputs"
        return settled, (f"{name} at {self.url} does not list the {BINARY_TENSOR_EXTENSION} extension: {what} "
                         f"({flag} binary to force)")  # fmt: skip


_STARTED = re.compile(r"Started (HTTPService|GRPCInferenceService|Metrics Service) at (\S+):(\d+)")


@dataclass(frozen=True, slots=True)
class Target:
    """The server being measured, open for the command's duration."""

    url: str  # several endpoints (`-u A,B`) comma-separated
    protocol: str
    metrics_urls: tuple[str, ...]
    server_pid: int | None  # the embedded server's process, whose CPU and memory are sampled
    embedded: bool

    @property
    def metrics_url(self) -> str | None:
        """The first metrics URL (tune reads one server's)."""
        return self.metrics_urls[0] if self.metrics_urls else None


def endpoints_of(url: str) -> tuple[str, ...]:
    """The endpoints of -u: one HOST:PORT, or several comma-separated (`-u A,B`)."""
    return tuple(part.strip() for part in url.split(","))


#: The port an endpoint given without one means, as perf_analyzer's defaults (localhost:8000 / :8001).
DEFAULT_PORTS = {"http": 8000, "grpc": 8001}
METRICS_PORT = 8002
_SCHEMES = {"http": ("http", "https"), "grpc": ("grpc", "http", "https")}
_HOST = re.compile(r"[A-Za-z0-9._~-]+")  # a name or IPv4 address (an IPv6 address comes in brackets)


def _host_and_port(authority: str, flag: str, given: str) -> tuple[str, int | None]:
    """("host", port) from HOST, HOST:PORT, [V6] or [V6]:PORT; PerfkitError (exit 2) naming `flag`."""
    if authority.startswith("["):
        inside, bracket, rest = authority[1:].partition("]")
        if not bracket or not inside or (rest and not rest.startswith(":")):
            raise PerfkitError(f"{flag} {given!r}: an IPv6 address goes in brackets, e.g. [::1]:8000")
        host, sep, port = f"[{inside}]", rest[:1], rest[1:]
    elif authority.count(":") > 1:
        raise PerfkitError(f"{flag} {given!r}: expected HOST:PORT (one colon; an IPv6 address in brackets, "
                           "e.g. [::1]:8000)")  # fmt: skip
    else:
        host, sep, port = authority.partition(":")
        if not host:
            raise PerfkitError(f"{flag} {given!r}: no host; give HOST:PORT, e.g. localhost{authority or ':8000'}")
        if not _HOST.fullmatch(host):
            raise PerfkitError(f"{flag} {given!r}: {host!r} is not a host name or address")
    if not sep:
        return host, None
    if not port.isdigit():
        raise PerfkitError(f"{flag} {given!r}: the port {port!r} is not a number; give HOST:PORT, e.g. localhost:8000")
    if not 0 < int(port) < 65536:
        raise PerfkitError(f"{flag} {given!r}: the port {int(port)} is out of range (1-65535)")
    return host, int(port)


def checked_endpoint(text: str, protocol: str, flag: str = "-u") -> str:
    """One endpoint of -u, checked, with its port: HOST or HOST:PORT (HOST alone: the protocol's
    default port, 8000 HTTP or 8001 gRPC, as perf_analyzer), or a URL http(s)://HOST[:PORT][/PREFIX]
    (without a port: its scheme's, 80 or 443). A malformed one is a usage error (exit 2)."""
    given = text.strip()
    scheme, has_scheme, rest = given.partition("://")
    if not has_scheme:
        scheme, rest = "", given
    elif scheme.lower() not in _SCHEMES.get(protocol, ()):
        raise PerfkitError(f"{flag} {given!r}: the scheme {scheme}:// is not one of -i {protocol}'s "
                           f"({', '.join(s + '://' for s in _SCHEMES.get(protocol, ()))}); or give HOST:PORT")  # fmt: skip
    authority, slash, path = rest.partition("/")
    if slash and (protocol == "grpc" or not has_scheme) and path.strip("/"):
        raise PerfkitError(f"{flag} {given!r}: expected HOST:PORT, without a path")
    host, port = _host_and_port(authority, flag, given)
    if port is None:
        if has_scheme and protocol == "http":
            return given  # a URL's port is its scheme's
        port = DEFAULT_PORTS.get(protocol, DEFAULT_PORTS["http"])
    prefix = f"{scheme}://" if has_scheme else ""
    return f"{prefix}{host}:{port}" + (f"/{path}" if has_scheme and path else "")


def checked_url(url: str | None, protocol: str) -> str | None:
    """-u checked (`checked_endpoint` for each comma-separated endpoint), or None (the embedded server)."""
    if url is None:
        return None
    if not url.strip():
        raise PerfkitError("-u is empty; give HOST:PORT, e.g. localhost:8000, or leave -u out for the embedded server")
    return ",".join(checked_endpoint(part, protocol) if part.strip() else "" for part in url.split(","))


def checked_metrics_url(url: str, flag: str = "--metrics-url") -> str:
    """A Prometheus endpoint, checked and complete: HOST[:PORT][/PATH] or http(s)://HOST[:PORT][/PATH];
    without a port 8002, without a path /metrics (perf_analyzer's default localhost:8002/metrics)."""
    given = url.strip()
    scheme, has_scheme, rest = given.partition("://")
    if not has_scheme:
        scheme, rest = "http", given
    elif scheme.lower() not in ("http", "https"):
        raise PerfkitError(f"{flag} {given!r}: expected http(s)://HOST:PORT/PATH or HOST:PORT")
    authority, _, path = rest.partition("/")
    host, port = _host_and_port(authority, flag, given)
    if port is None and not has_scheme:
        port = METRICS_PORT
    return f"{scheme}://{host}{'' if port is None else f':{port}'}/{path or 'metrics'}"


@contextlib.contextmanager
def open_target(url: str | None, protocol: str, *, metrics_urls: Sequence[str] = (),
                model_repository: Path | None = None, server_args: Sequence[str] = (),
                genai: bool = False) -> Iterator[Target]:  # fmt: skip
    """The server at `url` (-u) as given; with no `url`, the embedded reference server on
    `model_repository` (default: the demo models, with the generative ones if `genai`) with
    `server_args`, until the block ends. A -u server's metrics are read at `metrics_urls`; without
    any, --collect-metrics reads them where its identity says once its metadata is read
    (perfkit.measure.metrics_source.with_server_metrics), not at a port guessed for every server."""
    if url is not None:
        yield Target(url, protocol, tuple(metrics_urls), None, embedded=False)
        return
    if model_repository is None and genai:
        from v2kit.demo import ensure_demo_repository  # it loads onnx: only for the demo models

        model_repository = ensure_demo_repository(genai=True)
    with reference_server_process(model_repository, server_args) as server:
        url = server.grpc_url if protocol == "grpc" else server.http_url
        yield Target(url, protocol, tuple(metrics_urls) or (server.metrics_url,), server.process.pid, embedded=True)


@dataclass(frozen=True, slots=True)
class ServerProcess:
    process: subprocess.Popen[str]
    host: str
    ports: dict[str, int]  # "HTTPService" / "GRPCInferenceService" / "Metrics Service" → bound port
    log_path: Path

    @property
    def http_url(self) -> str:
        return f"{self.host}:{self.ports['HTTPService']}"

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.ports['GRPCInferenceService']}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.ports['Metrics Service']}/metrics"


@contextlib.contextmanager
def reference_server_process(
    model_repository: Path | None = None,
    extra_args: Sequence[str] = (),
    *,
    start_timeout_s: float = 180.0,
    stop_timeout_s: float = 60.0,
) -> Iterator[ServerProcess]:
    """Run `python -m reference_server` on 127.0.0.1 with free ports until the block ends.

    Waits until every listener has printed its bound port. The server's log goes to a temporary
    file whose tail is quoted if the server fails to start.
    """
    if model_repository is None:
        from v2kit.demo import ensure_demo_repository  # it loads onnx: only for the demo models

        model_repository = ensure_demo_repository()
    command = [
        sys.executable, "-m", "reference_server", "--model-repository", str(model_repository),
        "--host", "127.0.0.1", "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0", *extra_args,
    ]  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="perfkit-server-") as tmp:
        log_path = Path(tmp) / "server.log"
        with log_path.open("w") as log:
            process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True)
            try:
                ports = _wait_for_listeners(process, log_path, start_timeout_s)
                yield ServerProcess(process, "127.0.0.1", ports, log_path)
            finally:
                _stop(process, stop_timeout_s)


#: The server's last startup line, ready or not (it says which models keep it not ready in its log).
_STARTED_UP = ("Server ready", "Server not ready")


def _wait_for_listeners(process: subprocess.Popen[str], log_path: Path, timeout_s: float) -> dict[str, int]:
    """Read the server's startup lines until "Server ready" (or "Server not ready": a model failed to
    load, which the sweep's own checks then name), the process exits, or time runs out."""
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line)
            if line.startswith(_STARTED_UP):
                break
        else:
            lines.put(None)

    threading.Thread(target=read, name="reference-server-stdout", daemon=True).start()
    deadline = time.monotonic() + timeout_s
    ports: dict[str, int] = {}
    while True:
        try:
            line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            raise TargetError(f"the reference server did not start within {timeout_s:.0f} s; log: {log_path}") from None
        if line is None:
            code = process.wait()
            tail = log_path.read_text(errors="replace")[-2000:]
            raise TargetError(f"the reference server exited with code {code} before listening:\n{tail}")
        match = _STARTED.search(line)
        if match:
            ports[match.group(1)] = int(match.group(3))
        if line.startswith(_STARTED_UP):
            return ports


def _stop(process: subprocess.Popen[str], timeout_s: float) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    if process.stdout is not None:
        process.stdout.close()
