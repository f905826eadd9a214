"""The reward service's HTTP API (FastAPI): its own endpoint, OpenRLHF's protocol, health, metrics.

It serves one reward: QACE's (`qace.reward.QACEReward`) or any registered scorer's
(`qace.reward.ScorerReward`, built by `qace.scorers.ScorerEntry.build_reward`). Each item carries the
context the reward reads: references (QACE-Ref), an image id (QACE-Img) or an image file path on the
server (VisCE², the regeneration score).

Endpoints (all but ``/health`` need ``Authorization: Bearer <token>``, or the token in the path where a
route offers it):

- ``POST /v1/reward``: ``{"request_id", "items": [{"id", "caption", "references" | "image_id" | "image"}],
  "component"?}`` -> ``{"request_id", "signature", "component", "results": [{"id", "reward",
  "valid", "reason", "scores"}]}``; ids are echoed so a client can check every reward's owner.
- ``POST /get_reward`` and ``POST /t/<token>/get_reward``: OpenRLHF's remote reward protocol,
  ``{"query", "prompts", "labels"}`` -> ``{"rewards", "scores"[, "extra_logs"]}`` (`qace.serve.openrlhf`:
  how the caption is cut from the query, what labels carry, when ``extra_logs`` come). OpenRLHF's clients
  send no header, so the second form carries the token in the URL they are given.
- ``GET /health``: liveness and queue depth (503 ``warming_up`` while the engine warms up, then 200);
  ``GET /metrics``: Prometheus text.

Refusals are explicit, never a hang: 401 (token), 413 (body or item count too large, naming the flag
that raises the limit), 400 (not JSON), 422 (a malformed envelope: `qace.serve.items`), 429 (queue full) and
503 (stopping, or waited past the timeout), the last two with ``Retry-After``. Reward requests that arrive
during the warm-up are held until it ends (OpenRLHF retries a 503 only five times a second apart), within
the same timeout; an empty one is answered at once. An item that cannot be scored (its caption, its id,
its context or label, its prompt, a reference over the limit, an error of the scorer on it alone) is
rewarded as invalid with the reason, and its neighbours are scored (`qace.serve.batcher`); items made
invalid by what their request gave with them are logged and counted (``qace_bad_context_total``). A bug
answers 500 and keeps the connection open; the service goes on.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import secrets
import threading
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, replace
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from qace.errors import ConfigError
from qace.reward import COMPONENTS, LOGGED_COMPONENTS, RewardResult
from qace.serve import openrlhf, wire
from qace.serve.batcher import Item, MicroBatcher, Overloaded
from qace.serve.items import RequestError, json_type, make_item

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServeSettings:
    """Limits and batching of the service; none of them changes a score."""

    max_batch: int = 64
    """Items per engine call."""
    max_wait_ms: float = 5.0
    """How long the first request of a batch waits for company."""
    max_queue: int = 16384
    """Items waiting at most; beyond it requests get 429. At least ``max_items``."""
    max_items: int = 8192
    """Items per request: OpenRLHF 0.8 sends a whole rollout batch (``rollout_batch_size x
    n_samples_per_prompt``, e.g. 1024 x 8) in one request."""
    max_body_bytes: int = 64 << 20
    """Request body size limit (413 beyond it); ``max_items`` queries with prompts and references fit."""
    max_caption_chars: int = 2000
    """Longer captions, references, image ids or image paths are rewarded as invalid (a runaway
    generation, or a context that would hold the engine)."""
    max_references: int = 64
    """References per item; an item with more is rewarded as invalid."""
    timeout_s: float = 60.0
    """A request waiting longer gets 503."""
    retry_after_s: float = 1.0
    """Value of ``Retry-After`` on 429/503."""
    concurrent_batches: int | None = None
    """Batches scored at once (`qace.serve.batcher.MicroBatcher`'s ``concurrency``): a batch's host work
    runs while the one before it is on the device. None: 2 when the reward runs on a GPU, 1 on the CPU
    (where host work and model work share the cores)."""

    def __post_init__(self) -> None:
        if self.concurrent_batches is not None and self.concurrent_batches < 1:
            raise ConfigError(f"--concurrent-batches must be at least 1, got {self.concurrent_batches}")


@dataclass(frozen=True)
class _Served:
    """What the service needs to know of its reward."""

    reads: str | None
    """The context every item carries: ``references``, ``image_id``, ``image`` or None (none)."""
    components: tuple[str, ...]
    """The columns a request may ask for (``component``)."""
    logged: tuple[str, ...]
    """The components of OpenRLHF's ``extra_logs``."""
    key: str
    """The score column: ``/v1/reward``'s default component, ``<key>_valid`` in ``extra_logs``."""
    invalid_reward: float
    """The reward of an item that cannot be scored."""

    @classmethod
    def of(cls, reward: Any) -> _Served:
        """A `qace.reward.ScorerReward`'s own; for a QACE-shaped reward that has only ``variant``
        (``ref`` or ``img``) and ``score``, QACE's."""
        variant = getattr(reward, "variant", "ref")
        return cls(
            getattr(reward, "reads", "references" if variant == "ref" else "image_id"),
            tuple(getattr(reward, "components", COMPONENTS)),
            tuple(getattr(reward, "logged", LOGGED_COMPONENTS)),
            getattr(reward, "score_key", "qace"),
            float(getattr(reward, "invalid_reward", 0.0)),
        )


CONTEXT_KEYWORDS = {"references": "references", "image_id": "image_ids", "image": "images"}
"""The reward's ``score`` keyword of each kind of context."""


MIN_TOKEN_CHARS = 16
"""Shortest bearer token the service accepts (a short one can be guessed)."""


def check_token(token: str) -> None:
    """Refuse a missing, blank or short (under `MIN_TOKEN_CHARS`) token with a `ConfigError`."""
    if len((token or "").strip()) < MIN_TOKEN_CHARS:
        raise ConfigError(
            f"the reward service needs a bearer token of at least {MIN_TOKEN_CHARS} characters "
            "(--token or QACE_SERVE_TOKEN; e.g. `openssl rand -hex 16`)"
        )


def authorized(header: str, token: str) -> bool:
    """Whether an ``Authorization`` header carries ``token`` in the ``Bearer`` scheme; the scheme's name
    matches in any case (RFC 9110, section 11.1), the token exactly, in constant time."""
    scheme, _, credentials = header.partition(" ")
    return scheme.lower() == "bearer" and secrets.compare_digest(
        credentials.strip(" ").encode(), token.encode()
    )


WARM_UP_RETRY_AFTER_S = 5
"""``Retry-After`` of requests refused while the engine warms up (that takes seconds, not one)."""


def create_app(
    reward: Any,
    *,
    token: str,
    settings: ServeSettings | None = None,
    warm_up: bool = False,
    tokenizer: Any = None,
) -> FastAPI:
    """The FastAPI app serving ``reward`` (a `qace.reward.ScorerReward`, such as `QACEReward`, or anything
    with its ``score``). ``tokenizer`` is the policy's, for OpenRLHF's queries (`qace.serve.openrlhf`).

    ``warm_up``: on start, run ``reward.warm_up()`` (`QACEReward.warm_up`) in a thread while the server
    already answers: ``/health`` says 503 ``warming_up`` and reward requests are held until it is done
    (503 with ``Retry-After`` past ``timeout_s``), so neither a readiness probe nor a client that retries
    only briefly fails. A failed warm-up is logged and reported in ``/health``; the engine then
    captures its graphs when it first needs them.
    """
    check_token(token)
    settings = settings or ServeSettings()
    if settings.max_items > settings.max_queue:
        raise ConfigError(
            f"--max-items {settings.max_items} exceeds --max-queue {settings.max_queue}: "
            "a full request could never be queued"
        )
    counts: dict[str, int] = {"prompt_mismatch": 0, "bad_context": 0}
    served = _Served.of(reward)

    matcher = openrlhf.PromptMatcher(tokenizer)
    limits = {"max_chars": settings.max_caption_chars, "max_references": settings.max_references}

    def invalid(reason: str) -> RewardResult:
        return RewardResult(served.invalid_reward, False, reason)

    def note_bad_contexts(items: list[Item], mismatched: Sequence[int] = ()) -> None:
        """Count and log the items made invalid by their own request (an id, a label or context, a prompt),
        apart from queries that do not start with their prompt (counted on their own)."""
        skip = set(mismatched)
        bad = [n for n, item in enumerate(items) if item.problem is not None and n not in skip]
        if bad:
            counts["bad_context"] += len(bad)
            log.warning(
                "%d of %d items rewarded as invalid for what the request gave with them (first: item %d: %s)",
                len(bad), len(items), bad[0], items[bad[0]].problem,
            )  # fmt: skip

    def score_items(items: list[Item]) -> list[Any]:
        """Items with a problem are invalid; the others go to the reward in one call."""
        results: list[Any] = [None if item.problem is None else invalid(item.problem) for item in items]
        todo = [i for i, result in enumerate(results) if result is None]
        if todo:
            contexts = {}
            if served.reads is not None:
                values = [getattr(items[i], served.reads) for i in todo]
                contexts[CONTEXT_KEYWORDS[served.reads]] = values
            captions = [items[i].caption for i in todo]
            scored = reward.score(captions, max_chars=settings.max_caption_chars, **contexts)
            for i, result in zip(todo, scored, strict=True):
                if not _finite(result):  # JSON has no NaN: sent, it would be a null reward
                    result = invalid(_non_finite(result))
                    log.warning("item %d of a batch of %d: %s", i, len(items), result.reason)
                results[i] = result
        return results

    on_gpu = str(getattr(reward, "device", "")).startswith("cuda")
    batcher = MicroBatcher(
        score_items,
        on_error=lambda item, exc: invalid(f"could not be scored: {type(exc).__name__}: {exc}"),
        max_batch=settings.max_batch,
        max_wait_s=settings.max_wait_ms / 1000,
        max_queue=settings.max_queue,
        timeout_s=settings.timeout_s,
        retry_after_s=settings.retry_after_s,
        concurrency=settings.concurrent_batches or (2 if on_gpu else 1),
    )

    ready = asyncio.Event()  # set on the event loop once the engine is warm (or without a warm-up)
    warm_up_error: list[str] = []

    def warm() -> None:
        start = time.perf_counter()
        try:
            shapes = reward.warm_up()
            log.info("warmed up (%s batch shapes) in %.1f s", shapes, time.perf_counter() - start)
        except Exception as exc:  # noqa: BLE001 - reported by /health; scoring still works without it
            warm_up_error.append(f"{type(exc).__name__}: {exc}")
            log.exception("warm-up failed; graphs will be captured when first needed")

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await batcher.start()
        warming: threading.Thread | None = None
        if warm_up:
            loop = asyncio.get_running_loop()

            def warm_then_release() -> None:  # the loop runs until then: the stop waits for this thread
                warm()
                loop.call_soon_threadsafe(ready.set)

            warming = threading.Thread(target=warm_then_release, name="qace-warm-up", daemon=True)
            warming.start()
        else:
            ready.set()
        log.info("reward service ready: %s", reward.signature)
        yield
        if warming is not None:  # a server stopped while warming up stops once the warm-up has ended
            await asyncio.to_thread(warming.join)
        await batcher.stop()

    app = FastAPI(title="QACE reward service", lifespan=lifespan, default_response_class=_JSON)
    app.state.batcher = batcher

    @app.middleware("http")
    async def guard(request: Request, call_next: Any) -> Any:
        """Auth and size limits before any body is read; counts every response by status."""
        try:
            if request.url.path != "/health" and not _path_token_ok(request.url.path, token):
                if not authorized(request.headers.get("authorization", ""), token):
                    raise RequestError(401, "missing or wrong bearer token", {"WWW-Authenticate": "Bearer"})
            length = request.headers.get("content-length")
            if length is not None and (not length.isdigit() or int(length) > settings.max_body_bytes):
                raise RequestError(413, _too_big(settings.max_body_bytes))
            response = await call_next(request)
        except RequestError as exc:
            response = _error(exc)
        except Exception:  # noqa: BLE001 - answered here, so the server keeps the connection open
            log.exception("%s %s failed", request.method, request.url.path)
            response = _error(RequestError(500, "internal error of the reward service (logged)"))
        counts[str(response.status_code)] = counts.get(str(response.status_code), 0) + 1
        return response

    async def body(request: Request) -> Any:
        """The JSON body, read with the size limit enforced on chunked uploads too."""
        data = bytearray()
        async for part in request.stream():
            data += part
            if len(data) > settings.max_body_bytes:
                raise RequestError(413, _too_big(settings.max_body_bytes))
        try:
            return json.loads(data)  # not wire.loads: a client may send integers over 64 bits
        except ValueError as exc:
            raise RequestError(400, f"body is not JSON: {exc}") from exc
        except RecursionError:
            raise RequestError(400, "body is not JSON this service reads: nested too deeply") from None

    async def run(items: list[Item]) -> list[Any]:
        if len(items) > settings.max_items:
            raise RequestError(
                413, f"{len(items)} items in one request; the limit is {settings.max_items} (--max-items)"
            )
        if not items:
            return []
        if not ready.is_set():
            try:  # hold it: OpenRLHF's clients give up after five 503s a second apart
                await asyncio.wait_for(ready.wait(), settings.timeout_s)
            except TimeoutError:
                retry = {"Retry-After": str(WARM_UP_RETRY_AFTER_S)}
                raise RequestError(
                    503, "the reward engine is still warming up (spaCy workers; CUDA graphs on a GPU)", retry
                ) from None
        try:
            return await batcher.submit(items)
        except Overloaded as exc:
            status = 429 if type(exc) is Overloaded else 503
            raise RequestError(
                status, str(exc), {"Retry-After": str(max(1, round(exc.retry_after)))}
            ) from exc

    @app.post("/v1/reward")
    async def v1_reward(request: Request) -> Any:
        try:
            payload = await body(request)
            request_id, ids, items, component = _parse_v1(payload, served, limits)
            note_bad_contexts(items)
            results = await run(items)
        except RequestError as exc:
            return _error(exc)
        return _JSON({
            "request_id": request_id,
            "signature": reward.signature,
            "component": component,
            "results": [
                {
                    "id": i,
                    "reward": r.scores.get(component, r.reward) if r.valid else r.reward,
                    "valid": r.valid,
                    "reason": r.reason,
                    "scores": r.scores,
                }
                for i, r in zip(ids, results, strict=True)
            ],
        })  # fmt: skip

    @app.post("/get_reward")
    @app.post(PATH_TOKEN_PREFIX + "{path_token}/get_reward")
    async def get_reward(request: Request) -> Any:
        try:
            payload = await body(request)
            items, mismatched = openrlhf.parse(payload, served.reads, matcher, **limits)
            if mismatched:
                counts["prompt_mismatch"] += len(mismatched)
                log.warning(
                    "%d of %d queries do not start with their prompt (first: sample %d); rewarded as invalid "
                    "(pass the policy's tokenizer: qace serve --tokenizer)",
                    len(mismatched), len(items), mismatched[0],
                )  # fmt: skip
            note_bad_contexts(items, mismatched)
            results = await run(items)
        except RequestError as exc:
            return _error(exc)
        wants_logs = request.query_params.get("extra_logs") == "1"
        return _JSON(openrlhf.reply(payload, results, served.logged, served.key, wants_logs))

    @app.get("/health")
    async def health() -> Any:
        state = "stopped" if not batcher.running else "ok" if ready.is_set() else "warming_up"
        payload = {"status": state, "signature": reward.signature, "queued_items": batcher.stats.queued_items}
        if warm_up_error:
            payload["warm_up_error"] = warm_up_error[0]
        return _JSON(payload, status_code=200 if state == "ok" else 503)

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        s = batcher.stats
        codes = sorted((code, n) for code, n in counts.items() if code.isdigit())
        lines = [f'qace_http_responses_total{{code="{code}"}} {n}' for code, n in codes]
        lines += [
            f"qace_prompt_mismatch_total {counts['prompt_mismatch']}",
            f"qace_bad_context_total {counts['bad_context']}",
            f"qace_queue_items {s.queued_items}",
            f"qace_queue_limit_items {settings.max_queue}",
            f"qace_batches_total {s.batches}",
            f"qace_batched_items_total {s.batched_items}",
            f"qace_rejected_total {s.rejected}",
            f"qace_timed_out_total {s.timed_out}",
            f"qace_failed_batches_total {s.failed}",
            f"qace_failed_items_total {s.failed_items}",
            f"qace_score_seconds_total {s.score_seconds:.6f}",
            f"qace_uptime_seconds {time.monotonic() - started:.3f}",
        ]
        return PlainTextResponse("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")

    started = time.monotonic()
    return app


PATH_TOKEN_PREFIX = "/t/"
"""Routes under ``/t/<token>/`` take the token from the path, for clients that send no header (OpenRLHF)."""


def _path_token_ok(path: str, token: str) -> bool:
    """Whether ``path`` is ``/t/<token>/...`` with the right token (compared in constant time)."""
    if not path.startswith(PATH_TOKEN_PREFIX):
        return False
    given = path[len(PATH_TOKEN_PREFIX) :].split("/", 1)[0]
    return secrets.compare_digest(given.encode(), token.encode())


def _too_big(limit: int) -> str:
    return f"request body over {limit} bytes (--max-body-bytes)"


class _JSON(JSONResponse):
    """Compact UTF-8 JSON (`qace.serve.wire.dumps`); text that is not valid Unicode (a lone surrogate,
    echoed in an id or a reason) is still sent, as JSON's ``\\ud800``."""

    def render(self, content: Any) -> bytes:
        return wire.dumps(content)


def _finite(result: RewardResult) -> bool:
    """Whether none of ``result``'s reward and scores is a non-finite float (JSON has no NaN or
    infinity)."""
    return not any(map(_non_finite_float, (result.reward, *result.scores.values())))


def _non_finite_float(value: Any) -> bool:
    return isinstance(value, float) and not math.isfinite(value)


def _non_finite(result: RewardResult) -> str:
    """Why ``result`` is not sent: its first non-finite value, named."""
    named = {"reward": result.reward, **result.scores}
    name, value = next((k, v) for k, v in named.items() if _non_finite_float(v))
    return f"the scorer returned a non-finite {name} ({value}); rewarded as invalid"


def _error(exc: RequestError) -> JSONResponse:
    return _JSON({"detail": exc.detail}, status_code=exc.status, headers=exc.headers)


def _parse_v1(
    payload: Any, served: _Served, limits: dict[str, int]
) -> tuple[str, list[str | None], list[Item], str]:
    """The request id, the items' ids (echoed; None where an item has no string id), the items and the
    component of a ``/v1/reward`` request. Only the envelope raises `RequestError` (422); an item without
    a string id, with an id an earlier item has, or that is not an object is invalid on its own."""
    if not isinstance(payload, dict) or not isinstance(payload.get("items"), list):
        raise RequestError(422, 'expected {"request_id": str, "items": [{"id", "caption", ...}]}')
    request_id = payload.get("request_id")
    if not isinstance(request_id, str) or not request_id:
        raise RequestError(422, "request_id must be a non-empty string (it is echoed back)")
    component = payload.get("component", served.key)
    if component not in served.components:
        choices = ", ".join(served.components)
        raise RequestError(422, f"unknown component {component!r}; choose one of {choices}")
    ids: list[str | None] = []
    items: list[Item] = []
    first: dict[str, int] = {}
    for n, entry in enumerate(payload["items"]):
        if not isinstance(entry, dict):
            ids.append(None)
            items.append(
                Item(
                    None,
                    problem=f'item {n} must be an object {{"id", "caption", ...}}, got {json_type(entry)}',
                )
            )
            continue
        item_id = entry.get("id")
        item = make_item(entry.get("caption"), entry, served.reads, **limits)
        if not isinstance(item_id, str):
            item_id, item = (
                None,
                replace(item, problem=f"item {n} needs a string id, got {json_type(item_id)}"),
            )
        elif item_id in first:
            item = replace(item, problem=f"duplicate id {item_id!r} (first: item {first[item_id]})")
        else:
            first[item_id] = n
        ids.append(item_id)
        items.append(item)
    return request_id, ids, items, component
