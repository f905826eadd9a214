"""No request stops the service or fails others: empty requests, one bad item among good ones, nested
bodies, a bug's 500 on a kept connection, references over the limit (a model-free reward)."""

from __future__ import annotations

import http.client
import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import httpx
import pytest

from qace.serve.client import RewardClient
from tests.serve.conftest import TOKEN, FakeReward

AUTH = {"Authorization": f"Bearer {TOKEN}"}
REFS = ["a dog runs on the grass"]


def _v1(request_id: str, captions: list, refs: list | None = None) -> dict:
    items = [{"id": str(i), "caption": c, "references": refs or REFS} for i, c in enumerate(captions)]
    return {"request_id": request_id, "items": items}


class FailingReward(FakeReward):
    """Raises for any batch holding a caption with ``boom`` (as '²' image ids once made QACE-Img raise)."""

    def score(self, captions: list[Any], **kwargs: Any) -> list[Any]:
        if any(isinstance(c, str) and "boom" in c for c in captions):
            raise ValueError("invalid literal for int() with base 10: '²'")
        return super().score(captions, **kwargs)


def test_empty_requests_are_answered_at_once_and_the_service_goes_on(fake, serve) -> None:
    """An empty request used to wait until --timeout, stop the batcher for good (`/health`: stopped) and
    leave every later request a 503."""
    with serve(fake, timeout_s=3.0) as url:
        v1 = httpx.post(f"{url}/v1/reward", json={"request_id": "e", "items": []}, headers=AUTH, timeout=10)
        empty = {"query": [], "prompts": [], "labels": []}
        orlhf = httpx.post(f"{url}/t/{TOKEN}/get_reward", json=empty, timeout=10)
        with RewardClient(url, TOKEN, retries=0, timeout_s=10) as client:
            assert client.rewards([], references=[]) == []
            assert client.rewards(["a dog"], references=[REFS]) == [0.05]
        health = httpx.get(f"{url}/health")
    assert v1.status_code == 200 and v1.json()["results"] == []
    assert orlhf.status_code == 200 and orlhf.json() == {"rewards": [], "scores": []}
    assert health.status_code == 200 and health.json()["status"] == "ok"
    assert fake.batches == [1]  # the empty requests never reached the reward


def test_one_bad_item_is_invalid_and_its_batch_neighbours_are_scored(serve) -> None:
    """Ten good requests and one with a good and a bad item, batched together: the scorer raises on the
    batch; every good item still gets its reward, the bad one is invalid with the reason."""
    reward = FailingReward()
    reward.gate.clear()  # hold the first batch so that the others queue up into one
    requests = [_v1(f"g{i}", ["a" * (i + 1)]) for i in range(10)] + [_v1("bad", ["a dog", "a boom"])]
    with serve(reward, max_batch=64, max_wait_ms=50) as url:
        with ThreadPoolExecutor(len(requests)) as pool:
            futures = [
                pool.submit(httpx.post, f"{url}/v1/reward", json=r, headers=AUTH, timeout=20)
                for r in requests
            ]
            time.sleep(0.5)
            reward.gate.set()
            answers = [f.result() for f in futures]
        metrics = httpx.get(f"{url}/metrics", headers=AUTH).text
        health = httpx.get(f"{url}/health")
    assert [a.status_code for a in answers] == [200] * len(requests)
    for i, answer in enumerate(answers[:10]):
        assert answer.json()["results"][0]["reward"] == pytest.approx((i + 1) / 100)
    good, bad = answers[10].json()["results"]
    assert good["valid"] and good["reward"] == 0.05
    assert (
        not bad["valid"] and bad["reward"] == 0.0 and "ValueError" in bad["reason"] and "'²'" in bad["reason"]
    )
    assert "qace_failed_items_total 1" in metrics and health.status_code == 200


def test_a_batcher_whose_scorer_returns_too_few_results_fails_no_request() -> None:
    """A scorer bug (one result short) is isolated like an exception: items scored alone, the worker lives."""
    import asyncio

    from qace.serve.batcher import Item, MicroBatcher

    def short(items: list[Item]) -> list[str]:
        return [item.caption for item in items][: max(1, len(items) - 1)]

    async def scenario() -> tuple[list[Any], list[Any], bool]:
        batcher = MicroBatcher(short, on_error=lambda item, exc: f"error: {exc}", max_wait_s=0)
        await batcher.start()
        got = await batcher.submit([Item("a"), Item("b")])
        empty = await batcher.submit([])
        running = batcher.running
        await batcher.stop()
        return got, empty, running

    got, empty, running = asyncio.run(asyncio.wait_for(scenario(), 10))
    assert got == ["a", "b"] and empty == [] and running


def _raw(url: str) -> http.client.HTTPConnection:
    host, port = httpx.URL(url).host, httpx.URL(url).port
    return http.client.HTTPConnection(host, port, timeout=10)


