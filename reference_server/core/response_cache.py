"""Triton's response cache: `--cache-config local,size=BYTES` on the server, `response_cache { enable: true }`
on a model.

Theory of operation
-------------------
A model version with the cache has its scheduler wrapped in a `CachedScheduler`, which looks each
request up before the scheduler sees it (Triton's `DynamicBatchScheduler::Enqueue` does the same
before it queues): a hit is answered at once and never queues or runs, a miss runs as usual and its
outputs are inserted when it succeeds. Client requests, ensemble steps and python BLS calls all
reach a model through its scheduler, so all of them use the cache, as in Triton. A model uses the
cache only when both the server has one and the model's config enables it; otherwise requests go
straight to the scheduler, as in Triton (`response_cache_enabled_ = model && server`). A decoupled
or sequence-batched model with the cache enabled is refused at load (`check_cache_config`).

*The key* (Triton's `TritonCache::Hash`, core src/cache_manager.cc) covers the model name and version
and every input, sorted by name, with its raw bytes. Ours also covers each input's datatype and shape
(Triton's would answer an FP32 [2,3] request from a cached [3,2] one with the same bytes), the
requested output names (a request for one output must not get a response cached for another), the
parameters the model can see (a python model may read them) and the load the version came from, so
that a model reloaded with new weights under the same version number never answers from its old
entries. The hash is BLAKE2b over those fields, each length-prefixed, so no two requests share a key
by concatenation.

*Size*, as in Triton's local cache: a fixed budget of bytes, entries evicted least recently used
first; an entry costs the bytes of its output tensors (BYTES elements with their 4-byte length
prefixes, as they travel) plus an allowance for what holding it costs beside the data (its key, its
place in the table, each array's header: `ENTRY_OVERHEAD_BYTES`, `TENSOR_OVERHEAD_BYTES`), so that a
cache of tiny responses cannot hold many times its size in bookkeeping. A response larger than the
whole cache is not stored (Triton logs "Requested byte_size: N is greater than total cache size: M"
and counts the request as a miss).

*Statistics* (Triton's `UpdateSuccessCacheHit` / `UpdateSuccessCacheMiss`, core src/infer_stats.cc):
a hit counts as a success whose queue time runs until the lookup started, and its lookup time as
`cache_hit`; it adds nothing to the compute figures, inference_count or execution_count. A miss adds
its lookup and insertion time to `cache_miss` and to the request's time.

Thread-safe: one lock around the table, so a cache could be shared beyond the event loop.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from time import perf_counter_ns
from typing import Any

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from reference_server.errors import ModelConfigError, ServerError
from reference_server.scheduling.execute import Tensors
from reference_server.scheduling.model_scheduler import ModelScheduler, SubmitsByTask
from reference_server.scheduling.stats import ModelStats

__all__ = [
    "CacheConfigError",
    "CachedScheduler",
    "ResponseCache",
    "cache_size_from_flags",
    "cached",
    "check_cache_config",
    "request_key",
]

log = logging.getLogger(__name__)

#: What an entry costs beside its data, and each of its tensors: its key, table slot, outputs dict and
#: array headers, measured with tracemalloc on CPython 3.11 (about 410 and 116 bytes), rounded up.
ENTRY_OVERHEAD_BYTES = 448
TENSOR_OVERHEAD_BYTES = 128

#: The one cache implementation built in (Triton loads `libtritoncache_<name>.so` from --cache-directory).
LOCAL = "local"
_FORMAT = "--cache-config option format is '<cache name>,<setting>=<value>'. Got "


class CacheConfigError(ValueError):
    """A --cache-config or --response-cache-byte-size flag that cannot configure a cache."""


class ResponseCache:
    """A byte-bounded LRU map from request keys to the outputs of successful responses."""

    def __init__(self, capacity_bytes: int) -> None:
        if capacity_bytes <= 0:
            raise ValueError("a response cache needs a positive capacity in bytes")
        self.capacity_bytes = capacity_bytes
        self._entries: OrderedDict[bytes, tuple[Tensors, int]] = OrderedDict()
        self._used = 0
        self._lock = threading.Lock()
        self._warned: set[str] = set()

    @property
    def used_bytes(self) -> int:
        return self._used

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, key: bytes) -> Tensors | None:
        """The outputs cached under `key` (read-only arrays), now the most recently used; or None."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            self._entries.move_to_end(key)
            return entry[0]

    def insert(self, key: bytes, outputs: Tensors, model_name: str = "") -> bool:
        """Store a copy of `outputs` under `key`, evicting the least recently used entries to make
        room. False when the response is larger than the whole cache (nothing is stored) or the key
        is already there (another request of the same key finished first)."""
        size = entry_bytes(outputs)
        if size > self.capacity_bytes:
            if model_name not in self._warned:  # once per model: every miss of it would say the same
                self._warned.add(model_name)
                log.warning(
                    "response of model '%s' not cached: Requested byte_size: %d is greater than total cache "
                    "size: %d; raise --cache-config local,size=BYTES",
                    model_name,
                    size,
                    self.capacity_bytes,
                )
            return False
        frozen = {name: _frozen_copy(array) for name, array in outputs.items()}
        with self._lock:
            if key in self._entries:
                return False
            while self._used + size > self.capacity_bytes:
                _, (_, evicted) = self._entries.popitem(last=False)
                self._used -= evicted
            self._entries[key] = (frozen, size)
            self._used += size
        return True


