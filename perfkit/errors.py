"""perfkit's errors and exit codes. `run()` raises; `main()` maps to an exit code."""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    OK = 0
    FAILED = 1  # the run completed but what it checked failed (errors, regression)
    USAGE = 2  # bad flags or input files; nothing was measured
    UNSTABLE = 3  # the sweep finished, but some level is not valid (unstable, too few samples, ...)
    ERRORS = 4  # the sweep finished, but some requests failed
    INTERRUPTED = 130  # Ctrl-C: results so far are on disk


class PerfkitError(Exception):
    """An error the user can act on; printed as one line, no traceback."""

    exit_code = ExitCode.USAGE


class TargetError(PerfkitError):
    """The server cannot be reached or does not speak the protocol as expected."""

    exit_code = ExitCode.FAILED


#: Extensions of the protocol by the names a server's metadata lists them under.
MODEL_CONFIGURATION = "model_configuration"
MODEL_REPOSITORY = "model_repository"


class MissingExtension(TargetError):
    """The server has no route for a call of an optional extension of the protocol (HTTP 404, gRPC
    UNIMPLEMENTED): Triton's model configuration is one, which MLServer and KServe do not serve.
    `extension` is its name as a server's metadata lists it ("model_configuration"); the message
    is the call and the server's answer, for the caller to say what follows from its absence."""

    def __init__(self, message: str, extension: str) -> None:
        super().__init__(message)
        self.extension = extension

    def __reduce__(self) -> tuple[type[MissingExtension], tuple[str, str]]:  # crosses to Ray workers intact
        return type(self), (str(self), self.extension)


def describe_exception(exc: BaseException) -> str:
    """An exception in one line, for an error message: its type and the first line of its text."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
