"""The Ray runtime behind `--workers`, for `perfkit sweep`'s load workers and `perfkit tune`'s
endpoint actors alike (`ray_runtime`). Ray is an optional extra; without it, one message says how
to get it."""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator
from types import ModuleType

import psutil

from perfkit.errors import PerfkitError, TargetError, describe_exception

__all__ = ["RAY_MISSING", "import_ray", "ray_installed", "ray_runtime"]

RAY_MISSING = "--workers needs Ray: pip install 'perfkit[distributed]'"
OBJECT_STORE_BYTES = 80 * 1024 * 1024  # samples and records pass through it in small pieces
SHUTDOWN_WAIT_S = 30.0


def ray_installed() -> bool:
    """Whether Ray can be imported, without importing it (that takes seconds)."""
    return importlib.util.find_spec("ray") is not None


def import_ray() -> ModuleType:
    try:
        import ray
    except ImportError:
        raise PerfkitError(RAY_MISSING) from None
    return ray


@contextlib.contextmanager
def ray_runtime(address: str | None, workers: int) -> Iterator[ModuleType]:
    """Ray connected: to the runtime this process already has (left as it is), to `address`
    (disconnected at the end, the cluster left running), or to a local runtime started here with
    a CPU for each of `workers` and stopped at the end."""
    ray = import_ray()
    if ray.is_initialized():
        yield ray
        return
    before = {child.pid for child in psutil.Process().children()}
    if address is not None:
        try:
            ray.init(address=address, log_to_driver=False, configure_logging=False)
        except Exception as exc:
            raise TargetError(
                f"--ray-address {address}: cannot join the Ray cluster ({describe_exception(exc)}); check the "
                "address (the head's GCS, HOST:6379) and, for a cluster with token authentication, "
                "RAY_AUTH_MODE=token and its token"
            ) from None
    else:
        try:
            ray.init(
                address="local", include_dashboard=False, log_to_driver=False, configure_logging=False,
                num_cpus=max(workers, 2), object_store_memory=OBJECT_STORE_BYTES,
            )  # fmt: skip
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise PerfkitError(f"cannot start the Ray cluster ({exc})") from None
    started = [child for child in psutil.Process().children() if child.pid not in before]
    try:
        yield ray
    finally:
        ray.shutdown()
        # A local runtime's processes can outlive the shutdown's short wait on a busy machine;
        # reaped here, they leave no zombie behind for the rest of this process's life.
        psutil.wait_procs(started, timeout=SHUTDOWN_WAIT_S)