class CachedScheduler(SubmitsByTask):
    """A model version's scheduler behind the response cache (the `ModelScheduler` surface): a hit
    is answered here, a miss goes to `inner` and is inserted when it succeeds; both are counted in
    `stats` (and a hit in an ensemble's `secondary_stats`) as Triton counts them. Client requests,
    ensemble steps and python BLS calls all reach a model through its scheduler, so all use the cache,
    as in Triton, where the lookup is in the scheduler's `Enqueue`."""

    def __init__(self, inner: ModelScheduler, cache: ResponseCache, stats: ModelStats, model: tuple[str, int]) -> None:
        self.inner = inner
        self.cache = cache
        self.stats = stats
        self.model = model

    async def infer(
        self,
        inputs: Tensors,
        output_names: Sequence[str],
        *,
        timeout_us: int | None = None,
        received_ns: int | None = None,
        request_id: str = "",
        parameters: dict[str, Any] | None = None,
        secondary_stats: ModelStats | None = None,
    ) -> Tensors:
        enqueued = perf_counter_ns()  # where Triton's queue time starts: the request reaches its scheduler
        if received_ns is None:
            received_ns = enqueued
        name, version = self.model
        key = request_key(name, version, self.stats.load_id, inputs, output_names, parameters or {})
        lookup_start = perf_counter_ns()
        cached = self.cache.lookup(key)
        lookup_end = perf_counter_ns()
        if cached is not None:
            times = (lookup_end - received_ns, lookup_start - enqueued, lookup_end - lookup_start)
            self.stats.record_cache_hit(*times)
            if secondary_stats is not None:
                secondary_stats.record_cache_hit(*times)
            return cached
        outputs = await self.inner.infer(
            inputs, output_names, timeout_us=timeout_us, received_ns=received_ns, request_id=request_id,
            parameters=parameters, secondary_stats=secondary_stats,
        )  # fmt: skip
        insert_start = perf_counter_ns()
        self.cache.insert(key, outputs, name)
        self.stats.record_cache_miss(lookup_end - lookup_start + perf_counter_ns() - insert_start)
        return outputs

    def infer_stream(
        self,
        inputs: Tensors,
        output_names: Sequence[str],
        *,
        timeout_us: int | None = None,
        received_ns: int | None = None,
        request_id: str = "",
        parameters: dict[str, Any] | None = None,
        secondary_stats: ModelStats | None = None,
    ) -> AsyncIterator[tuple[Tensors | ServerError | None, bool]]:
        """One response, final (a model with the cache is never decoupled: `check_cache_config`)."""
        return _one(self.infer(inputs, output_names, timeout_us=timeout_us, received_ns=received_ns,
                               request_id=request_id, parameters=parameters,
                               secondary_stats=secondary_stats))  # fmt: skip

    async def close(self, grace_s: float) -> None:
        await self.inner.close(grace_s)


def cached(
    scheduler: ModelScheduler, cache: ResponseCache | None, config: mc.ModelConfig, stats: ModelStats, version: int
) -> ModelScheduler:
    """A model version's scheduler behind the cache when the server has one and the model's config
    enables it (as Triton's `response_cache_enabled_`); else `scheduler` itself. A config that enables
    the cache marks `stats` either way: Triton exports the model's nv_cache_* metrics (zeros without a
    server cache) on the model's setting alone."""
    stats.cache_enabled = config.response_cache.enable
    if cache is None or not config.response_cache.enable:
        return scheduler
    return CachedScheduler(scheduler, cache, stats, (config.name, version))


async def _one(answer: Awaitable[Tensors]) -> AsyncIterator[tuple[Tensors | ServerError | None, bool]]:
    yield await answer, True


