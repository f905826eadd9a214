"""The reward service: auth, limits, back-pressure, micro-batching, OpenRLHF protocol, client checks."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from qace.serve.client import RewardClient, RewardServiceError

TOKEN = "test-token-0123456789"  # as in conftest.py
AUTH = {"Authorization": f"Bearer {TOKEN}"}
REFS = ["a dog runs on the grass"]


def _v1(request_id: str, captions: list, **extra: object) -> dict:
    items = [{"id": str(i), "caption": c, "references": REFS} for i, c in enumerate(captions)]
    return {"request_id": request_id, "items": items, **extra}


def test_auth_required_except_health(fake, serve) -> None:
    with serve(fake) as url:
        assert httpx.post(f"{url}/v1/reward", json=_v1("r", ["a dog"])).status_code == 401
        wrong = httpx.post(
            f"{url}/v1/reward", json=_v1("r", ["a dog"]), headers={"Authorization": "Bearer nope"}
        )
        assert wrong.status_code == 401 and wrong.headers["www-authenticate"] == "Bearer"
        assert httpx.get(f"{url}/metrics").status_code == 401
        assert httpx.post(f"{url}/get_reward", json={"query": ["x"], "labels": [REFS]}).status_code == 401
        health = httpx.get(f"{url}/health")
        assert health.status_code == 200 and health.json()["signature"] == fake.signature


@pytest.mark.parametrize("token", ["", "                    ", "short", "fifteen-chars-x"])
def test_missing_or_short_token_refused(token) -> None:
    from qace.errors import ConfigError
    from qace.serve.app import create_app

    with pytest.raises(ConfigError, match="at least 16 characters"):
        create_app(object(), token=token)


@pytest.mark.parametrize(
    ("header", "status"),
    [
        (f"Bearer {TOKEN}", 200),
        (f"bearer {TOKEN}", 200),
        (f"BEARER {TOKEN}", 200),
        (f"bEaReR  {TOKEN}", 200),
        (f"Bearer {TOKEN.upper()}", 401),
        (f"Basic {TOKEN}", 401),
        (f"Bearer{TOKEN}", 401),
        (TOKEN, 401),
    ],
)
def test_bearer_scheme_matches_in_any_case_the_token_exactly(fake, serve, header, status) -> None:
    """RFC 9110 section 11.1: the scheme name is case-insensitive; the credentials are not."""
    with serve(fake) as url:
        got = httpx.post(f"{url}/v1/reward", json=_v1("r", ["a dog"]), headers={"Authorization": header})
    assert got.status_code == status


def _serve_command(monkeypatch, argv: list[str]) -> tuple[int, dict]:
    """Run ``qace serve argv`` with a model-free reward and no server; what create_app got."""
    import argparse

    from qace.serve.cli import register

    seen: dict = {}

    class Reward:
        def __init__(self, **kwargs):
            seen["loaded"] = True
            self.device, self.signature = "cpu", "sig"
            self.scorer = argparse.Namespace(uses_test_models=False)

    monkeypatch.setattr("qace.reward.QACEReward", Reward)
    monkeypatch.setattr("qace.serve.app.create_app", lambda *a, **k: seen.update(k))
    monkeypatch.setattr("qace.serve.cli.serve", lambda *a, **k: None)
    monkeypatch.delenv("QACE_SERVE_TOKEN", raising=False)
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["serve", "--port", "0", *argv])
    return args.func(args), seen


def test_serve_command_without_a_token_makes_one_and_prints_it(monkeypatch, capsys) -> None:
    code, seen = _serve_command(monkeypatch, ["--no-warm-up"])
    token = seen["token"]
    assert code == 0 and len(token) >= 16 and f"Authorization: Bearer {token}" in capsys.readouterr().out


def test_serve_command_refuses_a_short_token_before_loading_models(monkeypatch) -> None:
    from qace.errors import ConfigError

    with pytest.raises(ConfigError, match="at least 16 characters"):
        _serve_command(monkeypatch, ["--token", "12345"])


def test_concurrent_batches_reach_the_service_and_zero_is_refused_before_models_load(monkeypatch) -> None:
    from qace.errors import ConfigError

    seen: dict = {}
    with pytest.raises(ConfigError, match="--concurrent-batches must be at least 1"):
        _serve_command(monkeypatch, ["--token", TOKEN, "--concurrent-batches", "0"])
    _, seen = _serve_command(monkeypatch, ["--token", TOKEN, "--concurrent-batches", "3", "--no-warm-up"])
    assert "loaded" in seen and seen["settings"].concurrent_batches == 3


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_a_non_finite_invalid_reward_is_refused_before_models_load(monkeypatch, value) -> None:
    from qace.errors import ConfigError

    with pytest.raises(ConfigError, match=r"invalid_reward \(--invalid-reward\) is .*: give a finite number"):
        _serve_command(monkeypatch, ["--token", TOKEN, f"--invalid-reward={value}"])


def test_serve_on_a_busy_port_fails_before_any_model_loads(monkeypatch, capsys) -> None:
    """The port is bound before the models load (it used to fail only after loading and "ready")."""
    import socket

    from qace.cli import main

    loaded = []
    monkeypatch.setattr("qace.reward.QACEReward", lambda **kwargs: loaded.append(kwargs))
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["serve", "--port", str(port), "--token", TOKEN]) == 2
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in err and "--port" in err and loaded == []


def test_serve_holds_its_port_while_the_models_load(monkeypatch) -> None:
    """Nothing else can take the port between the check and the serving: it is bound from the start."""
    import argparse
    import socket

    from qace.serve.cli import register

    taken = []

    class Reward:
        def __init__(self, **kwargs):
            with socket.socket() as other:
                try:
                    other.bind(("127.0.0.1", port))
                except OSError:
                    taken.append(True)
            self.device, self.signature = "cpu", "sig"
            self.scorer = argparse.Namespace(uses_test_models=False)

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setattr("qace.reward.QACEReward", Reward)
    monkeypatch.setattr("qace.serve.app.create_app", lambda *a, **k: None)
    monkeypatch.setattr("qace.serve.cli.serve", lambda app, sock: taken.append(sock.getsockname()[1]))
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["serve", "--port", str(port), "--token", TOKEN])
    assert args.func(args) == 0 and taken == [True, port]


def test_rewards_ids_echoed_and_invalid_captions_get_zero(fake, serve) -> None:
    with serve(fake, max_caption_chars=50) as url:
        body = _v1("req-1", ["a dog", "", "   ", "x" * 51])
        body["items"].append({"id": "4", "caption": 7, "references": REFS})
        got = httpx.post(f"{url}/v1/reward", json=body, headers=AUTH).json()
    assert got["request_id"] == "req-1" and got["signature"] == fake.signature
    assert [r["id"] for r in got["results"]] == ["0", "1", "2", "3", "4"]
    assert got["results"][0] == {
        "id": "0",
        "reward": 0.05,
        "valid": True,
        "reason": None,
        "scores": {"qace": 0.05, "qace_f1": 1.0},
    }
    for result in got["results"][1:]:
        assert result["reward"] == 0.0 and not result["valid"] and result["reason"]
    assert "limit is 50" in got["results"][3]["reason"]


def test_limits(fake, serve) -> None:
    with serve(fake, max_items=3, max_body_bytes=2000) as url:
        too_many = httpx.post(f"{url}/v1/reward", json=_v1("r", ["a"] * 4), headers=AUTH)
        assert too_many.status_code == 413 and "limit is 3 (--max-items)" in too_many.json()["detail"]
        too_big = httpx.post(f"{url}/v1/reward", json=_v1("r", ["a" * 3000]), headers=AUTH)
        assert too_big.status_code == 413 and "(--max-body-bytes)" in too_big.json()["detail"]

        def chunks():  # no Content-Length: the limit must hold on streamed bodies too
            yield json.dumps(_v1("r", ["a" * 1500])).encode()[:1500]
            yield b" " * 1500

        streamed = httpx.post(f"{url}/v1/reward", content=chunks(), headers=AUTH)
        assert streamed.status_code == 413
        assert httpx.post(f"{url}/v1/reward", content=b"{nope", headers=AUTH).status_code == 400
        no_id = {"items": [{"id": "0", "caption": "a", "references": REFS}]}
        assert httpx.post(f"{url}/v1/reward", json=no_id, headers=AUTH).status_code == 422
        bad_component = _v1("r", ["a"], component="bleu")
        assert httpx.post(f"{url}/v1/reward", json=bad_component, headers=AUTH).status_code == 422


def test_micro_batching_merges_concurrent_single_requests(fake, serve) -> None:
    fake.gate.clear()  # hold the first batch so the others queue up behind it
    with serve(fake, max_batch=64, max_wait_ms=20) as url:
        with ThreadPoolExecutor(8) as pool:
            futures = [
                pool.submit(
                    httpx.post,
                    f"{url}/v1/reward",
                    json=_v1(f"r{i}", ["a" * (i + 1)]),
                    headers=AUTH,
                    timeout=20,
                )
                for i in range(8)
            ]
            time.sleep(0.5)
            fake.gate.set()
            answers = [f.result().json() for f in futures]
        metrics = httpx.get(f"{url}/metrics", headers=AUTH).text
    for i, answer in enumerate(answers):  # every request got its own reward back
        assert answer["request_id"] == f"r{i}" and answer["results"][0]["reward"] == pytest.approx(
            (i + 1) / 100
        )
    assert sum(fake.batches) == 8 and len(fake.batches) < 8
    assert "qace_batched_items_total 8" in metrics


def test_back_pressure_429_then_503_with_retry_after(fake, serve) -> None:
    fake.gate.clear()
    with serve(fake, max_queue=2, max_items=2, timeout_s=1.0, max_wait_ms=1) as url:
        try:
            with ThreadPoolExecutor(2) as pool:
                first = pool.submit(
                    httpx.post, f"{url}/v1/reward", json=_v1("a", ["x", "y"]), headers=AUTH, timeout=10
                )
                time.sleep(0.3)  # first request is now being scored (blocked) and holds the queue
                full = httpx.post(f"{url}/v1/reward", json=_v1("b", ["z"]), headers=AUTH, timeout=10)
                assert full.status_code == 429 and int(full.headers["retry-after"]) >= 1
                waited = first.result()
            assert waited.status_code == 503 and "retry-after" in waited.headers
        finally:
            fake.gate.set()
        for _ in range(100):  # bounded: the abandoned batch finishes, the queue drains
            if httpx.get(f"{url}/health").json()["queued_items"] == 0:
                break
            time.sleep(0.05)
        ok = httpx.post(f"{url}/v1/reward", json=_v1("c", ["z"]), headers=AUTH, timeout=10)
        assert ok.status_code == 200
        metrics = httpx.get(f"{url}/metrics", headers=AUTH).text
    assert "qace_rejected_total 1" in metrics and "qace_timed_out_total 1" in metrics
    assert 'qace_http_responses_total{code="429"} 1' in metrics


def test_openrlhf_protocol(fake, serve) -> None:
    with serve(fake) as url:
        body = {
            "query": ["Describe: a dog</s>", "Describe: ", "Describe: a cat"],
            "prompts": ["Describe: ", "Describe: ", "Describe: "],
            "labels": [json.dumps(REFS), REFS, {"references": REFS}],
            "request_id": 17,
        }
        got = httpx.post(f"{url}/get_reward?extra_logs=1", json=body, headers=AUTH).json()
        assert got["rewards"] == [0.05, 0.0, 0.05] and got["scores"] == got["rewards"]
        assert "extra_logs" not in got and got["request_id"] == 17  # OpenRLHF 0.8 cannot take lists
        one = {"query": ["Describe: a dog"], "prompts": ["Describe: "], "labels": [REFS]}
        assert "extra_logs" not in httpx.post(f"{url}/get_reward", json=one, headers=AUTH).json()
        logs = httpx.post(f"{url}/get_reward?extra_logs=1", json=one, headers=AUTH).json()["extra_logs"]
        assert logs == {"qace_f1": 1.0, "qace_bs": 0.0, "qace_an": 0.0, "qace_valid": 1.0}  # scalars
        short = httpx.post(f"{url}/get_reward", json={"query": ["a"], "labels": []}, headers=AUTH)
        assert short.status_code == 422


def test_openrlhf_token_in_the_path(fake, serve) -> None:
    body = {"query": ["Describe: a dog"], "prompts": ["Describe: "], "labels": [REFS]}
    with serve(fake) as url:
        assert httpx.post(f"{url}/t/{TOKEN}/get_reward", json=body).json()["rewards"] == [0.05]
        assert httpx.post(f"{url}/t/wrong-token/get_reward", json=body).status_code == 401
        assert httpx.post(f"{url}/t/{TOKEN}x/get_reward", json=body).status_code == 401
        assert httpx.post(f"{url}/t/{TOKEN}/v1/reward", json=_v1("r", ["a"])).status_code in (401, 404)


def test_query_not_starting_with_its_prompt_is_invalid_and_counted(fake, serve, caplog) -> None:
    body = {"query": ["Describe: a dog", "<s> Describe: a cat"], "prompts": ["Describe: "] * 2}
    with serve(fake) as url:
        got = httpx.post(f"{url}/get_reward", json={**body, "labels": [REFS] * 2}, headers=AUTH).json()
        metrics = httpx.get(f"{url}/metrics", headers=AUTH).text
    assert got["rewards"] == [
        0.05,
        0.0,
    ]  # the second is invalid (scored whole, its prompt would earn it), counted
    assert "qace_prompt_mismatch_total 1" in metrics
    assert "1 of 2 queries do not start with their prompt (first: sample 1)" in caplog.text


def test_max_items_above_max_queue_is_refused_at_start(fake) -> None:
    from qace.errors import ConfigError
    from qace.serve.app import ServeSettings, create_app

    with pytest.raises(ConfigError, match="--max-items 20 exceeds --max-queue 10"):
        create_app(fake, token=TOKEN, settings=ServeSettings(max_items=20, max_queue=10))


def test_default_limits_take_an_openrlhf_rollout_batch(fake, serve) -> None:
    """OpenRLHF 0.8 sends a whole rollout batch (here 1024 prompts x 8 samples) in one request."""
    n = 1024 * 8
    prompt = "Describe the image in one sentence: "
    body = {
        "query": [prompt + "a dog runs on the grass next to a small red ball</s>"] * n,
        "prompts": [prompt] * n,
        "labels": [json.dumps(["a dog runs on the grass", "a brown dog plays with a ball outside"])] * n,
    }
    with serve(fake) as url:
        got = httpx.post(f"{url}/get_reward", json=body, headers=AUTH, timeout=60)
    assert got.status_code == 200 and len(got.json()["rewards"]) == n


def test_client_retries_busy_server_then_succeeds() -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        if len(calls) < 3:
            return httpx.Response(
                429 if len(calls) == 1 else 503, headers={"Retry-After": "0"}, json={"detail": "busy"}
            )
        sent = json.loads(request.content)
        results = [
            {"id": item["id"], "reward": 0.5, "valid": True, "reason": None, "scores": {}}
            for item in sent["items"]
        ]
        return httpx.Response(200, json={"request_id": sent["request_id"], "results": results})

    with RewardClient("http://rm", TOKEN, transport=httpx.MockTransport(handler), backoff_s=0) as client:
        assert client.rewards(["a", "b"], references=[REFS, REFS]) == [0.5, 0.5]
    assert len(calls) == 3
    assert len({json.loads(c.content)["request_id"] for c in calls}) == 1  # retries resend the same request
    assert calls[0].headers["authorization"] == f"Bearer {TOKEN}"


@pytest.mark.parametrize("tamper", ["request_id", "order", "missing"])
def test_client_refuses_rewards_for_other_samples(tamper: str) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        sent = json.loads(request.content)
        results = [{"id": item["id"], "reward": 0.1, "valid": True} for item in sent["items"]]
        request_id = sent["request_id"]
        if tamper == "request_id":
            request_id = "someone-else"
        elif tamper == "order":
            results.reverse()
        else:
            results.pop()
        return httpx.Response(200, json={"request_id": request_id, "results": results})

    with RewardClient("http://rm", TOKEN, transport=httpx.MockTransport(handler)) as client:
        with pytest.raises(RewardServiceError, match="discarded"):
            client.rewards(["a", "b"], references=[REFS, REFS])


def test_client_gives_up_and_does_not_retry_client_errors() -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        return httpx.Response(401 if request.url.path == "/v1/reward" else 503, json={"detail": "no"})

    with RewardClient("http://rm", "bad", transport=httpx.MockTransport(handler)) as client:
        with pytest.raises(RewardServiceError) as info:
            client.rewards(["a"], references=[REFS])
    assert info.value.status == 401 and len(calls) == 1


def test_stopping_batcher_fails_queued_requests_instead_of_hanging() -> None:
    import asyncio

    from qace.serve.batcher import Item, MicroBatcher, Unavailable

    gate = threading.Event()

    def slow(items: list) -> list:
        gate.wait(5)
        return [0.0] * len(items)

    async def scenario() -> list:
        batcher = MicroBatcher(slow, on_error=lambda item, exc: exc, max_wait_s=0)
        await batcher.start()
        first = asyncio.create_task(batcher.submit([Item("a")]))
        await asyncio.sleep(0.1)  # first is being scored; second waits in the queue
        second = asyncio.create_task(batcher.submit([Item("b")]))
        await asyncio.sleep(0.1)
        await batcher.stop()
        gate.set()
        return await asyncio.gather(first, second, return_exceptions=True)

    outcomes = asyncio.run(asyncio.wait_for(scenario(), 10))
    assert all(isinstance(o, Unavailable) for o in outcomes)


@pytest.mark.parametrize(
    ("device", "setting", "concurrency"),
    [("cpu", None, 1), ("cuda:0", None, 2), ("cpu", 3, 3), ("cuda", 1, 1)],
)
def test_concurrent_batches_default_to_two_on_a_gpu_and_one_on_the_cpu(
    fake, device, setting, concurrency
) -> None:
    """On the CPU host work and model work share the cores, so batches overlap only on a GPU by default."""
    from qace.serve.app import ServeSettings, create_app

    fake.device = device
    app = create_app(fake, token=TOKEN, settings=ServeSettings(concurrent_batches=setting))
    assert app.state.batcher.concurrency == concurrency


def _concurrent_scoring(concurrency: int) -> tuple[list, int]:
    """Three one-item requests, each its own batch, scored by a batcher of ``concurrency``; the results
    and the most batches ever scored at once. A batch waits (at most 5 s) for ``concurrency`` batches to
    be in at once, or with ``concurrency`` 1 lingers, so that a second batch would be caught beside it."""
    import asyncio

    from qace.serve.batcher import Item, MicroBatcher

    now, most, turn = [0], [0], threading.Condition()

    def score(items: list) -> list:
        with turn:
            now[0] += 1
            most[0] = max(most[0], now[0])
            turn.notify_all()
            if concurrency > 1:
                turn.wait_for(lambda: now[0] >= concurrency or most[0] >= concurrency, timeout=5)
        if concurrency == 1:
            time.sleep(0.2)
        with turn:
            now[0] -= 1
        return [item.caption.upper() for item in items]

    async def scenario() -> list:
        batcher = MicroBatcher(score, on_error=lambda item, exc: exc, max_batch=1, concurrency=concurrency)
        await batcher.start()
        got = await asyncio.gather(*(batcher.submit([Item(c)]) for c in ("a", "b", "c")))
        await batcher.stop()
        return got

    return asyncio.run(asyncio.wait_for(scenario(), 20)), most[0]


def test_a_batcher_scores_up_to_its_concurrency_of_batches_at_once() -> None:
    """With ``concurrency`` 2, a second batch is scored while the first still is (its host work beside
    the first's device work); with 1, never; the results are the same."""
    serial, most_serial = _concurrent_scoring(1)
    together, most_together = _concurrent_scoring(2)
    assert serial == together == [["A"], ["B"], ["C"]]
    assert (most_serial, most_together) == (1, 2)


def test_stopping_a_concurrent_batcher_fails_every_batch_in_flight_and_queued() -> None:
    import asyncio

    from qace.serve.batcher import Item, MicroBatcher, Unavailable

    gate = threading.Event()

    def slow(items: list) -> list:
        gate.wait(5)
        return [0.0] * len(items)

    async def scenario() -> tuple[list, int]:
        batcher = MicroBatcher(slow, on_error=lambda item, exc: exc, max_batch=1, max_wait_s=0, concurrency=2)
        await batcher.start()
        tasks = [asyncio.create_task(batcher.submit([Item(c)])) for c in ("a", "b", "c")]
        await asyncio.sleep(0.2)  # a and b are being scored; c waits for a slot
        scoring = len(batcher._inflight)
        await batcher.stop()
        gate.set()
        return await asyncio.gather(*tasks, return_exceptions=True), scoring

    outcomes, scoring = asyncio.run(asyncio.wait_for(scenario(), 10))
    assert scoring == 2 and all(isinstance(o, Unavailable) for o in outcomes)


def test_serve_command_parses() -> None:
    import argparse

    from qace.serve.cli import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        ["serve", "--models", "m", "--variant", "img", "--port", "9000", "--token", TOKEN]
    )
    assert (args.variant, args.port, args.token, args.host) == ("img", 9000, TOKEN, "127.0.0.1")


