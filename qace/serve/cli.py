"""``qace serve``: run the reward service (needs the ``serve`` extra: fastapi, uvicorn) for any registered
metric (`qace.scorers`; ``--metric``, QACE-Ref by default)."""

from __future__ import annotations

import argparse
import logging
import os
import secrets
import socket
from typing import Any

from qace import scorers
from qace.checks import check_device, check_invalid_reward
from qace.errors import ConfigError
from qace.options import add_metric_option, add_scorer_options, entry_for

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``qace serve`` (`qace.cli` calls this only where the ``serve`` extra is installed)."""
    from qace.serve.app import ServeSettings

    d = ServeSettings()
    p = sub.add_parser(
        "serve",
        description="Serve a registered scorer (QACE by default) as rewards over HTTP (own API and "
        "OpenRLHF's /get_reward).",
    )
    add_metric_option(p, "the metric to serve as a reward")
    add_scorer_options(p)
    scorers.add_options(p)
    p.add_argument(
        "--component",
        help="default reward component: one of the metric's score columns (default: its score; QACE: "
        "qace, qace_f1, qace_bs, qace_an, qace_max)",
    )
    p.add_argument("--invalid-reward", type=float, default=0.0, help="reward of empty/invalid captions")
    p.add_argument(
        "--tokenizer",
        help="the policy's tokenizer (a directory or hub id): OpenRLHF's queries are matched to their "
        "prompts as it decodes them too (a prompt it cannot spell as written matches only so)",
    )
    p.add_argument("--host", default="127.0.0.1", help="bind address (use 0.0.0.0 only behind a firewall)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--token",
        help="bearer token clients must send, at least 16 characters (default: $QACE_SERVE_TOKEN, "
        "else a random one, printed)",
    )
    p.add_argument("--max-batch", type=int, default=d.max_batch, help="items per engine call")
    p.add_argument("--max-wait-ms", type=float, default=d.max_wait_ms, help="batch gathering window")
    p.add_argument(
        "--concurrent-batches",
        type=int,
        default=d.concurrent_batches,
        help="batches scored at once: the next one's host work runs while one is on the device "
        "(default: 2 on a GPU, 1 on the CPU)",
    )
    p.add_argument("--max-queue", type=int, default=d.max_queue, help="waiting items before 429")
    p.add_argument("--max-items", type=int, default=d.max_items, help="items per request")
    p.add_argument("--max-body-bytes", type=int, default=d.max_body_bytes)
    p.add_argument(
        "--timeout", type=float, default=d.timeout_s, help="seconds before a waiting request gets 503"
    )
    p.add_argument(
        "--no-warm-up",
        dest="warm_up",
        action="store_false",
        help="serve at once instead of warming the engine up first (/health and reward requests answer "
        "503 during a warm-up; without it the first requests wait for spaCy's workers to start and, on "
        "a GPU, pay for each new batch shape's CUDA graphs)",
    )
    p.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    from qace.serve.app import ServeSettings, check_token, create_app

    entry = entry_for(args)  # arguments first: nothing below may fail after the models load
    entry.require()
    check_device(args.device)
    check_invalid_reward(args.invalid_reward)
    token = args.token or os.environ.get("QACE_SERVE_TOKEN", "")
    if token:
        check_token(token)
    else:
        token = secrets.token_hex(16)
        print(f"no --token or QACE_SERVE_TOKEN given; clients must send: Authorization: Bearer {token}")
    limits = ServeSettings(
        max_batch=args.max_batch,
        max_wait_ms=args.max_wait_ms,
        max_queue=args.max_queue,
        max_items=args.max_items,
        max_body_bytes=args.max_body_bytes,
        timeout_s=args.timeout,
        concurrent_batches=args.concurrent_batches,
    )
    sock = bind(args.host, args.port)  # held from here on: loading cannot lose the port to another process
    try:
        tokenizer = None
        if args.tokenizer:
            from qace.serve.openrlhf import load_tokenizer

            tokenizer = load_tokenizer(args.tokenizer)
        settings = {**entry.settings_from(args), "progress": False}
        reward = entry.build_reward(
            args.device, component=args.component, invalid_reward=args.invalid_reward, **settings
        )
        scorers.warn_if_test_models(reward.scorer, entry)
        app = create_app(reward, token=token, settings=limits, warm_up=args.warm_up, tokenizer=tokenizer)
        print(f"serving {reward.signature} on http://{args.host}:{sock.getsockname()[1]}")  # --port 0 too
        if args.warm_up:
            print("warming up (CUDA graphs on a GPU, spaCy workers): /health answers 503 until it is done")
        serve(app, sock)
    finally:
        sock.close()
    return 0


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` (not yet listening: connections are refused until the service
    serves); `ConfigError` naming ``--port`` / ``--host`` when the address is taken or not this host's."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: a restart reuses the port
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise ConfigError(
            f"cannot listen on {host}:{port} ({exc.strerror or exc}): pick a free --port, or stop what "
            "holds it; --host must be an address of this machine"
        ) from exc
    return sock


def serve(app: Any, sock: socket.socket) -> None:
    """Serve ``app`` with uvicorn on the bound ``sock`` until the process is told to stop."""
    import uvicorn

    uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
