"""Shared judge fixtures: small drawn images (the tiny test VLM is the root conftest's). Keep this file
small."""

from __future__ import annotations

from pathlib import Path

import pytest


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
