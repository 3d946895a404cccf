"""tritonserver's restricted endpoints (`--http-restricted-api`, `--grpc-restricted-protocol`),
shared by the HTTP and gRPC front ends.

Each flag names categories of endpoints and one header that a request to them must carry with
one value: `<category>[,<category>...]:<key>=<value>`. A request to a restricted endpoint without
it is refused before anything else about it is looked at (method, model, body), as tritonserver
2.51 does: HTTP 403 `This API is restricted, expecting header '<key>'` (the header's name compared
case-insensitively, its value exactly); gRPC UNAVAILABLE `This protocol is restricted, expecting
header 'triton-grpc-protocol-<key>'` (the metadata key is the key with that prefix, as given: gRPC
metadata keys are lower case, so a key with a capital letter is never matched, as on Triton). A
category may be in one group only; one flag may be given several times.

With no restriction a front end holds None and checks nothing per request.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Mapping

__all__ = [
    "CATEGORIES",
    "GRPC_KEY_PREFIX",
    "GRPC_METHOD_CATEGORIES",
    "HTTP_ENDPOINT_CATEGORIES",
    "Restrictions",
    "parse_restrictions",
]

#: tritonserver's restricted categories (src/restricted_features.h), in its order.
CATEGORIES = (
    "health",
    "metadata",
    "inference",
    "shared-memory",
    "model-config",
    "model-repository",
    "statistics",
    "trace",
    "logging",
)
GRPC_KEY_PREFIX = "triton-grpc-protocol-"

#: The REST handlers (`RestApi` method names) by category, as src/http_server.cc checks them.
HTTP_ENDPOINT_CATEGORIES: Mapping[str, str] = {
    "health_live": "health",
    "health_ready": "health",
    "model_ready": "health",
    "server_metadata": "metadata",
    "model_metadata": "metadata",
    "infer": "inference",
    "generate": "inference",
    "generate_stream": "inference",
    "system_shm_status": "shared-memory",
    "system_shm_register": "shared-memory",
    "system_shm_unregister": "shared-memory",
    "cuda_shm_status": "shared-memory",
    "cuda_shm_register": "shared-memory",
    "cuda_shm_unregister": "shared-memory",
    "model_config": "model-config",
    "repository_index": "model-repository",
    "repository_load": "model-repository",
    "repository_unload": "model-repository",
    "model_stats": "statistics",
    "trace_setting": "trace",
    "logging": "logging",
}

#: The GRPCInferenceService methods by category, as src/grpc/grpc_server.cc checks them.
GRPC_METHOD_CATEGORIES: Mapping[str, str] = {
    "ServerLive": "health",
    "ServerReady": "health",
    "ModelReady": "health",
    "ServerMetadata": "metadata",
    "ModelMetadata": "metadata",
    "ModelInfer": "inference",
    "ModelStreamInfer": "inference",
    "SystemSharedMemoryStatus": "shared-memory",
    "SystemSharedMemoryRegister": "shared-memory",
    "SystemSharedMemoryUnregister": "shared-memory",
    "CudaSharedMemoryStatus": "shared-memory",
    "CudaSharedMemoryRegister": "shared-memory",
    "CudaSharedMemoryUnregister": "shared-memory",
    "ModelConfig": "model-config",
    "RepositoryIndex": "model-repository",
    "RepositoryModelLoad": "model-repository",
    "RepositoryModelUnload": "model-repository",
    "ModelStatistics": "statistics",
    "TraceSetting": "trace",
    "LogSettings": "logging",
}

#: (category, header key, value)
Rule = tuple[str, str, str]


def parse_restrictions(entries: Iterable[str], flag: str, kind: str) -> tuple[Rule, ...]:
    """The rules of every `flag` entry given (`kind`: "api" or "protocol", as Triton words its errors),
    or ArgumentTypeError in tritonserver's words."""
    rules: dict[str, Rule] = {}
    for entry in entries:
        names, colon, setting = entry.partition(":")
        key, equals, value = setting.partition("=")
        if not (colon and equals and names and key and value):
            raise argparse.ArgumentTypeError(f"{flag} option format is '<config name>:<setting>=<value>'. Got {entry}")
        for name in names.split(","):
            if name not in CATEGORIES:
                raise argparse.ArgumentTypeError(
                    f"{flag}: unknown restricted {kind} '{name}'; known: {', '.join(CATEGORIES)}"
                )
            if name in rules:
                raise argparse.ArgumentTypeError(
                    f"{flag}: restricted {kind} '{name}' can not be specified in multiple config groups"
                )
            rules[name] = (name, key, value)
    return tuple(rules.values())


class Restrictions:
    """The restricted endpoints of one front end: each endpoint's (header, value, refusal message)."""

    __slots__ = ("_by_endpoint",)

    def __init__(self, by_endpoint: dict[str, tuple[str, str, str]]) -> None:
        self._by_endpoint = by_endpoint

    @classmethod
    def for_http(cls, rules: Iterable[Rule]) -> Restrictions | None:
        """The REST front end's restrictions, or None when there are none."""
        by_category = {c: (k.lower(), v, f"This API is restricted, expecting header '{k}'") for c, k, v in rules}
        return cls._of(by_category, HTTP_ENDPOINT_CATEGORIES)

    @classmethod
    def for_grpc(cls, rules: Iterable[Rule]) -> Restrictions | None:
        """The gRPC front end's restrictions, or None when there are none."""
        by_category = {}
        for category, key, value in rules:
            header = GRPC_KEY_PREFIX + key
            by_category[category] = (header, value, f"This protocol is restricted, expecting header '{header}'")
        return cls._of(by_category, GRPC_METHOD_CATEGORIES)

    @classmethod
    def _of(cls, by_category: dict[str, tuple[str, str, str]], endpoints: Mapping[str, str]) -> Restrictions | None:
        if not by_category:
            return None
        return cls({e: by_category[c] for e, c in endpoints.items() if c in by_category})

    def refusal(self, endpoint: str, headers: Mapping[str, str]) -> str | None:
        """Why a request to `endpoint` (a REST handler's or gRPC method's name) with `headers` (by
        lower-case name) is refused, or None when it may go on."""
        rule = self._by_endpoint.get(endpoint)
        if rule is None:
            return None
        header, value, message = rule
        return None if headers.get(header) == value else message
