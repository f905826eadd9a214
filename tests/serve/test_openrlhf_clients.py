"""OpenRLHF's own remote-reward clients (0.11 and 0.8, as they ship) against ``qace serve`` on loopback.

The two releases are installed with ``pip install --no-deps --target`` (scripts/setup.sh puts them in
``<venv>/openrlhf/<version>``; ``QACE_OPENRLHF_DIR`` overrides the parent folder). Their packages'
``__init__`` files import deepspeed, vLLM and Ray actors, which a CPU test host does not have and these
clients do not use, so the packages are stood in by empty modules (the real folders as their paths): only
the module files under test and what they import themselves run, and the few heavy modules they import
by name (vLLM's ``SamplingParams``, the Ray launcher) are stubs that the tested functions never call.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys
import threading
import types
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import httpx
import pytest
import torch

from qace.reward import QACEReward
from qace.serve.app import ServeSettings, create_app
from qace.serve.local import serving

TOKEN = "openrlhf-test-token-0123"
REFS = ["a girl in a red dress runs on the beach", "a child plays near the sea"]
PROMPT = "Describe the image: "
CAPTIONS = ["a girl runs on the beach", "a dog in the snow", ""]
VERSIONS = {"0.11": "0.11.2", "0.8": "0.8.11"}
PACKAGES = ("openrlhf", "openrlhf.utils", "openrlhf.models", "openrlhf.trainer", "openrlhf.trainer.ppo_utils",
            "openrlhf.trainer.ray")  # fmt: skip


def _release(version: str) -> Path:
    parent = Path(os.environ.get("QACE_OPENRLHF_DIR", Path(sys.prefix) / "openrlhf"))
    folder = parent / VERSIONS[version]
    if not (folder / "openrlhf").is_dir():
        pytest.skip(f"OpenRLHF {VERSIONS[version]} is not installed in {folder}; run scripts/setup.sh")
    return folder


@contextmanager
def openrlhf(version: str) -> Iterator[None]:
    """Make ``import openrlhf.<module>`` load that release's module files; undo it afterwards."""
    root = _release(version) / "openrlhf"
    saved = {k: v for k, v in sys.modules.items() if k.startswith(("openrlhf", "vllm"))}
    for name in saved:
        del sys.modules[name]
    for name in PACKAGES:
        package = types.ModuleType(name)
        package.__path__ = [str(root.joinpath(*name.split(".")[1:]))]
        sys.modules[name] = package
    stubs = {
        "vllm": {"SamplingParams": object},  # 0.11's samples_generator: a type annotation's import
        "openrlhf.trainer.ray.vllm_engine": {"batch_vllm_engine_call": None},
        "openrlhf.trainer.ray.launcher": {"RayActorGroup": object},  # 0.8's experience_maker
    }
    for name, attributes in stubs.items():
        sys.modules[name] = types.ModuleType(name)
        vars(sys.modules[name]).update(attributes)
    try:
        yield
    finally:
        for name in [k for k in sys.modules if k.startswith(("openrlhf", "vllm"))]:
            del sys.modules[name]
        sys.modules.update(saved)


@pytest.fixture(scope="module")
def reward(test_models_dir: Path) -> QACEReward:
    return QACEReward(models=test_models_dir)


@pytest.fixture(scope="module")
def url(reward: QACEReward) -> Iterator[str]:
    with serving(create_app(reward, token=TOKEN), start_timeout_s=10) as base:
        yield f"{base}/t/{TOKEN}/get_reward"


class CharTokenizer:
    """A tokenizer with one token per character: the text OpenRLHF decodes is the text it encoded."""

    def __call__(self, text: str, add_special_tokens: bool, return_tensors: str) -> dict[str, Any]:
        import torch

        return {"input_ids": torch.tensor([[ord(c) for c in text]])}

    def decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        return "".join(map(chr, ids))


class TokenizerEngine:
    """vLLM's ``generate`` answering with a fixed caption in a real tokenizer's ids, ended by its EOS."""

    def __init__(self, caption: str, tokenizer: Any) -> None:
        self.ids = tokenizer(caption, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]

    async def generate(self, prompt_ids: list[int], params: Any, multi_modal_data: Any = None) -> Any:
        out = types.SimpleNamespace(token_ids=self.ids, finish_reason="stop", logprobs=None)
        return types.SimpleNamespace(outputs=[out])