def test_serve_command_passes_only_the_speed_settings_given(monkeypatch) -> None:
    """The device picks the speed settings the command line leaves open (`qace.config.speed_defaults`)."""
    import argparse

    from qace.serve.cli import register

    seen: dict = {}

    class Built(Exception):
        pass

    def reward(**kwargs):
        seen.update(kwargs)
        raise Built

    monkeypatch.setattr("qace.reward.QACEReward", reward)
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        ["serve", "--port", "0", "--token", TOKEN, "--spacy-workers", "3", "--batch-rows", "512"]
    )
    with pytest.raises(Built):
        args.func(args)
    assert (seen["spacy_workers"], seen["max_batch_rows"]) == (3, 512)
    assert "max_batch_tokens" not in seen


@pytest.mark.parametrize(("flags", "warm_up"), [([], True), (["--no-warm-up"], False)])
def test_serve_command_warms_the_engine_up_unless_told_not_to(monkeypatch, flags, warm_up) -> None:
    import argparse

    from qace.serve.cli import register

    seen: dict = {}

    class Reward:
        def __init__(self, **kwargs):
            self.device, self.signature = "cuda", "sig"
            self.scorer = argparse.Namespace(uses_test_models=False)

    monkeypatch.setattr("qace.reward.QACEReward", Reward)
    monkeypatch.setattr("qace.serve.app.create_app", lambda *a, **k: seen.update(k))
    monkeypatch.setattr("qace.serve.cli.serve", lambda *a, **k: seen.update(served=True))
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["serve", "--port", "0", "--token", TOKEN, *flags])
    assert args.func(args) == 0
    assert seen["warm_up"] is warm_up and seen["served"]


