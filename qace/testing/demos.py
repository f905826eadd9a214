"""The scorers ``qace demo --metric`` runs (named by the registry, `qace.scorers`): each judge with its
real models when they can be loaded, else with its tiny test models, built on demand under
`test_models_home` (``uses_test_models`` on the scorer says which; the demo warns loudly).

Without ``download`` the real models come only from the local cache: the hub is not asked, and the
process's ``HF_HUB_OFFLINE`` is as it was once the scorer is built.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from qace.errors import ModelNotFoundError
from qace.testing.home import test_models_home

log = logging.getLogger(__name__)


@contextmanager
def _offline(offline: bool) -> Iterator[None]:
    """``HF_HUB_OFFLINE=1`` inside the block when ``offline`` (no waiting on network retries for models
    that are not cached); the variable is restored after it."""
    previous = os.environ.get("HF_HUB_OFFLINE")
    if offline:
        os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = previous


def real_or_test(real: Callable[[], Any], test: Callable[[], Any], what: str, *, download: bool) -> Any:
    """``real()`` (offline unless ``download``), or ``test()`` when its models are not available."""
    try:
        with _offline(not download):
            return real()
    except ModelNotFoundError as exc:
        log.warning("the default %s not available here (%s)", what, str(exc).splitlines()[0][:200])
    return test()


def visce2_demo(*, device: str = "cpu", download: bool = False) -> Any:
    """VisCE² with the default VLM if loadable, else the tiny test VLM."""
    from qace.judges.visce2 import VisCE2
    from qace.testing.vlm import make_test_vlm

    settings: dict[str, Any] = {"device": device, "explain": True, "expected": True, "chunk_size": 64}
    return real_or_test(
        lambda: VisCE2(**settings),
        lambda: VisCE2(
            model=str(make_test_vlm(test_models_home() / "visce2-vlm")), context_tokens=64, **settings
        ),
        "VLM is",
        download=download,
    )


def regen_demo(*, device: str = "cpu", download: bool = False) -> Any:
    """The regeneration score with the default models if loadable, else the tiny test models."""
    from qace.judges.regen import RegenScore
    from qace.testing.regen import make_regen_test_models

    settings: dict[str, Any] = {"device": device, "save_images": None, "chunk_size": 16}

    def test() -> RegenScore:
        models = make_regen_test_models(test_models_home() / "regen")
        generator, encoder = str(models / "generator"), str(models / "encoder")
        return RegenScore(generator=generator, image_encoder=encoder, size=32, steps=2, **settings)

    return real_or_test(lambda: RegenScore(**settings), test, "regeneration models are", download=download)


def _clip_demo(family: str, references: bool, device: str, download: bool) -> Any:
    """A CLIP score with ViT-B/32 if loadable (CLIP-S, RefCLIP-S), else the tiny test CLIP (PAC-S has no
    default checkpoint: always the test CLIP)."""
    from qace.judges.clip import ClipScore
    from qace.testing.clip import make_clip_test_model

    settings: dict[str, Any] = {
        "device": device,
        "family": family,
        "references": references,
        "chunk_size": 64,
    }

    def test() -> ClipScore:
        return ClipScore(model=str(make_clip_test_model(test_models_home() / "clip")), **settings)

    if family == "pac":
        return test()
    return real_or_test(lambda: ClipScore(**settings), test, "CLIP model is", download=download)


def clip_s_demo(*, device: str = "cpu", download: bool = False) -> Any:
    """CLIP-S (see `_clip_demo`)."""
    return _clip_demo("clip", False, device, download)


def refclip_s_demo(*, device: str = "cpu", download: bool = False) -> Any:
    """RefCLIP-S (see `_clip_demo`)."""
    return _clip_demo("clip", True, device, download)


def pac_s_demo(*, device: str = "cpu", download: bool = False) -> Any:
    """PAC-S on the test CLIP (see `_clip_demo`)."""
    return _clip_demo("pac", False, device, download)


def refpac_s_demo(*, device: str = "cpu", download: bool = False) -> Any:
    """RefPAC-S on the test CLIP (see `_clip_demo`)."""
    return _clip_demo("pac", True, device, download)
