"""The response cache: its key, LRU eviction by bytes, what it refuses, the flags, and how hits and
misses are counted against a scheduler that counts its own runs."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from reference_server.config import config_from_args
from reference_server.core.response_cache import (
    ENTRY_OVERHEAD_BYTES,
    TENSOR_OVERHEAD_BYTES,
    CacheConfigError,
    CachedScheduler,
    ResponseCache,
    cache_size_from_flags,
    check_cache_config,
    entry_bytes,
    request_key,
)
from reference_server.errors import ModelConfigError
from reference_server.scheduling.execute import Tensors
from reference_server.scheduling.stats import ModelStats


def key(inputs: dict[str, np.ndarray], *, model: str = "m", version: int = 1, load: int = 1,
        outputs: Sequence[str] = ("OUT",), parameters: dict[str, Any] | None = None) -> bytes:  # fmt: skip
    return request_key(model, version, load, inputs, outputs, parameters or {})


X = np.arange(6, dtype=np.float32).reshape(2, 3)


def test_key_is_stable_and_independent_of_input_order() -> None:
    a = {"A": X, "B": np.ones(3, np.int32)}
    b = {"B": np.ones(3, np.int32), "A": X.copy()}
    assert key(a) == key(b)
    # A non-contiguous view with the same values is the same request.
    assert key({"A": np.asfortranarray(X)}) == key({"A": X})


@pytest.mark.parametrize(
    "other",
    [
        {"inputs": {"A": X + 1}},  # bytes
        {"inputs": {"A": X.reshape(3, 2)}},  # shape, same bytes
        {"inputs": {"A": X.view(np.int32)}},  # datatype, same bytes
        {"inputs": {"Z": X}},  # input name
        {"model": "n"},
        {"version": 2},
        {"load": 2},  # the same version reloaded
        {"outputs": ("OUT", "OTHER")},
        {"parameters": {"p": 1}},
    ],
)
def test_key_changes_with_every_part(other: dict[str, Any]) -> None:
    base: dict[str, Any] = {"inputs": {"A": X}}
    assert key(**base) != key(**{**base, **other})


def test_bytes_elements_are_length_prefixed_in_the_key() -> None:
    # Concatenated, ["ab", "c"] and ["a", "bc"] would be the same bytes.
    one = np.array([b"ab", b"c"], dtype=object)
    two = np.array([b"a", b"bc"], dtype=object)
    assert key({"S": one}) != key({"S": two})
    assert entry_bytes({"S": one}) == ENTRY_OVERHEAD_BYTES + TENSOR_OVERHEAD_BYTES + 4 + 2 + 4 + 1
    assert entry_bytes({"A": X}) == ENTRY_OVERHEAD_BYTES + TENSOR_OVERHEAD_BYTES + 24


def test_lookup_returns_a_read_only_copy() -> None:
    cache = ResponseCache(1024)
    out = np.zeros(4, np.float32)
    assert cache.insert(b"k", {"OUT": out})
    out[0] = 9  # the caller's array changes later: the cached one must not
    hit = cache.lookup(b"k")
    assert hit is not None
    assert hit["OUT"][0] == 0
    assert not hit["OUT"].flags.writeable
    assert cache.lookup(b"other") is None


def test_evicts_least_recently_used_by_bytes() -> None:
    small = entry_bytes({"OUT": np.zeros(100, np.float32)})
    big = entry_bytes({"OUT": np.zeros(200, np.float32)})
    assert small < big < 2 * small
    cache = ResponseCache(3 * small)  # three entries of 100 FP32 values
    entries = {name: {"OUT": np.full(100, i, np.float32)} for i, name in enumerate([b"a", b"b", b"c"])}
    for name, outputs in entries.items():
        assert cache.insert(name, outputs)
    assert cache.used_bytes == 3 * small
    assert cache.lookup(b"a") is not None  # a is now the most recently used: b goes first
    assert cache.insert(b"d", {"OUT": np.zeros(100, np.float32)})
    assert cache.lookup(b"b") is None
    assert [cache.lookup(k) is not None for k in (b"a", b"c", b"d")] == [True, True, True]
    # One entry larger than one free slot pushes out the two least recent.
    assert cache.insert(b"big", {"OUT": np.zeros(200, np.float32)})
    assert cache.lookup(b"a") is None and cache.lookup(b"c") is None
    assert cache.used_bytes == small + big and len(cache) == 2


def test_a_response_larger_than_the_cache_is_not_stored_and_evicts_nothing() -> None:
    cache = ResponseCache(entry_bytes({"OUT": np.zeros(25, np.float32)}))
    assert cache.insert(b"small", {"OUT": np.zeros(10, np.float32)})
    assert not cache.insert(b"huge", {"OUT": np.zeros(26, np.float32)})  # 4 bytes too many
    assert cache.lookup(b"huge") is None
    assert cache.lookup(b"small") is not None


def test_tiny_responses_cannot_hold_more_than_the_cache_size_in_bookkeeping() -> None:
    cache = ResponseCache(1 << 16)
    for i in range(10_000):
        cache.insert(i.to_bytes(4, "little"), {"OUT": np.zeros(1, np.float32)})
    # 4 data bytes each would allow 16,384 entries; their allowances bound them far lower.
    assert len(cache) == (1 << 16) // entry_bytes({"OUT": np.zeros(1, np.float32)}) < 200


def test_an_existing_key_is_not_replaced() -> None:
    cache = ResponseCache(1000)
    assert cache.insert(b"k", {"OUT": np.zeros(1, np.float32)})
    assert not cache.insert(b"k", {"OUT": np.ones(1, np.float32)})
    hit = cache.lookup(b"k")
    assert hit is not None and hit["OUT"][0] == 0
    assert cache.used_bytes == entry_bytes({"OUT": np.zeros(1, np.float32)})


def test_concurrent_inserts_keep_the_byte_count_exact() -> None:
    size = entry_bytes({"OUT": np.zeros(16, np.float32)})
    cache = ResponseCache(40 * size)

    def fill(start: int) -> None:
        for i in range(start, start + 500):
            cache.insert(i.to_bytes(4, "little"), {"OUT": np.zeros(16, np.float32)})
            cache.lookup((i // 2).to_bytes(4, "little"))

    threads = [threading.Thread(target=fill, args=(n * 500,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert cache.used_bytes == size * len(cache) <= cache.capacity_bytes
    assert len(cache) == 40


# -- flags ---------------------------------------------------------------------------------------


def test_flags_give_the_local_cache_size() -> None:
    assert cache_size_from_flags([], None) is None
    assert cache_size_from_flags(["local,size=1048576"], None) == 1048576
    assert cache_size_from_flags([], 4096) == 4096  # the deprecated flag means local,size=


@pytest.mark.parametrize(
    ("flags", "byte_size", "message"),
    [
        (["size=100"], None, "No cache specified. --cache-config option format is <cache name>,<setting>=<value>"),
        (["local,size"], None, "--cache-config option format is '<cache name>,<setting>=<value>'. Got local,size"),
        (["local,size="], None, "--cache-config option format is"),
        (["local,size=0"], None, "a cache of 0 bytes can hold no response"),
        (["local,size=-5"], None, "'size' must be a whole number of bytes, got '-5'"),
        (["local,size=1MB"], None, "got '1MB'"),
        (["local,bogus=1"], None, "has no setting ['bogus']"),
        (["redis,host=x"], None, "cache 'redis' is not available"),
        (["local,size=1", "redis,host=x"], None, "only a single cache is currently supported"),
        (["local,size=1"], 10, "Incompatible flags --response-cache-byte-size and --cache-config"),
        ([], 0, "a cache of 0 bytes"),
    ],
)
def test_bad_cache_flags_say_what_to_give(flags: list[str], byte_size: int | None, message: str) -> None:
    with pytest.raises(CacheConfigError, match=None) as caught:
        cache_size_from_flags(flags, byte_size)
    assert message in str(caught.value)


def test_decoupled_and_sequence_models_refuse_the_cache_with_tritons_words() -> None:
    config = mc.ModelConfig(name="m")
    config.response_cache.enable = True
    check_cache_config(config)  # a plain model may
    config.model_transaction_policy.decoupled = True
    with pytest.raises(ModelConfigError, match="Response Cache does not currently support model m with 'decoupled'"):
        check_cache_config(config)
    config.model_transaction_policy.decoupled = False
    config.sequence_batching.SetInParent()
    with pytest.raises(ModelConfigError, match="with sequence batching scheduler. Please disable the response cache"):
        check_cache_config(config)
    config.response_cache.enable = False
    check_cache_config(config)


# -- counting ------------------------------------------------------------------------------------


class CountingScheduler:
    """Doubles its input, counting its runs and the success in the stats as the real one does."""

    def __init__(self, stats: ModelStats) -> None:
        self.stats = stats
        self.runs = 0

    async def infer(self, inputs: Tensors, output_names: Sequence[str], **_: Any) -> Tensors:
        self.runs += 1
        self.stats.record_success(1000, 100, 10, 20, 30)
        self.stats.record_execution(1, 10, 20, 30)
        return {"OUT": inputs["IN"] * 2}


async def test_hits_skip_the_scheduler_and_count_as_triton_counts() -> None:
    stats = ModelStats(cache_enabled=True)
    ensemble = ModelStats()  # an ensemble whose step this is counts the hits too (secondary stats)
    scheduler = CountingScheduler(stats)
    cached = CachedScheduler(scheduler, ResponseCache(1 << 20), stats, ("m", 1))  # type: ignore[arg-type]
    x = np.ones((1, 4), np.float32)

    async def ask(value: np.ndarray) -> Tensors:
        return await cached.infer({"IN": value}, ["OUT"], received_ns=time.perf_counter_ns(), secondary_stats=ensemble)

    first = await ask(x)
    again = [await ask(x) for _ in range(3)]
    other = await ask(x + 1)
    assert scheduler.runs == 2  # x once, x + 1 once
    for outputs in again:
        np.testing.assert_array_equal(outputs["OUT"], first["OUT"])
    np.testing.assert_array_equal(other["OUT"], (x + 1) * 2)

    doc = stats.to_dict("m", "1")
    inference = doc["inference_stats"]
    assert inference["success"]["count"] == 5
    assert inference["queue"]["count"] == 5
    assert inference["cache_hit"]["count"] == 3 and inference["cache_hit"]["ns"] > 0
    assert inference["cache_miss"]["count"] == 2 and inference["cache_miss"]["ns"] > 0
    for phase in ("compute_input", "compute_infer", "compute_output"):
        assert inference[phase]["count"] == 2  # hits computed nothing
    assert doc["inference_count"] == 2 and doc["execution_count"] == 2
    assert ensemble.cache_hit_count == 3

    # A stream answers once, from the cache too.
    responses = [item async for item in cached.infer_stream({"IN": x}, ["OUT"])]
    assert len(responses) == 1 and responses[0][1] is True
    assert stats.cache_hit_count == 4 and scheduler.runs == 2


async def test_failed_requests_are_neither_cached_nor_counted_as_misses() -> None:
    stats = ModelStats(cache_enabled=True)
    cache = ResponseCache(1 << 20)

    class Failing:
        async def infer(self, *args: Any, **kwargs: Any) -> Tensors:
            raise RuntimeError("model failed")

    with pytest.raises(RuntimeError):
        await CachedScheduler(Failing(), cache, stats, ("m", 1)).infer({"IN": X}, ["OUT"])  # type: ignore[arg-type]
    assert len(cache) == 0 and stats.cache_miss_count == 0 and stats.cache_hit_count == 0


# -- the server's flags --------------------------------------------------------------------------


def test_server_flags_configure_the_cache_and_the_rate_limiter(tmp_path: Path) -> None:
    config = config_from_args([
        "--model-repository", str(tmp_path), "--cache-config", "local,size=1048576", "--rate-limit", "EXECUTION_COUNT",
        "--rate-limit-resource", "R:2", "--rate-limit-resource", "S:1:0", "--cache-directory", "/opt/caches",
    ])  # fmt: skip
    assert config.response_cache_bytes == 1048576
    assert config.rate_limit == "execution_count"
    assert config.rate_limit_resources == (("R", 2, None), ("S", 1, 0))
    plain = config_from_args(["--model-repository", str(tmp_path)])
    assert plain.response_cache_bytes is None and plain.rate_limit == "off"


def test_deprecated_byte_size_flag_warns_and_means_local_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = config_from_args(["--model-repository", str(tmp_path), "--response-cache-byte-size", "512"])
    assert config.response_cache_bytes == 512
    assert "'--cache-config=local,size=512'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--cache-config", "local,size=0"], "a cache of 0 bytes can hold no response"),
        (["--cache-config", "nonsense"], "No cache specified"),
        (["--rate-limit", "fast"], "invalid choice: 'fast'"),
        (["--rate-limit-resource", "R"], "--rate-limit-resource option format is"),
    ],
)
def test_bad_server_flags_stop_with_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        config_from_args(["--model-repository", str(tmp_path), *flags])
    assert exited.value.code == 2
    assert message in capsys.readouterr().err
