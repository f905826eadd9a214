"""Each item of a reward request is judged on its own: a bad id, context, label or prompt makes only its
item invalid (OpenRLHF 0.8 raises after five tries on a 422), and a query without its prompt is never
scored whole (a model-free reward: the reward of a caption is its length / 100)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx

from tests.serve.conftest import TOKEN

AUTH = {"Authorization": f"Bearer {TOKEN}"}
REFS = ["a dog runs on the grass"]
DOCS = Path(__file__).resolve().parents[2] / "docs" / "rewards.md"


def test_v1_a_bad_id_or_context_fails_only_its_item(fake, serve) -> None:
    items = [
        {"id": "good", "caption": "a dog", "references": REFS},
        {"id": "no-refs", "caption": "a dog"},
        {"id": "empty", "caption": "a dog", "references": []},
        {"id": "blank", "caption": "a dog", "references": [""]},
        {"id": "number", "caption": "a dog", "references": 7},
        {"caption": "a dog", "references": REFS},
        {"id": 5, "caption": "a dog", "references": REFS},
        {"id": "good", "caption": "a cat", "references": REFS},
        "not an item",
        {"id": "last", "caption": "a dog runs", "references": REFS},
    ]
    with serve(fake) as url:
        answer = httpx.post(f"{url}/v1/reward", json={"request_id": "r", "items": items}, headers=AUTH)
        metrics = httpx.get(f"{url}/metrics", headers=AUTH).text
    assert answer.status_code == 200
    results = answer.json()["results"]
    assert [r["id"] for r in results] == ["good", "no-refs", "empty", "blank", "number", None, None, "good",
                                          None, "last"]  # fmt: skip
    assert [r["reward"] for r in results] == [0.05, 0, 0, 0, 0, 0, 0, 0, 0, 0.1]
    assert [r["valid"] for r in results] == [True] + [False] * 8 + [True]
    reasons = [r["reason"] for r in results[1:9]]
    assert reasons == [
        "no references (null or missing)",
        "references is an empty list",
        "references contain an empty or whitespace-only string",
        "references must be a list of strings, got a number",
        "item 5 needs a string id, got null",
        "item 6 needs a string id, got a number",
        "duplicate id 'good' (first: item 0)",
        'item 8 must be an object {"id", "caption", ...}, got a string',
    ]
    assert fake.batches == [2]  # only the good items reached the reward
    assert "qace_bad_context_total 8" in metrics


def _openrlhf(url: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}/t/{TOKEN}/get_reward", json=body)


def test_openrlhf_a_bad_label_fails_only_its_sample(fake, serve) -> None:
    labels = [REFS, None, [], [""], 7, '["a', "{not json", json.dumps(REFS), "a dog"]
    body = {"query": ["Describe: a dog"] * len(labels), "prompts": ["Describe: "] * len(labels),
            "labels": labels}  # fmt: skip
    with serve(fake) as url:
        answer = _openrlhf(url, body)
        metrics = httpx.get(f"{url}/metrics", headers=AUTH).text
    assert answer.status_code == 200
    assert answer.json()["rewards"] == [0.05, 0, 0, 0, 0, 0, 0, 0.05, 0.05]
    assert fake.batches == [3] and "qace_bad_context_total 6" in metrics


def test_openrlhf_a_label_that_starts_like_json_and_does_not_parse_is_not_a_reference(fake, serve) -> None:
    """``'["a'`` was read as the one reference ``["a``; it is a broken JSON list, and says so."""
    with serve(fake, max_caption_chars=50) as url:
        answer = httpx.post(
            f"{url}/get_reward?extra_logs=1",
            json={"query": ["Describe: a dog"], "prompts": ["Describe: "], "labels": ['["a']},
            headers=AUTH,
        )
    assert answer.status_code == 200 and answer.json()["rewards"] == [0.0]
    assert answer.json()["extra_logs"]["qace_valid"] == 0.0 and fake.batches == []


def test_openrlhf_a_query_without_its_prompt_is_never_scored_whole(fake, serve, caplog) -> None:
    """Scored whole, ``"Describe: "`` plus an empty completion earned a reward (0.38 with QACE)."""
    queries = ["Describe: </s>", "Describe: a dog", "Describe: a dog", "Describe: a dog", "Describe: a dog"]
    prompts = [None, "", "  ", 7, "Describe: "]
    labels = [REFS] * len(queries)
    with serve(fake) as url:
        per_sample = _openrlhf(url, {"query": queries, "prompts": prompts, "labels": labels})
        refused = [
            _openrlhf(url, {"query": queries, "labels": labels}),
            _openrlhf(url, {"query": queries, "prompts": None, "labels": labels}),
            _openrlhf(url, {"query": queries, "prompts": "", "labels": labels}),
            _openrlhf(url, {"query": queries, "prompts": prompts[:2], "labels": labels}),
        ]
    assert per_sample.status_code == 200 and per_sample.json()["rewards"] == [0, 0, 0, 0, 0.05]
    assert fake.batches == [1]
    assert [r.status_code for r in refused] == [422] * 4
    assert all("prompts must be" in r.json()["detail"] for r in refused)
    assert "use /v1/reward" in refused[0].json()["detail"]
    assert "4 of 5 items rewarded as invalid" in caplog.text and "no prompt to cut" in caplog.text


def test_the_documented_empty_requests_are_answered(fake, serve) -> None:
    """Every empty request docs/rewards.md shows in its limits table gets 200 with no results."""
    row = next(line for line in DOCS.read_text().splitlines() if line.startswith("| no items"))
    bodies = [json.loads(body) for body in re.findall(r"`(\{.*?\})`", row)]
    assert len(bodies) == 2
    with serve(fake) as url:
        answers = [
            httpx.post(f"{url}/{'v1/reward' if 'items' in body else 'get_reward'}", json=body, headers=AUTH)
            for body in bodies
        ]
    assert [a.status_code for a in answers] == [200, 200]
    assert [a.json().get("results", a.json().get("rewards")) for a in answers] == [[], []]
