"""Model warmup: run a version's `model_warmup` samples on each of its instances before it serves.

Triton (core `TritonModelInstance::GenerateWarmupData` and `WarmUp`) builds every sample from the
config alone and hands it straight to each instance, past the scheduler: a model is not reported
ready until warmup has finished, and warmup never shows in statistics or metrics. Here
`run_warmup` is called in the loading thread once the instances exist and before the version is
swapped in, and it calls `instance.run` directly, so the same holds. Any failure (a sample that does
not fit the model, a missing or escaping data file, an error from the model) fails the load with a
ModelConfigError naming the model and the warmup entry, and the previous versions keep serving.

Sample semantics, as Triton's:

- `dims` leave out the batch dimension and must be concrete (no -1). When `max_batch_size > 0`
  the sample is repeated `batch_size` times along a new leading batch dimension; an unbatched model
  runs the sample `batch_size` times instead.
- A sample has the config's `dims`; where an input has a `reshape`, the model gets the sample
  reshaped, as it gets a client's request (Triton's warmup requests are normalised alike).
- `count` is the number of iterations; 0 means once. An entry with `batch_size: 0` is skipped.
- `input_data_file` names a file under `<model>/warmup/` holding the raw little-endian row-major
  bytes of one batch-1 sample; longer files are cut to size. For TYPE_STRING it holds the
  elements, each a 4-byte length and the bytes.
- `random_data` is uniform in [0, 1) for floating types and in [0, 100) for integers (Triton
  fills random bytes, which for floats may be NaN; a model under warmup should not see NaN).
  TYPE_STRING random data is empty strings, as in Triton.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from tritonclient.grpc import model_config_pb2 as mc

from reference_server.errors import ModelConfigError
from reference_server.scheduling.execute import ModelInstance, Tensor
from reference_server.scheduling.reshape import ReshapePlan
from v2kit import codec as v2

__all__ = ["WARMUP_FOLDER", "run_warmup", "warmup_samples"]

log = logging.getLogger(__name__)

WARMUP_FOLDER = "warmup"


def run_warmup(config: mc.ModelConfig, instances: Sequence[ModelInstance], model_dir: Path) -> int:
    """Run every `model_warmup` entry of `config` on each instance; return the number of runs.

    Blocking: call it from the loading thread. Raises ModelConfigError on any failure.
    """
    runs = 0
    for label, repeats, sample in warmup_samples(config, model_dir):
        for instance in instances:
            for _ in range(repeats):
                try:
                    instance.run(sample, ())
                except Exception as exc:
                    raise ModelConfigError(
                        f"{label}: warmup failed on instance '{instance.name}': {type(exc).__name__}: {exc}"
                    ) from exc
                runs += 1
    if runs:
        log.info("model '%s': %d warmup run(s) on %d instance(s)", config.name, runs, len(instances))
    return runs


def warmup_samples(config: mc.ModelConfig, model_dir: Path) -> list[tuple[str, int, dict[str, Tensor]]]:
    """(label, runs per instance, inputs) for each `model_warmup` entry that runs.

    All samples are built before any runs, so a bad entry fails the load before the model is touched.
    """
    rng = np.random.default_rng(0)  # seeded: a warmup is the same on every load
    plan = ReshapePlan.from_config(config)
    samples = []
    for index, entry in enumerate(config.model_warmup):
        label = f"model '{config.name}' model_warmup '{entry.name or index}'"
        if entry.batch_size == 0:
            log.info("%s: batch_size 0, skipped as Triton does", label)
            continue
        batched = config.max_batch_size > 0
        if batched and entry.batch_size > config.max_batch_size:
            raise ModelConfigError(
                f"{label}: batch_size {entry.batch_size} is larger than max_batch_size {config.max_batch_size}"
            )
        inputs = _sample(config, entry, model_dir, rng, label)
        if batched:
            inputs = {name: np.repeat(array[np.newaxis], entry.batch_size, axis=0) for name, array in inputs.items()}
        if plan is not None:  # a sample has the config's dims, and the model takes the reshape, as in Triton
            inputs = plan.to_model(inputs)
        # An unbatched model cannot take the copies in one run: each is a run of its own.
        repeats = max(entry.count, 1) * (1 if batched else entry.batch_size)
        if repeats > MAX_WARMUP_RUNS:
            # A hostile or mistaken count would hold the load (and a server's start-up) for hours.
            raise ModelConfigError(f"{label}: {repeats} warmup runs asked; at most {MAX_WARMUP_RUNS} are allowed")
        samples.append((label, repeats, inputs))
    return samples


MAX_WARMUP_RUNS = 10_000
MAX_WARMUP_ELEMENTS = 1 << 26


def _sample(
    config: mc.ModelConfig, entry: mc.ModelWarmup, model_dir: Path, rng: np.random.Generator, label: str
) -> dict[str, Tensor]:
    declared = {tensor.name: tensor for tensor in config.input}
    arrays: dict[str, Tensor] = {}
    for name in sorted(entry.inputs):
        spec = entry.inputs[name]
        what = f"{label}: input '{name}'"
        tensor = declared.get(name)
        if tensor is None:
            raise ModelConfigError(f"{what} is not an input of the model; its inputs are {sorted(declared)}")
        if spec.data_type != tensor.data_type:
            raise ModelConfigError(
                f"{what} has data_type {mc.DataType.Name(spec.data_type)} but the model input is "
                f"{mc.DataType.Name(tensor.data_type)}"
            )
        dims = list(spec.dims)
        expected = list(tensor.dims)
        if any(d < 0 for d in dims):
            raise ModelConfigError(f"{what} has dims {dims}; warmup dims must all be concrete sizes >= 0")
        if len(dims) != len(expected) or any(e != -1 and e != d for e, d in zip(expected, dims)):
            batch_note = " (warmup dims leave out the batch dimension)" if config.max_batch_size > 0 else ""
            raise ModelConfigError(f"{what} has dims {dims}, which do not fit the input's dims {expected}{batch_note}")
        if math.prod(dims) * max(entry.batch_size, 1) > MAX_WARMUP_ELEMENTS:
            raise ModelConfigError(
                f"{what}: dims {dims} × batch_size {entry.batch_size} is over {MAX_WARMUP_ELEMENTS} elements"
            )
        arrays[name] = _data(spec, dims, model_dir, rng, what)
    missing = [name for name, tensor in declared.items() if name not in arrays and not tensor.optional]
    if missing:
        raise ModelConfigError(f"{label} gives no data for model input(s) {missing}")
    return arrays


def _data(spec: mc.ModelWarmup.Input, dims: list[int], model_dir: Path, rng: np.random.Generator, what: str) -> Tensor:
    type_name = mc.DataType.Name(spec.data_type)
    try:
        datatype = v2.config_type_to_datatype(type_name)
        dtype = v2.datatype_to_numpy(datatype)
    except v2.CodecError:
        raise ModelConfigError(f"{what}: data_type {type_name} is not supported for warmup") from None
    choice = spec.WhichOneof("input_data_type")
    if choice == "input_data_file":
        return _from_file(spec.input_data_file, dims, datatype, dtype, model_dir, what)
    if choice not in ("zero_data", "random_data"):
        raise ModelConfigError(f"{what}: set one of zero_data, random_data or input_data_file")
    if datatype == "BYTES":
        strings = np.empty(dims, dtype=object)
        strings.fill(b"")
        return strings
    if choice == "zero_data":
        return np.zeros(dims, dtype)
    if dtype.kind == "f":
        return rng.random(dims).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, dims).astype(dtype)
    return rng.integers(0, 100, dims).astype(dtype)


def _from_file(name: str, dims: list[int], datatype: str, dtype: np.dtype, model_dir: Path, what: str) -> Tensor:
    folder = (model_dir / WARMUP_FOLDER).resolve()
    # The name comes from the config, which a client may send through the load API: resolve links
    # and '..' first, then insist on the warmup folder.
    path = (folder / name).resolve()
    if not name or not path.is_relative_to(folder) or path == folder:
        raise ModelConfigError(f"{what}: input_data_file '{name}' must name a file inside {model_dir / WARMUP_FOLDER}")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ModelConfigError(f"{what}: cannot read input_data_file {path}: {exc.strerror or exc}") from None
    count = int(np.prod(dims, dtype=np.int64))
    if datatype == "BYTES":
        try:
            return v2.deserialize_bytes_tensor(data, count).reshape(dims)
        except v2.CodecError as exc:
            raise ModelConfigError(f"{what}: input_data_file {path}: {exc}") from None
    needed = count * dtype.itemsize
    if len(data) < needed:
        raise ModelConfigError(
            f"{what}: dims {dims} {datatype} need {needed} bytes, but input_data_file {path} has only {len(data)}"
        )
    return np.frombuffer(data[:needed], dtype).reshape(dims).copy()
