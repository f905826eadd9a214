"""Shared judge fixtures: the tiny test VLM and small drawn images. Keep this file small."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def test_vlm_dir() -> Path:
    """The tiny LLaVA-style VLM, built once and cached (QACE_TEST_VLM or .qace-cache/test-vlm)."""
    from qace.testing.vlm import make_test_vlm

    return make_test_vlm(os.environ.get("QACE_TEST_VLM") or REPO_ROOT / ".qace-cache" / "test-vlm")


@pytest.fixture(scope="session")
def drawn_images(tmp_path_factory) -> dict[str, Path]:
    """Three small scenes (PNG and JPEG, several sizes), drawn with Pillow, plus a copy of one."""
    from PIL import Image, ImageDraw

    root = tmp_path_factory.mktemp("drawn")
    out = {}
    for name, sky, ground, size, suffix in [
        ("beach", "#87ceeb", "#e8d193", (64, 48), ".png"),
        ("park", "#9fd3f0", "#4caf50", (40, 60), ".jpg"),
        ("night", "#101040", "#303030", (50, 50), ".png"),
    ]:
        image = Image.new("RGB", size, sky)
        draw = ImageDraw.Draw(image)
        draw.rectangle((0, size[1] // 2, size[0], size[1]), fill=ground)
        draw.ellipse((size[0] // 3, size[1] // 4, size[0] // 2, size[1] // 2), fill="#d01c1c")
        out[name] = root / f"{name}{suffix}"
        image.save(out[name])
    out["beach_copy"] = root / "beach_copy.png"
    out["beach_copy"].write_bytes(out["beach"].read_bytes())
    return out
