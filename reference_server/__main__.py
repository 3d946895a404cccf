"""`perfkit-server` / `python -m reference_server`: serve a Triton model repository.

On uvloop where it is installed, as perfkit's own commands: against asyncio's loop it served 10-11%
more of the demo identity at concurrency 8 over HTTP and gRPC, and 1-3% more of the MLP
(perf_analyzer, 3 alternating rounds, medians; bench/README.md).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from reference_server.config import config_from_args
from reference_server.errors import ServerError
from reference_server.server import ReferenceServer
from v2kit.runtime.eventloop import run


def main(argv: Sequence[str] | None = None) -> int:
    config = config_from_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if config.log_verbose > 1 else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        run(ReferenceServer(config).serve_forever())
    except ServerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: cannot start listening: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