def _warming(fake, fail: bool = False) -> threading.Event:
    """Give ``fake`` a warm-up that lasts until the returned event is set (then fails if ``fail``)."""
    done = threading.Event()

    def warm_up() -> int:
        done.wait(10)
        if fail:
            raise RuntimeError("out of memory")
        return 3

    fake.warm_up = warm_up
    return done


def _wait_ready(url: str) -> httpx.Response:
    for _ in range(250):
        health = httpx.get(f"{url}/health")
        if health.json()["status"] != "warming_up":
            return health
        time.sleep(0.02)
    raise AssertionError("still warming up")


def test_requests_are_held_during_the_warm_up_then_answered(fake) -> None:
    """The server answers /health at once while it warms up (503); reward requests wait for the end of the
    warm-up instead of failing, because OpenRLHF's clients give up after five 503s a second apart."""
    from qace.serve.app import create_app
    from qace.serve.local import serving

    done = _warming(fake)
    with serving(create_app(fake, token=TOKEN, warm_up=True), start_timeout_s=10) as url:
        health = httpx.get(f"{url}/health")
        assert health.status_code == 503 and health.json()["status"] == "warming_up"
        body = {"query": ["Describe: a dog"], "prompts": ["Describe: "], "labels": [REFS]}
        with ThreadPoolExecutor(1) as pool:
            early = pool.submit(httpx.post, f"{url}/t/{TOKEN}/get_reward", json=body, timeout=10)
            time.sleep(0.5)
            assert not early.done() and fake.batches == []
            done.set()
            assert early.result().status_code == 200 and early.result().json()["rewards"] == [0.05]
        assert _wait_ready(url).status_code == 200


