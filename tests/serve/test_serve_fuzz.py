"""A seeded fuzz of the reward service (QACE on the tiny test models, one service): 1,000 requests, malformed
and edge-case ones mixed with good ones, sent 8 at a time. No answer is a 500, every good item gets the
reward it gets alone, and ``/health`` is 200 at the end. Also: a lone surrogate among ten good requests."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from qace.reward import QACEReward
from qace.serve.app import ServeSettings, create_app
from qace.serve.local import serving

TOKEN = "fuzz-test-token-0123456789"
AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
SEED, REQUESTS, THREADS = 36, 1000, 8
PROMPT = "Describe the image: "
GOOD = {  # caption -> references
    "a girl runs on the beach": ["a girl in a red dress runs on the beach", "a child plays near the sea"],
    "a dog in the snow": ["a brown dog plays in the snow"],
    "two men play football in the park": ["men playing soccer on the grass", "a football game in a park"],
    "a red bike": ["a red bicycle leans on a wall"],
}
BAD_CAPTIONS = [
    None,
    7,
    1.5,
    [],
    {},
    True,
    "",
    "   ",
    "\u200b\u2060",
    "\x00\x07",
    "a dog \ud800 runs",
    "x" * 2001,
    "\t\n",
    "\ufeff",
]
ODD_CAPTIONS = ["😀 a dog", "مرحبا a cat", "a\u0301 b\u0308", "<unk>", "</s>", "NaN", "a " * 900, "\\u0000"]
SETTINGS = ServeSettings(max_items=64, max_queue=4096, max_body_bytes=1 << 18, max_batch=64)


@dataclass
class Case:
    """One request: what is sent, and where its good items' rewards are in the answer."""

    path: str
    content: bytes
    headers: dict[str, str] = field(default_factory=lambda: dict(AUTH))
    goods: list[tuple[int, str]] = field(default_factory=list)
    """(position in the answer's results or rewards, the good caption there)."""


@pytest.fixture(scope="module")
def url(test_models_dir: Path) -> Iterator[str]:
    with serving(create_app(QACEReward(models=test_models_dir), token=TOKEN, settings=SETTINGS)) as base:
        yield base


def _dumps(value: Any) -> bytes:
    return json.dumps(value).encode()  # ASCII: lone surrogates travel as \ud800 escapes


def _item(rng: random.Random, n: int) -> tuple[dict[str, Any], str | None]:
    """An item of a /v1/reward request: a good one (its caption returned) or a bad or odd one (None)."""
    caption = rng.choice(list(GOOD))
    refs: Any = GOOD[caption]
    roll = rng.random()
    if roll < 0.5:
        return {"id": f"i{n}", "caption": caption, "references": refs}, caption
    if roll < 0.7:
        caption = rng.choice(BAD_CAPTIONS + ODD_CAPTIONS)
    elif roll < 0.85:
        refs = rng.choice([["r" * 2001], ["a ref"] * 65, ["a \ud800 ref"], ["[" * 5000], ["ok", "\x00"]])
    else:  # a malformed context, id or item: that item is invalid
        return rng.choice(
            [
                {"id": f"i{n}", "caption": caption},
                {"id": n, "caption": caption, "references": refs},
                {"id": f"i{n}", "caption": caption, "references": []},
                {"id": f"i{n}", "caption": caption, "references": "a ref"},
                "not an item",
            ]
        ), None
    return {"id": f"i{n}", "caption": caption, "references": refs}, None


def _v1(rng: random.Random, k: int) -> Case:
    items, goods = [], []
    for n in range(rng.randint(0, 6)):
        item, good = _item(rng, n)
        items.append(item)
        if good is not None:
            goods.append((n, good))
    body: dict[str, Any] = {"request_id": f"r{k}", "items": items}
    if rng.random() < 0.1:
        body["component"] = rng.choice(["qace_f1", "bleu", None, 3])
        goods = [] if body["component"] != "qace" else goods  # another component: another reward
    return Case("/v1/reward", _dumps(body), goods=goods)


