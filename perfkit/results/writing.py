"""Writing an output file: atomically, and readable by whoever the user's umask lets read it.

Every file perfkit writes (sweep results, CSVs, reports, tune outputs, JUnit) goes through
`write_text_atomic`: the text lands in a temporary file in the same folder, which then replaces the
target, so an interrupted run never leaves a half-written file. `tempfile.mkstemp` creates that
temporary file 0600 whatever the umask; left so, a CSV or report written for a CI artifact store or
a teammate could only be read by its owner. So a new file gets the mode `open()` would give it,
0666 less the umask, and a file being rewritten keeps the mode it has.
"""

from __future__ import annotations

import functools
import os
import stat
import tempfile
from pathlib import Path

__all__ = ["new_file_mode", "write_text_atomic"]


def _read_umask() -> int:
    """The process's umask. Linux shows it in /proc/self/status; elsewhere the only way is to set a
    umask and put the old one back, which is why this is done once (a thread creating a file in
    between would get the temporary umask)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


@functools.cache
def new_file_mode() -> int:
    """The permission bits `open(path, "w")` gives a new file: 0666 less the umask (read once)."""
    return 0o666 & ~_read_umask()


def write_text_atomic(path: Path | str, text: str) -> None:
    """Write `text` to `path` through a temporary file in the same folder, so that an interrupted
    run never leaves a half-written file; the file gets `new_file_mode()`, or keeps its own mode
    when it already exists."""
    path = Path(path)
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError:
        mode = new_file_mode()
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
            try:
                os.fchmod(handle.fileno(), mode)
            except OSError:  # a file system without Unix modes (a FAT stick, some network mounts)
                pass
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