class OneCaptionEngine:
    """vLLM's ``generate`` answering with a fixed caption."""

    def __init__(self, caption: str, tokenizer: Any = None) -> None:
        self.caption = caption

    async def generate(self, prompt_ids: list[int], params: Any, multi_modal_data: Any = None) -> Any:
        out = types.SimpleNamespace(token_ids=[ord(c) for c in self.caption + "</s>"], finish_reason="stop",
                                    logprobs=None)  # fmt: skip
        return types.SimpleNamespace(outputs=[out])


def _rollouts_0_11(url: str, captions: list[str], tokenizer: Any = None, prompt: str = PROMPT) -> list[Any]:
    """0.11's ``SingleTurnAgentExecutor.execute`` per caption (it calls ``_fetch_rewards_via_http`` and turns
    any error into ``reward=None``), then its own conversion of each response into an ``Experience``
    (run inside ``openrlhf("0.11")``)."""
    from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator
    from openrlhf.utils.agent import SingleTurnAgentExecutor

    executor = SingleTurnAgentExecutor(url)
    params = types.SimpleNamespace(max_tokens=64, logprobs=None)
    tokenizer = tokenizer or CharTokenizer()
    engine = TokenizerEngine if not isinstance(tokenizer, CharTokenizer) else OneCaptionEngine

    async def rollouts() -> list[dict[str, Any]]:
        return await asyncio.gather(
            *(
                executor.execute(prompt, json.dumps(REFS), params, 256, tokenizer, engine(c, tokenizer))
                for c in captions
            )
        )

    return [SamplesGenerator._process_response_into_experience(None, r) for r in asyncio.run(rollouts())]


@pytest.mark.parametrize("n", [1, 2, 300])
@pytest.mark.parametrize("logs", [False, True])
def test_openrlhf_0_11_executor_and_make_experience_batch(
    reward: QACEReward, url: str, n: int, logs: bool
) -> None:
    """0.11 as it trains: one request per rollout, each reply made an ``Experience``, the experiences of a
    step batched by its own ``make_experience_batch``; with ``?extra_logs=1`` the components too."""
    captions = [CAPTIONS[i % 3] for i in range(n)]
    want = reward(captions, references=[REFS] * n).tolist()
    with openrlhf("0.11"):
        from openrlhf.trainer.ppo_utils.experience import make_experience_batch

        experiences = _rollouts_0_11(url + ("?extra_logs=1" if logs else ""), captions)
        batch = make_experience_batch(experiences)
    assert batch.rewards.flatten().tolist() == pytest.approx(want, abs=1e-6)
    assert [e.rewards.flatten().item() for e in experiences] == pytest.approx(want, abs=1e-6)
    if logs:
        assert {"qace_f1", "qace_bs", "qace_an", "qace_valid"} <= set(batch.info)
        valid = [float(caption != "") for caption in captions]
        assert torch.cat(batch.info["qace_valid"]).tolist() == valid
    else:
        assert "qace_valid" not in batch.info