def _openrlhf(rng: random.Random, k: int) -> Case:
    queries, prompts, labels, goods = [], [], [], []
    for n in range(rng.randint(0, 5)):
        caption = rng.choice(list(GOOD))
        label: Any = rng.choice([GOOD[caption], json.dumps(GOOD[caption]), {"references": GOOD[caption]}])
        query, prompt = PROMPT + caption + rng.choice(["", "</s>", " </s><pad><pad>"]), PROMPT
        roll = rng.random()
        if roll < 0.55:
            goods.append((n, caption))
        elif roll < 0.7:
            query = rng.choice(
                [PROMPT, PROMPT.rstrip() + "</s>", "Other prompt: a dog", PROMPT + "\u200b</s>", 5, None]
            )
        elif roll < 0.85:
            label = rng.choice(["[" * 3000, "{" * 3000, '["a \\ud800"]', "x" * 3000, "[]", "null", 7])
        else:  # no prompt to cut, or one the query does not start with: invalid, never scored whole
            prompt = rng.choice([None, "", 7, PROMPT + "extra ", "   "])
        queries.append(query)
        prompts.append(prompt)
        labels.append(label)
    body: dict[str, Any] = {"query": queries, "prompts": prompts, "labels": labels}
    roll = rng.random()
    if roll < 0.1:
        body["labels"] = labels[:-1] or None
    elif roll < 0.2:
        body["request_id"] = rng.choice([k, f"q{k}", float("nan"), [1], {"a": 1}, "\ud800"])
    path = rng.choice(["/get_reward", f"/t/{TOKEN}/get_reward", f"/t/{TOKEN}/get_reward?extra_logs=1"])
    return Case(path, _dumps(body), goods=goods)


def _malformed(rng: random.Random, k: int) -> Case:
    path = rng.choice(["/v1/reward", "/get_reward"])
    content = rng.choice(
        [
            b"[" * rng.randint(1_000, 20_000),
            b'{"a":' * 5_000,
            b"",
            b"{",
            b"\xff\xfe\x00",
            b"null",
            b"[]",
            b"1e999999",
            b'{"request_id": "r", "items": {}}',
            b'{"query": "a"}',
            b'{"query": [], "prompts": 5}',
            b'"' + b"\\" * 1001 + b'"',
            b"1" * 5000,
            bytes(rng.randrange(256) for _ in range(rng.randint(1, 300))),
            b'{"request_id": "r", "items": ['
            + b'{"id": "x", "caption": "a", "references": ["a"]},' * 65
            + b"1]}",
            b"x" * (SETTINGS.max_body_bytes + 1),
        ]
    )
    headers = dict(AUTH)
    if rng.random() < 0.15:
        headers["Authorization"] = rng.choice(["Bearer nope", "", "Basic " + TOKEN])
    return Case(path, content, headers)


def _cases() -> list[Case]:
    rng = random.Random(SEED)
    makers: list[Callable[[random.Random, int], Case]] = [_v1, _v1, _openrlhf, _openrlhf, _malformed]
    return [rng.choice(makers)(rng, k) for k in range(REQUESTS)]


def test_seeded_fuzz_no_500_and_good_items_get_their_single_request_reward(url: str) -> None:
    with httpx.Client(base_url=url, timeout=120) as client:
        alone = {}
        for caption, refs in GOOD.items():
            body = {"request_id": "alone", "items": [{"id": "0", "caption": caption, "references": refs}]}
            alone[caption] = client.post("/v1/reward", content=_dumps(body), headers=AUTH).json()["results"][
                0
            ]
        assert all(result["valid"] for result in alone.values())
        cases = _cases()
        with ThreadPoolExecutor(THREADS) as pool:
            answers = list(
                pool.map(lambda c: client.post(c.path, content=c.content, headers=c.headers), cases)
            )
        health = client.get("/health")
    statuses = sorted({a.status_code for a in answers})
    assert 500 not in statuses and set(statuses) <= {200, 400, 401, 413, 422}, statuses
    checked = 0
    for case, answer in zip(cases, answers, strict=True):
        if answer.status_code != 200 or not case.goods:
            continue
        got = answer.json()
        values = [r["reward"] for r in got["results"]] if "results" in got else got["rewards"]
        for n, caption in case.goods:
            assert values[n] == pytest.approx(alone[caption]["reward"], abs=1e-5), (
                case.path,
                case.content[:300],
            )
            checked += 1
    assert checked > 500
    assert health.status_code == 200 and health.json()["status"] == "ok"


def test_a_lone_surrogate_among_ten_good_requests_fails_none(url: str) -> None:
    """Ten good requests and one whose caption holds a lone surrogate used to get 500, all eleven."""
    bodies = [
        {"request_id": f"g{i}", "items": [{"id": "0", "caption": c, "references": GOOD[c]}]}
        for i, c in enumerate(list(GOOD) * 3)
    ][:10]
    bodies.append(
        {
            "request_id": "bad",
            "items": [
                {"id": "0", "caption": "a dog \ud800 runs", "references": ["a dog"]},
                {"id": "1", "caption": "a red bike", "references": GOOD["a red bike"]},
            ],
        }
    )
    with httpx.Client(base_url=url, timeout=120) as client, ThreadPoolExecutor(len(bodies)) as pool:
        answers = list(pool.map(lambda b: client.post("/v1/reward", content=_dumps(b), headers=AUTH), bodies))
    assert [a.status_code for a in answers] == [200] * 11
    bad, good = answers[-1].json()["results"]
    assert not bad["valid"] and "lone surrogate" in bad["reason"] and good["valid"]
    assert good["reward"] == pytest.approx(answers[3].json()["results"][0]["reward"], abs=1e-5)