def test_a_warm_up_longer_than_the_timeout_gets_503_with_retry_after(fake) -> None:
    from qace.serve.app import ServeSettings, create_app
    from qace.serve.local import serving

    done = _warming(fake)
    app = create_app(fake, token=TOKEN, warm_up=True, settings=ServeSettings(timeout_s=0.3))
    try:
        with serving(app, start_timeout_s=10) as url:
            early = httpx.post(f"{url}/v1/reward", json=_v1("r", ["a dog"]), headers=AUTH, timeout=10)
            assert early.status_code == 503 and early.headers["retry-after"] == "5"
            assert "warming up" in early.json()["detail"] and fake.batches == []
            done.set()  # the server stops once its warm-up has ended
    finally:
        done.set()


def test_a_server_stopped_while_warming_up_stops_after_its_warm_up(fake) -> None:
    """Stopping the service during its warm-up waits for the warm-up to end: no thread goes on using the
    engine (or logging to closed streams) after the service has stopped."""
    from qace.serve.app import create_app
    from qace.serve.local import serving

    done = _warming(fake)
    with serving(create_app(fake, token=TOKEN, warm_up=True), start_timeout_s=10) as url:
        assert httpx.get(f"{url}/health").json()["status"] == "warming_up"
        threading.Timer(1.0, done.set).start()  # the warm-up ends a second after the stop begins
    assert done.is_set()
    assert not [t for t in threading.enumerate() if t.name == "qace-warm-up"]


def test_a_failed_warm_up_is_reported_and_the_service_still_scores(fake) -> None:
    from qace.serve.app import create_app
    from qace.serve.local import serving

    _warming(fake, fail=True).set()
    with serving(create_app(fake, token=TOKEN, warm_up=True), start_timeout_s=10) as url:
        health = _wait_ready(url)
        assert health.status_code == 200 and "out of memory" in health.json()["warm_up_error"]
        got = httpx.post(f"{url}/v1/reward", json=_v1("r", ["a dog"]), headers=AUTH)
        assert got.status_code == 200
