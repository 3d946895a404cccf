"""What produced a result, recorded in it: perfkit's version and git commit, when, the command line,
the seed, the server, the machine, and the settings. Credentials never get in: the value of a header
whose name says it holds one (Authorization, a token, a cookie...) reads `***`, in argv and settings alike.
"""

from __future__ import annotations

import datetime as dt
import getpass
import os
import platform
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from perfkit._version import __version__

__all__ = ["provenance", "redact_argv"]

_SECRET_HEADER_WORDS = ("authorization", "cookie", "token", "secret", "password", "api-key", "apikey")


def _git_commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=False,
            cwd=Path(__file__).resolve().parent,
        )  # fmt: skip
    except OSError:
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def _secret_header(name: str) -> bool:
    return any(word in name.strip().lower() for word in _SECRET_HEADER_WORDS)


def _redact_header(value: str) -> str:
    """`Name: value` with the value hidden when the name says it holds a credential."""
    name, sep, _ = value.partition(":")
    return f"{name}: ***" if sep and _secret_header(name) else value


def redact_argv(argv: list[str]) -> list[str]:
    """The command line with the values of secret -H/--header flags hidden."""
    out: list[str] = []
    for i, arg in enumerate(argv):
        if i and argv[i - 1] in ("-H", "--header"):
            out.append(_redact_header(arg))
        elif arg.startswith("--header="):
            out.append("--header=" + _redact_header(arg[len("--header=") :]))
        elif arg.startswith("-H") and len(arg) > 2:
            out.append("-H" + _redact_header(arg[2:]))
        else:
            out.append(arg)
    return out


def _settings_dict(value: Any, key: str = "") -> Any:
    """A settings dataclass as JSON values; every `headers` list of (name, value) pairs redacted."""
    if isinstance(value, dict):
        return {k: _settings_dict(v, k) for k, v in value.items()}
    if key == "headers":
        return [[k, "***" if _secret_header(k) else v] for k, v in value]
    if isinstance(value, (list, tuple)):
        return [_settings_dict(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def provenance(settings: Any, *, seed: int, server: dict[str, Any], argv: list[str]) -> dict[str, Any]:
    """The provenance block of a result: `settings` is the run's frozen spec (a dataclass), `server`
    what is known of the server measured (its URL, whether embedded, its metadata)."""
    return {
        "perfkit_version": __version__,
        "git_commit": _git_commit(),
        "started_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "argv": redact_argv(argv),
        "seed": seed,
        "server": server,
        "machine": {
            "hostname": platform.node(),
            "platform": platform.platform(),
            "python": sys.version.split()[0],
            "cpu_count": os.cpu_count() or 0,
            "user": getpass.getuser(),
        },
        "spec": _settings_dict(asdict(settings)),
    }
