"""Devices bound to their index, and one lock per device."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from types import SimpleNamespace

import pytest
import torch

from qace.engine.device_lock import bound_device, device_lock
from qace.engine.torch_runner import TorchRunner
from qace.kernels.bertscore import _resolve_device


def test_cuda_is_bound_to_the_device_current_where_it_is_named(monkeypatch) -> None:
    """``cuda`` names the device current when a model is built (here, after ``set_device(1)``), not the
    one current in whichever thread later runs it; an index or the CPU is kept as given."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert bound_device("cuda") == torch.device("cuda", 1)
    assert bound_device("cuda:0") == torch.device("cuda", 0)
    assert bound_device("cpu") == torch.device("cpu")
    assert device_lock("cuda") is device_lock("cuda:1") is not device_lock("cuda:0")
    parts = SimpleNamespace(encoder=None, decoder=None)
    assert TorchRunner(None, parts, device="cuda").device == torch.device("cuda", 1)  # type: ignore[arg-type]
    assert _resolve_device("cuda") == torch.device("cuda", 1)  # BERTScore's encoder


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_a_scorer_built_after_set_device_runs_from_a_new_thread(test_models_dir) -> None:
    """Built with ``device="cuda"`` after ``set_device(1)``, a scorer is on cuda:1; a thread started
    later (current device 0) scores with it as the building thread does."""
    from qace.api import QACE

    kwargs = dict(models=test_models_dir, progress=False, spacy_workers=0, host_workers=0)
    captions, refs = ["a dog runs on the grass"] * 3, [["a brown dog running in a field"]] * 3
    torch.cuda.set_device(1)
    try:
        scorer = QACE(device="cuda", **kwargs)
        here = scorer.score(captions, references=refs)
    finally:
        torch.cuda.set_device(0)
    there: list[list[dict]] = []
    thread = threading.Thread(target=lambda: there.append(scorer.score(captions, references=refs)))
    thread.start()
    thread.join()
    assert scorer.models.qg.device == torch.device("cuda", 1)
    assert [r["qace"] for r in there[0]] == [r["qace"] for r in here]


def test_a_runner_makes_its_device_current_for_its_own_calls(monkeypatch) -> None:
    """`generate` (the profiled and one-batch path) and `warm_up` run with the runner's device current,
    so kernels that launch on the current device (Triton's) run where the weights are; the streamed
    path gets it from its streams."""
    inside: list[object] = []

    @contextlib.contextmanager
    def device(dev: torch.device) -> Iterator[None]:
        inside.append(dev)
        try:
            yield
        finally:
            inside.pop()

    seen: dict[str, list[object]] = {}

    def note(name: str, result: object = None) -> Callable[..., object]:
        def call(*args: object, **kwargs: object) -> object:
            seen[name] = list(inside)
            return result

        return call

    monkeypatch.setattr(torch.cuda, "device", device)
    parts = SimpleNamespace(encoder=SimpleNamespace(warm_up=note("encoder.warm_up")), decoder=None)
    parts.decoder = SimpleNamespace(warm_up=note("decoder.warm_up", 0))
    runner = TorchRunner(None, parts, device="cuda:1")  # type: ignore[arg-type]
    monkeypatch.setattr(runner, "encode", note("encode", (None, None)))
    monkeypatch.setattr(runner, "_decode", note("_decode", SimpleNamespace(result=lambda: None)))
    runner.generate(None, max_new_tokens=4)  # type: ignore[arg-type]
    runner.warm_up([(8, 16)], max_new_tokens=4)
    calls = ("encode", "_decode", "encoder.warm_up", "decoder.warm_up")
    assert seen == {name: [torch.device("cuda", 1)] for name in calls}
    assert inside == []
