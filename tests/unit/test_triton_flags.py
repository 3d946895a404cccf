"""tritonserver 2.51's command line on perfkit-server: every flag of `tritonserver --help` parses in
both `--flag value` and `--flag=value` forms, lands in ServerConfig, is refused naming the flag, or is
recorded to be logged as having no effect; docs/server.md's table is the catalogue's."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest
from tritonclient.grpc import service_pb2 as pb

from reference_server import triton_flags
from reference_server.__main__ import main
from reference_server.config import ServerConfig, build_parser, config_from_args
from reference_server.core.repository import ModelRepository
from reference_server.errors import InvalidArgument, ServerError
from reference_server.frontends import metrics
from reference_server.frontends.compression import coding_for_level
from reference_server.frontends.forwarding import HeaderForwarding, forward_into, grpc_metadata
from reference_server.startup import ModelsFailed, load_at_start
from v2kit.runtime import gpu

SERVER_DOC = Path(__file__).resolve().parents[2] / "docs" / "server.md"

#: The flags of `tritonserver --help`, 2.51 (r24.10), each once.
TRITONSERVER_FLAGS = (
    "--allow-cpu-metrics", "--allow-gpu-metrics", "--allow-grpc", "--allow-http", "--allow-metrics",
    "--allow-sagemaker", "--allow-vertex-ai", "--backend-config", "--backend-directory",
    "--buffer-manager-thread-count", "--cache-config", "--cache-directory", "--cuda-memory-pool-byte-size",
    "--cuda-virtual-address-size", "--disable-auto-complete-config", "--enable-peer-access", "--exit-on-error",
    "--exit-timeout-secs", "--grpc-address", "--grpc-header-forward-pattern", "--grpc-http2-max-ping-strikes",
    "--grpc-http2-max-pings-without-data", "--grpc-http2-min-recv-ping-interval-without-data",
    "--grpc-infer-allocation-pool-size", "--grpc-infer-response-compression-level",
    "--grpc-keepalive-permit-without-calls", "--grpc-keepalive-time", "--grpc-keepalive-timeout",
    "--grpc-max-connection-age", "--grpc-max-connection-age-grace", "--grpc-port", "--grpc-restricted-protocol",
    "--grpc-root-cert", "--grpc-server-cert", "--grpc-server-key", "--grpc-use-ssl", "--grpc-use-ssl-mutual", "--help",
    "--host-policy", "--http-address", "--http-header-forward-pattern", "--http-port", "--http-restricted-api",
    "--http-thread-count", "--id", "--load-model", "--log-error", "--log-file", "--log-format", "--log-info",
    "--log-verbose", "--log-warning", "--metrics-address", "--metrics-config", "--metrics-interval-ms",
    "--metrics-port", "--min-supported-compute-capability", "--model-config-name", "--model-control-mode",
    "--model-load-gpu-limit", "--model-load-retry-count", "--model-load-thread-count", "--model-namespacing",
    "--model-repository", "--model-store", "--pinned-memory-pool-byte-size", "--rate-limit", "--rate-limit-resource",
    "--repoagent-directory", "--repository-poll-secs", "--response-cache-byte-size", "--reuse-grpc-port",
    "--reuse-http-port", "--sagemaker-port", "--sagemaker-safe-port-range", "--sagemaker-thread-count",
    "--strict-model-config", "--strict-readiness", "--trace-config", "--trace-count", "--trace-file", "--trace-level",
    "--trace-log-frequency", "--trace-rate", "--vertex-ai-default-model", "--vertex-ai-port",
    "--vertex-ai-thread-count",
)  # fmt: skip

#: An accepted value for each flag (None: a flag without a value); the base command line is
#: `--model-repository R --model-control-mode explicit`.
ACCEPTED: dict[str, str | None] = {
    "--allow-cpu-metrics": "false", "--allow-gpu-metrics": "false", "--allow-grpc": "true", "--allow-http": "true",
    "--allow-metrics": "true", "--allow-sagemaker": "false", "--allow-vertex-ai": "false",
    "--backend-config": "onnxruntime,default-max-batch-size=8", "--backend-directory": "/opt/tritonserver/backends",
    "--buffer-manager-thread-count": "2", "--cache-config": "local,size=1048576", "--cache-directory": "/tmp",
    "--cuda-memory-pool-byte-size": "0:67108864", "--cuda-virtual-address-size": "0:1073741824",
    "--disable-auto-complete-config": None, "--enable-peer-access": "false", "--exit-on-error": "false",
    "--exit-timeout-secs": "5", "--grpc-address": "127.0.0.1", "--grpc-header-forward-pattern": "x-.*",
    "--grpc-http2-max-ping-strikes": "2", "--grpc-http2-max-pings-without-data": "2",
    "--grpc-http2-min-recv-ping-interval-without-data": "300000", "--grpc-infer-allocation-pool-size": "8",
    "--grpc-infer-response-compression-level": "low", "--grpc-keepalive-permit-without-calls": "true",
    "--grpc-keepalive-time": "7200000", "--grpc-keepalive-timeout": "20000", "--grpc-max-connection-age": "60000",
    "--grpc-max-connection-age-grace": "5000", "--grpc-port": "0", "--grpc-root-cert": "/tmp/ca.pem",
    "--grpc-server-cert": "/tmp/cert.pem", "--grpc-server-key": "/tmp/key.pem", "--grpc-use-ssl": "false",
    "--grpc-use-ssl-mutual": "false", "--host-policy": "gpu_0,numa-node=0", "--http-address": "127.0.0.1",
    "--http-header-forward-pattern": "(?-i)PREFIX_.*", "--http-port": "0", "--http-thread-count": "8",
    "--id": "triton", "--load-model": "identity", "--log-error": "true", "--log-file": "/tmp/server.log",
    "--log-format": "ISO8601", "--log-info": "false", "--log-verbose": "1", "--log-warning": "true",
    "--metrics-address": "127.0.0.1", "--metrics-config": "counter_latencies=false", "--metrics-interval-ms": "1000",
    "--metrics-port": "0", "--min-supported-compute-capability": "6.0", "--model-config-name": "h100",
    "--model-control-mode": "explicit", "--model-load-gpu-limit": "0:0.8", "--model-load-retry-count": "2",
    "--model-load-thread-count": "2", "--model-namespacing": "false", "--model-repository": "/tmp/models",
    "--model-store": "/tmp/models", "--pinned-memory-pool-byte-size": "268435456", "--rate-limit": "execution_count",
    "--rate-limit-resource": "R1:4", "--repoagent-directory": "/opt/tritonserver/repoagents",
    "--repository-poll-secs": "5", "--response-cache-byte-size": "1048576", "--reuse-grpc-port": "true",
    "--reuse-http-port": "true", "--sagemaker-port": "8080", "--sagemaker-safe-port-range": "8000-9000",
    "--sagemaker-thread-count": "8", "--strict-model-config": "false", "--strict-readiness": "false",
    "--trace-config": "triton,file=/tmp/trace.json", "--trace-count": "-1", "--trace-file": "/tmp/trace.json",
    "--trace-level": "TIMESTAMPS", "--trace-log-frequency": "0", "--trace-rate": "1000",
    "--vertex-ai-default-model": "identity", "--vertex-ai-port": "8080", "--vertex-ai-thread-count": "8",
    "--http-restricted-api": "health,metadata:admin-key=secret", "--grpc-restricted-protocol": "inference:k=v",
}  # fmt: skip

#: Values asked for what this server cannot do: exit 2, naming the flag.
REFUSED = {
    "--allow-sagemaker": "true",
    "--allow-vertex-ai": "true",
}

#: model_analyzer's local launch (triton_launch_mode: local).
MODEL_ANALYZER_ARGS = (
    "--model-control-mode explicit --http-port 8000 --grpc-port 8001 --metrics-port 8002 "
    "--metrics-interval-ms 1000 --strict-model-config false"
).split()


def _parse(tmp_path: Path, *args: str) -> ServerConfig:
    return config_from_args(["--model-repository", str(tmp_path), "--model-control-mode", "explicit", *args])


def test_the_catalogue_is_tritonservers_command_line() -> None:
    names = [flag.name for flag in triton_flags.CATALOGUE]
    assert len(names) == len(set(names))
    assert sorted(names) == sorted(TRITONSERVER_FLAGS)
    assert set(ACCEPTED) | set(REFUSED) | {"--help"} == set(TRITONSERVER_FLAGS)
    options = build_parser()._option_string_actions
    assert all(name in options for name in names)


@pytest.mark.parametrize("name", sorted(ACCEPTED))
@pytest.mark.parametrize("form", ["space", "equals"])
def test_every_flag_parses_in_both_forms(name: str, form: str, tmp_path: Path) -> None:
    value = ACCEPTED[name]
    if value is None:
        given = [name]
    elif form == "space":
        given = [name, value]
    else:
        given = [f"{name}={value}"]
    if name in ("--model-repository", "--model-store"):
        parsed = config_from_args([*given, "--model-control-mode", "explicit"])
        assert parsed.model_repository == Path(value or "")
    else:
        _parse(tmp_path, *given)


@pytest.mark.parametrize("name", sorted(REFUSED))
@pytest.mark.parametrize("form", ["space", "equals"])
def test_values_this_server_cannot_serve_exit_2_naming_the_flag(
    name: str, form: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    value = REFUSED[name]
    given = [name, value] if form == "space" else [f"{name}={value}"]
    with pytest.raises(SystemExit) as exited:
        _parse(tmp_path, *given)
    assert exited.value.code == 2
    assert f"error: {name} {value}:" in capsys.readouterr().err


def test_model_analyzers_command_line(tmp_path: Path) -> None:
    config = config_from_args(["--model-repository", str(tmp_path), *MODEL_ANALYZER_ARGS])
    assert (config.model_control_mode, config.http_port, config.grpc_port, config.metrics_port) == (
        "explicit", 8000, 8001, 8002,
    )  # fmt: skip
    assert config.metrics_interval_ms == 1000.0
    assert config.auto_complete_config is True
    assert config.no_effect_flags == ()


def test_flags_fill_the_server_config(tmp_path: Path) -> None:
    config = _parse(
        tmp_path,
        *"--log-file /tmp/l.log --log-info false --log-warning=false --log-error false --log-format ISO8601".split(),
        *"--id triton --model-config-name h100 --grpc-address 0.0.0.0 --metrics-address=::1".split(),
        *"--reuse-http-port true --reuse-grpc-port 1 --exit-on-error true --model-load-thread-count 2".split(),
        *"--model-load-retry-count 3 --allow-cpu-metrics false --allow-gpu-metrics off".split(),
        *"--grpc-infer-response-compression-level HIGH --metrics-config counter_latencies=false".split(),
        "--http-header-forward-pattern", "x-.*", "--grpc-header-forward-pattern=(?-i)PREFIX_.*",
    )  # fmt: skip
    assert (config.log_file, config.log_info, config.log_warning, config.log_error, config.log_format) == (
        Path("/tmp/l.log"), False, False, False, "ISO8601",
    )  # fmt: skip
    assert config.server_name == "triton" and config.model_config_name == "h100"
    assert (config.host, config.grpc_host, config.metrics_host) == ("127.0.0.1", "0.0.0.0", "::1")
    assert config.reuse_http_port and config.reuse_grpc_port and config.exit_on_error
    assert (config.model_load_thread_count, config.model_load_retry_count) == (2, 3)
    assert not config.allow_cpu_metrics and not config.allow_gpu_metrics
    assert config.grpc_response_compression == "high" and config.metrics_counter_latencies is False
    assert config.http_header_forward_pattern == "x-.*"
    assert config.grpc_header_forward_pattern == "(?-i)PREFIX_.*"


def test_addresses_default_to_loopback_and_follow_the_http_address(tmp_path: Path) -> None:
    config = _parse(tmp_path)
    assert (config.host, config.grpc_host, config.metrics_host) == ("127.0.0.1",) * 3
    config = _parse(tmp_path, "--http-address", "0.0.0.0")
    assert (config.grpc_host, config.metrics_host) == ("0.0.0.0", "0.0.0.0")


@pytest.mark.parametrize(
    ("args", "auto_complete"),
    [
        ([], True),
        (["--strict-model-config", "false"], True),
        (["--strict-model-config=true"], False),
        (["--disable-auto-complete-config"], False),
    ],
)
def test_auto_complete(args: list[str], auto_complete: bool, tmp_path: Path) -> None:
    assert _parse(tmp_path, *args).auto_complete_config is auto_complete


def test_deprecated_trace_flags_become_trace_config_entries(tmp_path: Path) -> None:
    config = _parse(
        tmp_path,
        *"--trace-file /tmp/t.json --trace-level TIMESTAMPS --trace-level=TENSORS --trace-rate 10".split(),
        *"--trace-count 5 --trace-log-frequency 50 --trace-config opentelemetry,url=localhost:4318".split(),
    )
    assert config.trace_config == (
        "triton,file=/tmp/t.json", "level=TIMESTAMPS", "level=TENSORS", "rate=10", "count=5",
        "triton,log-frequency=50", "opentelemetry,url=localhost:4318",
    )  # fmt: skip


def test_flags_without_effect_are_recorded_once_each_with_the_reason(tmp_path: Path) -> None:
    config = _parse(
        tmp_path,
        *"--pinned-memory-pool-byte-size 0 --cuda-memory-pool-byte-size 0:0 --cuda-memory-pool-byte-size 1:0".split(),
        *"--allow-sagemaker false --backend-directory /opt/b --cache-directory /opt/c --strict-readiness true".split(),
        *"--metrics-config counter_latencies=true --metrics-config histogram_latencies=true".split(),
    )
    flags = [flag for flag, _ in config.no_effect_flags]
    assert flags == [
        "--allow-sagemaker", "--backend-directory", "--cache-directory", "--pinned-memory-pool-byte-size",
        "--cuda-memory-pool-byte-size", "--metrics-config histogram_latencies",
    ]  # fmt: skip
    assert all(why for _, why in config.no_effect_flags)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--grpc-use-ssl", "true"], "--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key"),
        (["--log-format", "json"], "--log-format: invalid choice"),
        (["--model-load-thread-count", "0"], "--model-load-thread-count must be at least 1"),
        (["--http-header-forward-pattern", "("], "--http-header-forward-pattern: '(' is not a regular expression"),
        (["--exit-on-error", "maybe"], "--exit-on-error: expected true or false, got 'maybe'"),
        (
            ["--http-restricted-api", "inference,key=value"],
            "--http-restricted-api option format is '<config name>:<setting>=<value>'. Got inference,key=value",
        ),
        (
            ["--grpc-restricted-protocol", "metrics:k=v"],
            "--grpc-restricted-protocol: unknown restricted protocol 'metrics'",
        ),
        (
            ["--http-restricted-api=health:a=b", "--http-restricted-api=metadata,health:c=d"],
            "--http-restricted-api: restricted api 'health' can not be specified in multiple config groups",
        ),
        (
            ["--grpc-restricted-protocol=health,health:a=b"],
            "--grpc-restricted-protocol: restricted protocol 'health' can not be specified in multiple config groups",
        ),
    ],
)
def test_bad_values_exit_2_naming_the_flag(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        _parse(tmp_path, *args)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_the_docs_table_is_the_catalogues(capsys: pytest.CaptureFixture[str]) -> None:
    text = SERVER_DOC.read_text()
    found = re.search(r"<!-- tritonserver-flags:start -->\n(.*?)<!-- tritonserver-flags:end -->", text, re.S)
    assert found is not None, "docs/server.md lost its tritonserver-flags markers"
    assert found.group(1) == triton_flags.markdown_table(), (
        "docs/server.md's table of tritonserver flags is stale: paste `python -m reference_server --flags-markdown`"
    )
    assert main(["--flags-markdown"]) == 0
    assert capsys.readouterr().out == triton_flags.markdown_table()


def test_header_forwarding_matches_names_as_triton_does() -> None:
    headers = [("x-user", "ada"), ("X-Trace", "t1"), ("content-type", "application/json"), ("my-x-tag", "m")]
    assert HeaderForwarding("x-.*").select(headers) == {"x-user": "ada", "X-Trace": "t1", "my-x-tag": "m"}
    assert HeaderForwarding("^x-").select(headers) == {"x-user": "ada", "X-Trace": "t1"}
    assert HeaderForwarding("(?-i)^X-").select(headers) == {"X-Trace": "t1"}
    assert HeaderForwarding.of(None) is None and HeaderForwarding.of("") is None
    for reserved in ("priority", "triton_enable_empty_final_response"):
        with pytest.raises(InvalidArgument, match=f"Header '{reserved}' is reserved for Triton usage"):
            HeaderForwarding(".*").select([(reserved, "1")])


def test_grpc_metadata_leaves_out_the_transports_headers() -> None:
    headers = {
        ":path": "/inference.GRPCInferenceService/ModelInfer", "te": "trailers", "content-type": "application/grpc",
        "grpc-accept-encoding": "gzip", "user-agent": "grpc-python", "x-user": "ada",
    }  # fmt: skip
    assert grpc_metadata(headers) == [("user-agent", "grpc-python"), ("x-user", "ada")]

    request = pb.ModelInferRequest(model_name="m")
    forward_into(request, {"x-user": "ada"})
    assert request.parameters["x-user"].string_param == "ada"


@pytest.mark.parametrize(
    ("level", "offered", "coding"),
    [
        ("none", ["identity", "deflate", "gzip"], None),
        ("low", ["identity", "deflate", "gzip"], "gzip"),
        ("medium", ["identity", "deflate", "gzip"], "deflate"),
        ("high", ["identity", "deflate", "gzip"], "deflate"),
        ("high", ["identity"], None),
        ("low", ["deflate"], "deflate"),
    ],
)
def test_grpc_compression_level_picks_an_accepted_coding(level: str, offered: list[str], coding: str | None) -> None:
    assert coding_for_level(level, offered) == coding


class _Repository:
    """What `load_at_start` uses of ModelRepository: `flaky` fails its first two loads, `broken` every one."""

    def __init__(self) -> None:
        self.loaded: set[str] = set()
        self.tries: dict[str, int] = {}
        self.running = self.most_at_once = 0

    def model_names(self) -> list[str]:
        return ["a", "b", "c", "flaky", "broken"]

    def on_disk(self, name: str) -> bool:
        return False  # so no config is read: none is an ensemble

    def serving(self, name: str) -> bool:
        return name in self.loaded

    async def load(self, name: str) -> None:
        self.tries[name] = self.tries.get(name, 0) + 1
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        try:
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            if name == "broken" or (name == "flaky" and self.tries[name] <= 2):
                raise ServerError(f"failed to load '{name}'")
            self.loaded.add(name)
        finally:
            self.running -= 1

    async def load_all(self, names: list[str]) -> None:
        raise AssertionError("no ensembles here")


async def test_models_load_at_start_in_parallel_with_retries() -> None:
    repository = _Repository()
    failed = await load_at_start(repository, threads=2, retries=2)  # type: ignore[arg-type]
    assert failed == ["broken"] and repository.loaded == {"a", "b", "c", "flaky"}
    assert repository.most_at_once == 2 and repository.tries == {"a": 1, "b": 1, "c": 1, "flaky": 3, "broken": 3}
    repository = _Repository()
    assert await load_at_start(repository, threads=1) == ["flaky", "broken"]  # type: ignore[arg-type]
    assert repository.most_at_once == 1
    with pytest.raises(ModelsFailed, match=r"failed to load all models: flaky, broken \(--exit-on-error true\)"):
        await load_at_start(_Repository(), exit_on_error=True)  # type: ignore[arg-type]


def test_metrics_interval_reads_the_system_figures_at_most_that_often(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    reads: list[int] = []

    def cpu_families() -> list[metrics.Family]:
        reads.append(1)
        return []

    monkeypatch.setattr(metrics, "cpu_families", cpu_families)
    monkeypatch.setattr(gpu, "read_gpus", lambda: [])
    repository = ModelRepository(tmp_path, gpu_count=0)
    every_scrape, hourly = metrics.MetricsOptions(), metrics.MetricsOptions(interval_s=3600)
    for options in (every_scrape, hourly, hourly, hourly):
        metrics.scrape(repository, options=options)
    assert len(reads) == 2  # one for the options without an interval, one for the hour
    metrics.scrape(repository, options=metrics.MetricsOptions(cpu=False))
    assert len(reads) == 2


def test_restrictions_group_categories_under_one_header(tmp_path: Path) -> None:
    config = _parse(
        tmp_path,
        "--http-restricted-api=health,metadata:admin-key=a=b",
        "--http-restricted-api",
        "inference:k=v",
        "--grpc-restricted-protocol=model-repository,logging:Key=v",
    )
    assert config.http_restricted_api == (
        ("health", "admin-key", "a=b"), ("metadata", "admin-key", "a=b"), ("inference", "k", "v")
    )  # fmt: skip
    assert config.grpc_restricted_protocol == (("model-repository", "Key", "v"), ("logging", "Key", "v"))
    assert _parse(tmp_path).http_restricted_api == ()


def test_several_model_repositories(tmp_path: Path) -> None:
    config = config_from_args(["--model-repository", "/tmp/a", "--model-store=/tmp/b", "--model-repository=/tmp/c"])
    assert config.model_repository == Path("/tmp/a")
    assert config.more_model_repositories == (Path("/tmp/b"), Path("/tmp/c"))
    assert _parse(tmp_path).more_model_repositories == ()
