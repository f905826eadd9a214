"""``qace health URL [--wait]``: whether a reward service is ready, or wait until it is, for scripts that
start a trainer after ``qace serve`` (needs httpx, of the ``serve`` extra)."""

from __future__ import annotations

import argparse
import json
import logging


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``qace health`` (`qace.cli` calls this only where httpx is installed)."""
    p = sub.add_parser(
        "health",
        description="Ask a reward service's /health; exit 0 when it is ready (200 ok), else with an error.",
    )
    p.add_argument("url", help="the service's URL (any of its URLs: only scheme, host and port count)")
    p.add_argument(
        "--wait",
        action="store_true",
        help="wait until it is ready: a closed port (models loading) and 503 (warming up) are waited out",
    )
    p.add_argument("--timeout", type=float, default=600.0, help="seconds --wait waits at most (default 600)")
    p.set_defaults(func=cmd_health)


def cmd_health(args: argparse.Namespace) -> int:
    from qace.serve.client import wait_ready

    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per poll
    payload = wait_ready(args.url, timeout_s=args.timeout if args.wait else 0.0)
    print(json.dumps(payload))
    return 0
