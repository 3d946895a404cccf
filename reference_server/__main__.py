"""`perfkit-server` / `python -m reference_server`: serve a Triton model repository.

On uvloop where it is installed, as perfkit's own commands: against asyncio's loop it served 10-11%
more of the demo identity at concurrency 8 over HTTP and gRPC, and 1-3% more of the MLP
(perf_analyzer, 3 alternating rounds, medians; bench/README.md).

`--flags-markdown` prints docs/server.md's table of tritonserver flags (`triton_flags.markdown_table`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from reference_server import triton_flags
from reference_server.config import config_from_args
from reference_server.core import log_settings
from reference_server.errors import ServerError
from reference_server.server import ReferenceServer
from reference_server.startup import ModelsFailed
from v2kit.runtime.eventloop import run


def main(argv: Sequence[str] | None = None) -> int:
    if list(sys.argv[1:] if argv is None else argv) == ["--flags-markdown"]:
        print(triton_flags.markdown_table(), end="")
        return 0
    config = config_from_args(argv)
    try:
        server = ReferenceServer(config)
        try:
            log_settings.install(server.log_settings)  # Triton's log lines, where --log-file says
        except OSError as exc:
            print(f"error: cannot open --log-file: {exc}", file=sys.stderr)
            return 1
        run(server.serve_forever())
    except ModelsFailed as exc:
        print(f"error: creating server: {exc}", file=sys.stderr)
        return 1
    except ServerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: cannot start listening: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
