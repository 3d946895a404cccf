"""`perfkit-server` / `python -m reference_server`: serve a Triton model repository."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Sequence

from reference_server.config import config_from_args
from reference_server.errors import ServerError
from reference_server.server import ReferenceServer


def main(argv: Sequence[str] | None = None) -> int:
    config = config_from_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if config.log_verbose > 1 else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        asyncio.run(ReferenceServer(config).serve_forever())
    except ServerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"error: cannot start listening: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