def _post(conn: http.client.HTTPConnection, path: str, body: bytes) -> tuple[int, Any]:
    conn.request("POST", path, body=body, headers={**AUTH, "Content-Type": "application/json"})
    response = conn.getresponse()
    return response.status, json.loads(response.read())


def test_nested_bodies_get_400_and_the_connection_is_kept(fake, serve) -> None:
    """``[`` x 100,000 used to raise RecursionError (500) and drop the keep-alive connection; a label that
    is such a string is a broken JSON list (the item is invalid), not a crash."""
    with serve(fake) as url:
        conn = _raw(url)
        status, detail = _post(conn, "/v1/reward", b"[" * 100_000)
        sock = conn.sock
        assert status == 400 and "nested too deeply" in detail["detail"]
        label = {"query": ["Describe: a dog", "Describe: a cat"], "prompts": ["Describe: "] * 2,
                 "labels": [REFS, "[" * 100_000]}  # fmt: skip
        status, got = _post(conn, "/get_reward", json.dumps(label).encode())
        assert conn.sock is sock and sock is not None  # the same connection
        conn.close()
    assert status == 200 and got["rewards"] == [0.05, 0.0]


def test_a_bug_answers_500_and_keeps_the_connection(fake, serve, monkeypatch) -> None:
    def broken(*args: Any) -> Any:
        raise RuntimeError("a bug")

    monkeypatch.setattr("qace.serve.app._parse_v1", broken)
    with serve(fake) as url:
        conn = _raw(url)
        status, detail = _post(conn, "/v1/reward", json.dumps(_v1("r", ["a dog"])).encode())
        sock = conn.sock
        conn.request("GET", "/health")
        health = conn.getresponse()
        health.read()
        assert conn.sock is sock and sock is not None
        conn.close()
    assert status == 500 and "internal error" in detail["detail"] and health.status == 200


def test_references_over_the_limit_make_only_their_item_invalid(fake, serve) -> None:
    """A 10 MiB reference once held the scoring thread for 20 s; references are limited as captions are."""
    body = _v1("r", ["a dog", "a cat", "a cow", "a bird"])
    body["items"][1]["references"] = ["a cat " * 2_000_000]  # 12 MB
    body["items"][2]["references"] = ["a cow"] * 65
    body["items"][3]["references"] = ["a bird \ud800"]
    with serve(fake, max_body_bytes=64 << 20) as url:
        sent = json.dumps(body).encode()  # ASCII: the lone surrogate as JSON's \ud800 escape
        got = httpx.post(f"{url}/v1/reward", content=sent, headers=AUTH, timeout=30).json()["results"]
    assert [r["valid"] for r in got] == [True, False, False, False]
    assert got[1]["reason"] == "reference 0 has 12000000 characters; the limit is 2000"
    assert got[2]["reason"] == "65 references; the limit is 64 per caption"
    assert got[3]["reason"].startswith("reference 0 holds a lone surrogate (\\ud800 at character 8)")
    assert fake.batches == [1]  # only the good item reached the reward


def test_ids_that_are_not_valid_unicode_are_echoed_not_a_500(fake, serve) -> None:
    body = {
        "request_id": "r\ud800",
        "items": [{"id": "\udfff", "caption": "a dog\ud800", "references": REFS}],
    }
    with serve(fake) as url:
        got = httpx.post(f"{url}/v1/reward", content=json.dumps(body).encode(), headers=AUTH)
    assert got.status_code == 200 and got.json()["request_id"] == "r\ud800"
    (result,) = got.json()["results"]
    assert result["id"] == "\udfff" and not result["valid"] and "lone surrogate" in result["reason"]


class NonFiniteReward(FakeReward):
    """A caption with ``nan`` gets a NaN part (``qace_f1``), one with ``inf`` an infinite reward."""

    def score(self, captions: list[Any], **kwargs: Any) -> list[Any]:
        results = super().score(captions, **kwargs)
        return [
            replace(r, scores={**r.scores, "qace_f1": float("nan")}) if "nan" in c
            else replace(r, reward=float("inf")) if "inf" in c
            else r
            for c, r in zip(captions, results, strict=True)
        ]  # fmt: skip


def test_a_non_finite_score_makes_its_item_invalid_not_a_null_or_a_500(serve, caplog) -> None:
    """JSON has no NaN: such an item is rewarded as invalid with the value named, and logged."""
    with serve(NonFiniteReward()) as url, RewardClient(url, TOKEN, retries=0) as client:
        got = client.score(["a dog", "a nan dog", "an inf dog"], references=[REFS] * 3)
    assert got[0]["valid"] and got[0]["reward"] == 0.05 and got[0]["scores"]["qace_f1"] == 1.0
    assert not got[1]["valid"] and got[1]["reward"] == 0.0 and got[1]["scores"] == {}
    assert got[1]["reason"] == "the scorer returned a non-finite qace_f1 (nan); rewarded as invalid"
    assert not got[2]["valid"] and got[2]["reason"].startswith("the scorer returned a non-finite reward")
    assert "item 1 of a batch of 3: the scorer returned a non-finite qace_f1" in caplog.text