@pytest.mark.parametrize("n", [1, 2, 300])
def test_openrlhf_0_8_request_api_wrapper_and_batch_update(reward: QACEReward, url: str, n: int) -> None:
    """0.8: ``remote_rm_utils.request_api_wrapper`` posts a whole rollout batch (one query when the batch
    is 1, or as many URLs as queries), and ``update_samples_with_rewards`` (``torch.cat`` of every
    response field) must take the answer; extra_logs asked for or not."""
    captions = [CAPTIONS[i % 3] for i in range(n)]
    want = reward(captions, references=[REFS] * n).tolist()
    with openrlhf("0.8"):
        from openrlhf.trainer.ppo_utils.experience_maker import update_samples_with_rewards
        from openrlhf.utils.remote_rm_utils import request_api_wrapper

        data = {"query": [PROMPT + c + "</s>" for c in captions], "prompts": [PROMPT] * n,
                "labels": [json.dumps(REFS)] * n}  # fmt: skip
        answer = request_api_wrapper(url, data, try_max_times=1)
        sizes = [n // 2, n - n // 2] if n > 1 else [1]
        samples = [types.SimpleNamespace(sequences=torch.zeros(size, 4), info={}) for size in sizes]
        update_samples_with_rewards([answer], samples)
    got = torch.cat([s.rewards for s in samples]).tolist()
    assert got == pytest.approx(want, abs=1e-6)


def test_openrlhf_0_8_a_bad_dataset_row_costs_only_its_sample(reward: QACEReward, url: str) -> None:
    """A label that cannot be read (null, ``[]``, ``[""]``, a number, a broken JSON list) made the whole
    request 422, so 0.8's client raised after its tries and the step was lost; now only its sample is
    invalid, and the others get their rewards."""
    labels = [json.dumps(REFS), None, "[]", '[""]', 7, '["a', REFS]
    n = len(labels)
    with openrlhf("0.8"):
        from openrlhf.utils.remote_rm_utils import request_api_wrapper

        data = {"query": [PROMPT + CAPTIONS[0] + "</s>"] * n, "prompts": [PROMPT] * n, "labels": labels}
        answer = request_api_wrapper(url, data, try_max_times=1)
    want = reward([CAPTIONS[0]], references=[REFS]).item()
    assert answer["rewards"] == pytest.approx([want, 0, 0, 0, 0, 0, want], abs=1e-6)


def test_openrlhf_an_empty_completion_without_its_prompt_gets_no_reward(reward: QACEReward, url: str) -> None:
    """Without its prompt (null, empty) a query was scored whole, and the prompt's words earned an empty
    completion a reward; without ``prompts`` at all the request is refused (0.8's client raises)."""
    empty = PROMPT + "</s>"
    assert reward([empty.removesuffix("</s>")], references=[REFS]).item() > 0  # what scoring it whole gave
    with openrlhf("0.8"):
        from openrlhf.utils.remote_rm_utils import request_api_wrapper

        data = {"query": [empty] * 4, "prompts": [None, "", " ", PROMPT], "labels": [REFS] * 4}
        assert request_api_wrapper(url, data, try_max_times=1)["rewards"] == [0.0] * 4
        with pytest.raises(Exception, match="Request error for 1 times"):
            request_api_wrapper(url, {"query": [empty], "labels": [REFS]}, try_max_times=1)


@pytest.fixture(scope="module")
def t5(test_models_dir: Path) -> Any:
    """A real T5 (SentencePiece) tokenizer: the test models', as a T5 policy would have."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(test_models_dir / "qg")


@pytest.fixture(scope="module")
def url_t5(reward: QACEReward, t5: Any) -> Iterator[str]:
    """The service told the policy's tokenizer (``qace serve --tokenizer``)."""
    with serving(create_app(reward, token=TOKEN, tokenizer=t5), start_timeout_s=10) as base:
        yield f"{base}/t/{TOKEN}/get_reward?extra_logs=1"


def test_openrlhf_0_11_with_a_t5_policy_an_empty_completion_is_invalid(
    reward: QACEReward, url: str, t5: Any
) -> None:
    """T5 decodes ``"Describe the image: "`` as ``"Describe the image:</s>"`` after an empty completion (no
    trailing space): still the prompt, so the caption is empty and invalid. So are completions of only
    zero-width or control characters (T5 spells them ``<unk>``), with or without the tokenizer."""
    caption = "a girl runs on the beach"
    assert (
        t5.decode(t5(PROMPT, add_special_tokens=False)["input_ids"] + [t5.eos_token_id])
        == PROMPT.rstrip() + "</s>"
    )
    with openrlhf("0.11"):
        experiences = _rollouts_0_11(
            url + "?extra_logs=1", ["", caption, "\u200b\u200b", "\x07"], tokenizer=t5
        )
    want = reward([caption], references=[REFS]).item()
    assert [e.rewards.item() for e in experiences] == pytest.approx([0.0, want, 0.0, 0.0], abs=1e-6)
    assert [e.info["qace_valid"].item() for e in experiences] == [0.0, 1.0, 0.0, 0.0]


def test_openrlhf_prompts_matched_as_the_policy_tokenizer_decodes_them(
    reward: QACEReward, url: str, url_t5: str, t5: Any
) -> None:
    """A prompt with characters T5 cannot spell comes back with ``<unk>`` in them: without the tokenizer no
    query matches (invalid, never scored whole with the prompt's words); with it, each is cut where the
    policy's completion starts."""
    prompt = "Caption «this» image — briefly:  "
    caption = "a girl runs on the beach"
    assert "<unk>" in t5.decode(t5(prompt, add_special_tokens=False)["input_ids"])
    with openrlhf("0.11"):
        without = _rollouts_0_11(url + "?extra_logs=1", ["", caption], tokenizer=t5, prompt=prompt)
        told = _rollouts_0_11(url_t5, ["", caption], tokenizer=t5, prompt=prompt)
    want = reward([caption], references=[REFS]).item()
    assert [e.rewards.item() for e in without] == [0.0, 0.0]
    assert [e.info["qace_valid"].item() for e in without] == [0.0, 0.0]
    assert [e.rewards.item() for e in told] == pytest.approx([0.0, want], abs=1e-6)
    assert [e.info["qace_valid"].item() for e in told] == [0.0, 1.0]


def test_openrlhf_0_8_during_warm_up_is_held_not_refused(reward: QACEReward) -> None:
    """A request during the warm-up waits for it: with one try, a 503 would have raised."""
    done = threading.Event()
    app = create_app(types.SimpleNamespace(score=reward.score, variant="ref", signature=reward.signature,
                                           warm_up=lambda: done.wait(10)),
                     token=TOKEN, warm_up=True, settings=ServeSettings())  # fmt: skip
    with openrlhf("0.8"), serving(app, start_timeout_s=10) as base:
        from openrlhf.utils.remote_rm_utils import request_api_wrapper

        timer = threading.Timer(1.5, done.set)
        timer.start()
        data = {"query": [PROMPT + CAPTIONS[0]], "prompts": [PROMPT], "labels": [REFS]}
        answer = request_api_wrapper(f"{base}/t/{TOKEN}/get_reward", data, try_max_times=1)
        timer.join()
    want = reward([CAPTIONS[0]], references=[REFS]).tolist()
    assert done.is_set() and answer["rewards"] == pytest.approx(want, abs=1e-6)


def test_openrlhf_without_the_path_token_is_refused(url: str) -> None:
    """OpenRLHF sends no header: without the token in the URL it gets 401 (and gives up after its retries)."""
    with openrlhf("0.8"):
        from openrlhf.utils.remote_rm_utils import request_api_wrapper

        data = {"query": [PROMPT + CAPTIONS[0]], "prompts": [PROMPT], "labels": [REFS]}
        with pytest.raises(Exception, match="Request error for 1 times"):
            request_api_wrapper(url.replace(f"/t/{TOKEN}", ""), data, try_max_times=1)


def test_scripts_wait_for_the_service_with_qace_health(reward: QACEReward, capsys) -> None:
    """Before the service listens, 0.8 raises (0.11 would train on ``reward=None``); ``qace health URL
    --wait`` waits out the closed port (models loading) and the warm-up's 503, then 0.8's client gets
    rewards with a single try."""
    from qace.cli import main

    with socket.socket() as probe:  # a free loopback port, closed again
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}/t/{TOKEN}/get_reward"
    data = {"query": [PROMPT + CAPTIONS[0]], "prompts": [PROMPT], "labels": [REFS]}
    with openrlhf("0.8"):
        from openrlhf.utils.remote_rm_utils import request_api_wrapper

        with pytest.raises(Exception, match="Request error for 1 times"):
            request_api_wrapper(url, data, try_max_times=1)
        assert main(["health", url]) == 2 and "unreachable" in capsys.readouterr().err
        polled, warmed = threading.Event(), threading.Event()
        real_get = httpx.get

        def get(*args: Any, **kwargs: Any) -> Any:
            try:
                return real_get(*args, **kwargs)
            finally:
                polled.set()

        warming = types.SimpleNamespace(
            score=reward.score, variant="ref", signature=reward.signature, warm_up=lambda: warmed.wait(10)
        )
        app = create_app(warming, token=TOKEN, warm_up=True)
        with ThreadPoolExecutor(1) as pool, mock.patch("httpx.get", get):
            waiting = pool.submit(main, ["health", url, "--wait", "--timeout", "60"])
            assert polled.wait(10) and not waiting.done()  # it met the closed port and waits on
            with serving(app, start_timeout_s=10, port=port):
                polled.clear()
                assert polled.wait(10) and not waiting.done()  # it met 503 warming_up and waits on
                warmed.set()
                assert waiting.result(timeout=30) == 0
                answer = request_api_wrapper(url, data, try_max_times=1)
    assert json.loads(capsys.readouterr().out)["status"] == "ok"
    assert answer["rewards"] == pytest.approx(reward([CAPTIONS[0]], references=[REFS]).tolist(), abs=1e-6)