def entry_bytes(outputs: Mapping[str, np.ndarray]) -> int:
    """What a response's outputs cost in the cache: their data bytes (BYTES elements length-prefixed)
    and the bookkeeping allowances (see "Size")."""
    total = ENTRY_OVERHEAD_BYTES
    for array in outputs.values():
        total += TENSOR_OVERHEAD_BYTES
        if array.dtype == object:
            total += sum(4 + len(_as_bytes(item)) for item in array.flat)
        else:
            total += array.nbytes
    return total


def request_key(
    model_name: str,
    model_version: int,
    load_id: int,
    inputs: Mapping[str, np.ndarray],
    output_names: Sequence[str],
    parameters: Mapping[str, Any],
) -> bytes:
    """The cache key of one request to one loaded model version (see "The key")."""
    digest = hashlib.blake2b(digest_size=32)

    def field(data: bytes) -> None:
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)

    field(model_name.encode())
    field(f"{model_version}:{load_id}".encode())
    for name in sorted(inputs):
        array = inputs[name]
        field(name.encode())
        field(array.dtype.str.encode() if array.dtype != object else b"BYTES")
        field(",".join(map(str, array.shape)).encode())
        if array.dtype == object:
            for item in array.flat:
                field(_as_bytes(item))
        else:
            field(np.ascontiguousarray(array).tobytes())
    field("\0".join(output_names).encode())
    field(repr(sorted((str(k), repr(v)) for k, v in parameters.items())).encode())
    return digest.digest()


def check_cache_config(config: mc.ModelConfig) -> None:
    """Triton's load-time refusals of `response_cache { enable: true }` (core src/model_config_utils.cc)."""
    if not config.response_cache.enable:
        return
    if config.model_transaction_policy.decoupled:
        raise ModelConfigError(
            f"Response Cache does not currently support model {config.name} with 'decoupled' transaction "
            "policy. Please disable the response cache."
        )
    if config.HasField("sequence_batching"):
        raise ModelConfigError(
            f"Response Cache does not currently support model {config.name} with sequence batching scheduler. "
            "Please disable the response cache."
        )


def cache_size_from_flags(cache_config: Sequence[str], response_cache_byte_size: int | None) -> int | None:
    """The local cache's size in bytes from Triton's flags, or None for no cache.

    `cache_config` holds each `--cache-config <cache name>,<setting>=<value>`; the deprecated
    `--response-cache-byte-size N` means `local,size=N`. Raises CacheConfigError with Triton's wording
    where Triton has one.
    """
    if response_cache_byte_size is not None and cache_config:
        raise CacheConfigError(
            "Error: Incompatible flags --response-cache-byte-size and --cache-config both provided. Please "
            "provide one or the other."
        )
    settings: dict[str, dict[str, str]] = {}
    if response_cache_byte_size is not None:
        settings[LOCAL] = {"size": str(response_cache_byte_size)}
    for entry in cache_config:
        name, comma, rest = entry.partition(",")
        if not comma or not name:
            raise CacheConfigError(
                f"No cache specified. --cache-config option format is <cache name>,<setting>=<value>. Got {entry}"
            )
        setting, equals, value = rest.partition("=")
        if not equals or not setting or not value:
            raise CacheConfigError(_FORMAT + entry)
        settings.setdefault(name, {})[setting] = value
    if not settings:
        return None
    if len(settings) > 1:
        raise CacheConfigError(
            f"found multiple cache configurations ({', '.join(sorted(settings))}), but only a single cache is "
            "currently supported"
        )
    ((name, values),) = settings.items()
    if name != LOCAL:
        raise CacheConfigError(
            f"--cache-config: cache '{name}' is not available; this server has the 'local' cache only "
            "(--cache-config local,size=BYTES)"
        )
    unknown = sorted(set(values) - {"size"})
    if unknown:
        raise CacheConfigError(f"--cache-config: the local cache has no setting {unknown}; it takes size=BYTES")
    if "size" not in values:
        raise CacheConfigError("Failed to initialize LocalCache: config didn't contain a valid 'size' field.")
    text = values["size"]
    if not text.isdigit():
        raise CacheConfigError(
            f"Failed to initialize LocalCache: 'size' must be a whole number of bytes, got '{text}' "
            "(--cache-config local,size=BYTES)"
        )
    size = int(text)
    if size == 0:
        raise CacheConfigError(
            "Failed to initialize LocalCache: a cache of 0 bytes can hold no response; give "
            "--cache-config local,size=BYTES a positive size, or leave the flag out for no cache"
        )
    return size


def _as_bytes(item: object) -> bytes:
    if isinstance(item, bytes):
        return item
    if isinstance(item, str):
        return item.encode()
    return str(item).encode()


def _frozen_copy(array: np.ndarray) -> np.ndarray:
    # Every hit hands out the same arrays: nobody may write into them.
    copy = np.array(array, copy=True)
    copy.flags.writeable = False
    return copy
