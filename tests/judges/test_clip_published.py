"""The CLIPScore paper's numbers, for a user with the real ViT-B/32 weights and the benchmark images
(``pytest -m real_models tests/judges/test_clip_published.py``; skipped without them):

- ``QACE_FLICKR8K_IMAGES``: the Flickr8k images (``Flicker8k_Dataset/``), named by image id;
- ``QACE_PASCAL50S_IMAGES``: the PASCAL-50S images, named by image id;
- ``QACE_CLIP_MODEL`` (optional): the checkpoint, default ``openai/clip-vit-base-patch32`` from the
  Hugging Face cache; ``QACE_DEVICE`` (optional, default cpu).

Published (Hessel et al., 2021): Flickr8k-Expert Kendall tau-c x 100 CLIP-S 51.2, RefCLIP-S 53.0;
PASCAL-50S accuracy, 5 sampled references, `qace.meta.report.PUBLISHED`. Transformers' CLIP and its
tokenizer stand in for the release's ``clip`` package, so small differences remain: 1 point allowed.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from qace.judges.clip import DEFAULT_CLIP

pytestmark = pytest.mark.real_models
TOLERANCE = 1.0
"""Points (tau-c x 100, accuracy %) our numbers may differ from the paper's."""


def _report(dataset: str, images_variable: str, cache: Path) -> dict:
    images = os.environ.get(images_variable)
    if not images:
        pytest.skip(f"set {images_variable} to the {dataset} images to check the published numbers")
    from qace.errors import ModelNotFoundError
    from qace.meta.report import ReportConfig, build_report

    model = os.environ.get("QACE_CLIP_MODEL", DEFAULT_CLIP)
    config = ReportConfig(
        metrics=(), pascal_metrics=(), n_boot=0, datasets=(dataset,), scorers=("clip-s", "refclip-s"),
        images=Path(images), scorer_settings=(("model", model),), cache_dir=cache,
        device=os.environ.get("QACE_DEVICE", "cpu"),
    )  # fmt: skip
    try:
        report, _ = build_report(config)
    except ModelNotFoundError as exc:
        pytest.skip(f"no real CLIP weights here: {str(exc).splitlines()[0][:200]}")
    return report


def test_flickr8k_expert_tau_c_is_the_paper_s(tmp_path: Path) -> None:
    from qace.meta.report import PUBLISHED

    metrics = _report("flickr8k", "QACE_FLICKR8K_IMAGES", tmp_path)["flickr8k_expert"]["metrics"]
    for name in ("clip-s", "refclip-s"):
        tau = 100 * metrics[name]["correlations"]["kendall_c"]["value"]
        assert tau == pytest.approx(PUBLISHED["flickr8k_tau_c"][name], abs=TOLERANCE), name


def test_pascal50s_accuracy_is_the_paper_s(tmp_path: Path) -> None:
    from qace.meta.report import PUBLISHED

    accuracy = _report("pascal50s", "QACE_PASCAL50S_IMAGES", tmp_path)["pascal50s"]["accuracy"]
    for name in ("clip-s", "refclip-s"):
        for category, published in PUBLISHED["pascal50s"][name].items():
            ours = accuracy[name]["mean"][category]
            assert ours == pytest.approx(published, abs=TOLERANCE), (name, category)
