"""Client of the reward service: retries on back-pressure, and never attaches a reward to the wrong sample;
`wait_ready` waits until a service answers (``qace health URL --wait``).

Every call sends a fresh ``request_id`` and per-item ids; the response must echo both, in order,
with one result per item, or `RewardServiceError` is raised instead of returning numbers. Retries
(on 429/502/503/504 and connection errors) resend the same request, honouring ``Retry-After``,
with exponential backoff otherwise.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence
from typing import Any

import httpx

from qace.errors import QACEError
from qace.serve import wire

log = logging.getLogger(__name__)

RETRY_STATUS = frozenset({429, 502, 503, 504})
JSON_HEADERS = {"Content-Type": "application/json"}


class RewardServiceError(QACEError):
    """The reward service refused a request, kept failing, or answered for different samples."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class RewardClient:
    """Talk to ``qace serve`` at ``url`` (e.g. ``http://10.0.0.5:8000``) with a bearer ``token``."""

    def __init__(
        self,
        url: str,
        token: str,
        *,
        timeout_s: float = 120.0,
        retries: int = 5,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.retries, self.backoff_s, self.max_backoff_s = retries, backoff_s, max_backoff_s
        self._http = httpx.Client(
            base_url=url.rstrip("/"),
            timeout=timeout_s,
            transport=transport,
            headers={"Authorization": f"Bearer {token}"},
        )

    def score(
        self,
        captions: Sequence[Any],
        *,
        references: Sequence[Sequence[str]] | None = None,
        image_ids: Sequence[str] | None = None,
        component: str = "qace",
    ) -> list[dict[str, Any]]:
        """One result per caption (``reward``, ``valid``, ``reason``, ``scores``), in order."""
        items = []
        for i, caption in enumerate(captions):
            item: dict[str, Any] = {"id": str(i), "caption": caption}
            if references is not None:
                item["references"] = list(references[i])
            if image_ids is not None:
                item["image_id"] = image_ids[i]
            items.append(item)
        request_id = uuid.uuid4().hex
        payload = {"request_id": request_id, "items": items, "component": component}
        answer = self._post("/v1/reward", payload)
        return _checked(answer, request_id, [item["id"] for item in items])

    def rewards(
        self,
        captions: Sequence[Any],
        *,
        references: Sequence[Sequence[str]] | None = None,
        image_ids: Sequence[str] | None = None,
        component: str = "qace",
    ) -> list[float]:
        """Just the rewards, one float per caption, in order."""
        results = self.score(captions, references=references, image_ids=image_ids, component=component)
        return [float(r["reward"]) for r in results]

    def _post(self, path: str, payload: dict[str, Any]) -> Any:
        body = wire.dumps(payload)
        for attempt in range(self.retries + 1):
            wait = min(self.max_backoff_s, self.backoff_s * 2**attempt)
            try:
                response = self._http.post(path, content=body, headers=JSON_HEADERS)
            except httpx.TransportError as exc:
                if attempt == self.retries:
                    raise RewardServiceError(
                        f"reward service unreachable after {attempt + 1} tries: {exc}"
                    ) from exc
                log.warning("reward service unreachable (%s); retrying in %.1fs", exc, wait)
            else:
                if response.status_code == 200:
                    try:
                        return wire.loads(response.content)
                    except ValueError as exc:
                        raise RewardServiceError("reward service answered with invalid JSON", 200) from exc
                detail = _detail(response)
                if response.status_code not in RETRY_STATUS or attempt == self.retries:
                    raise RewardServiceError(
                        f"reward service answered {response.status_code}: {detail}", response.status_code
                    )
                wait = _retry_after(response, wait, self.max_backoff_s)
                log.info(
                    "reward service busy (%s: %s); retrying in %.1fs", response.status_code, detail, wait
                )
            time.sleep(wait)
        raise RewardServiceError("unreachable")  # the loop always returns or raises

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RewardClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def wait_ready(url: str, *, timeout_s: float, interval_s: float = 0.5) -> dict[str, Any]:
    """Poll the ``/health`` of the service at ``url`` (its base URL or any of its URLs: only the scheme,
    host and port count) until it answers 200 ``ok``; its payload. A closed port (the service still
    loading its models) and 503 (warming up) are waited out; `RewardServiceError` with the last state
    after ``timeout_s``."""
    origin = httpx.URL(url)
    health = str(origin.copy_with(path="/health", query=None, fragment=None))
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            response = httpx.get(health, timeout=max(1.0, interval_s))
            state = f"{response.status_code}: {_detail_or_status(response)}"
            if response.status_code == 200:
                return wire.loads(response.content)
        except httpx.TransportError as exc:
            state = f"unreachable ({type(exc).__name__}: {exc})"
        if time.monotonic() + interval_s > deadline:
            raise RewardServiceError(f"{health} not ready within {timeout_s:g} s; last: {state}")
        time.sleep(interval_s)


def _detail_or_status(response: httpx.Response) -> str:
    try:
        return str(wire.loads(response.content).get("status", response.text[:200]))
    except (ValueError, AttributeError):
        return response.text[:200]


def _checked(answer: Any, request_id: str, ids: list[str]) -> list[dict[str, Any]]:
    """The results, after proving they belong to this request's samples in this order."""
    if not isinstance(answer, dict) or answer.get("request_id") != request_id:
        got = answer.get("request_id") if isinstance(answer, dict) else None
        raise RewardServiceError(f"response is for request {got!r}, not {request_id!r}; rewards discarded")
    results = answer.get("results")
    if (
        not isinstance(results, list)
        or [r.get("id") if isinstance(r, dict) else None for r in results] != ids
    ):
        raise RewardServiceError(
            f"response results do not match the {len(ids)} items sent; rewards discarded"
        )
    return results


def _detail(response: httpx.Response) -> str:
    try:
        return str(wire.loads(response.content).get("detail", response.text))
    except (ValueError, AttributeError):
        return response.text[:200]


def _retry_after(response: httpx.Response, default: float, cap: float) -> float:
    value = response.headers.get("retry-after", "")
    try:
        return min(cap, max(0.0, float(value)))
    except ValueError:
        return default
