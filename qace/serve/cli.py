"""``qace serve``: run the reward service (needs the ``serve`` extra: fastapi, uvicorn)."""

from __future__ import annotations

import argparse
import logging
import os
import secrets

from qace.checks import check_device, check_img_features

log = logging.getLogger(__name__)


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``qace serve`` (`qace.cli` calls this only where the ``serve`` extra is installed)."""
    from qace.reward import COMPONENTS
    from qace.serve.app import ServeSettings

    d = ServeSettings()
    p = sub.add_parser(
        "serve", description="Serve QACE rewards over HTTP (own API and OpenRLHF's /get_reward)."
    )
    p.add_argument("--models", help="directory with qg/, tqa/, vqa/ (default: the paper's models)")
    p.add_argument("--variant", default="ref", choices=["ref", "img"])
    p.add_argument("--features", help="region features (QACE-Img)")
    p.add_argument("--device", default="cpu", help="torch device, e.g. cuda or cuda:1")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "fp16"])
    p.add_argument("--batch-rows", type=int, help="sequences per model batch (default: by the device)")
    p.add_argument("--batch-tokens", type=int, help="padded tokens per model batch (default: by the device)")
    p.add_argument("--spacy-workers", type=int, help="spaCy processes (default: by the device)")
    p.add_argument("--component", default="qace", choices=COMPONENTS, help="default reward component")
    p.add_argument("--invalid-reward", type=float, default=0.0, help="reward of empty/invalid captions")
    p.add_argument("--host", default="127.0.0.1", help="bind address (use 0.0.0.0 only behind a firewall)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument(
        "--token",
        help="bearer token clients must send, at least 16 characters (default: $QACE_SERVE_TOKEN, "
        "else a random one, printed)",
    )
    p.add_argument("--max-batch", type=int, default=d.max_batch, help="items per engine call")
    p.add_argument("--max-wait-ms", type=float, default=d.max_wait_ms, help="batch gathering window")
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
    import uvicorn

    from qace.config import given_speed_settings
    from qace.reward import QACEReward
    from qace.serve.app import ServeSettings, check_token, create_app

    check_device(args.device)  # arguments first: nothing below may fail after the models load
    check_img_features(args.variant, args.features)
    token = args.token or os.environ.get("QACE_SERVE_TOKEN", "")
    if token:
        check_token(token)
    else:
        token = secrets.token_hex(16)
        print(f"no --token or QACE_SERVE_TOKEN given; clients must send: Authorization: Bearer {token}")
    reward = QACEReward(
        models=args.models,
        variant=args.variant,
        features=args.features,
        device=args.device,
        precision=args.precision,
        component=args.component,
        invalid_reward=args.invalid_reward,
        **given_speed_settings(args, ("max_batch_rows", "max_batch_tokens", "spacy_workers")),
    )
    if reward.scorer.uses_test_models:
        log.warning("serving qace's TINY TEST MODELS: rewards mean nothing")
    settings = ServeSettings(
        max_batch=args.max_batch,
        max_wait_ms=args.max_wait_ms,
        max_queue=args.max_queue,
        max_items=args.max_items,
        max_body_bytes=args.max_body_bytes,
        timeout_s=args.timeout,
    )
    print(f"serving {reward.signature} on http://{args.host}:{args.port}")
    if args.warm_up:
        print("warming up (CUDA graphs on a GPU, spaCy workers): /health answers 503 until it is done")
    uvicorn.run(
        create_app(reward, token=token, settings=settings, warm_up=args.warm_up),
        host=args.host,
        port=args.port,
        log_level="warning",
    )
    return 0
