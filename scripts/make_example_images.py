"""Draw the four small scenes of the bundled example (qace/examples/images/*.png) with Pillow.

Run once; the PNGs are committed (a few KB each). Simple, plausible scenes, so the captions of
qace/examples/captions.jsonl have something to be right or wrong about:

    .venv/bin/python scripts/make_example_images.py
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from PIL import Image, ImageDraw

SIZE = (320, 240)
OUT = Path(__file__).resolve().parent.parent / "qace" / "examples" / "images"


def _person(d: ImageDraw.ImageDraw, x: int, y: int, body: str, skin: str = "#e0ac69", h: int = 60) -> None:
    """A stick-ish person standing with feet at (x, y): head, dress/body, legs."""
    d.ellipse((x - 7, y - h, x + 7, y - h + 14), fill=skin)
    d.polygon([(x, y - h + 14), (x - 14, y - 18), (x + 14, y - 18)], fill=body)
    d.line((x - 5, y - 18, x - 8, y), fill=skin, width=3)
    d.line((x + 5, y - 18, x + 9, y), fill=skin, width=3)
    d.line((x - 6, y - h + 22, x - 18, y - h + 34), fill=skin, width=3)
    d.line((x + 6, y - h + 22, x + 18, y - h + 30), fill=skin, width=3)


def beach(d: ImageDraw.ImageDraw) -> None:
    """A girl in a red dress running on a sandy beach by the sea, sun in the sky."""
    d.rectangle((0, 0, 320, 110), fill="#87ceeb")
    d.ellipse((250, 15, 290, 55), fill="#ffd700")
    d.rectangle((0, 110, 320, 150), fill="#1e6fa8")
    for x in range(0, 320, 40):
        d.arc((x, 140, x + 40, 160), 180, 360, fill="white", width=2)
    d.rectangle((0, 150, 320, 240), fill="#e8d193")
    _person(d, 150, 215, body="#d01c1c")


def dog(d: ImageDraw.ImageDraw) -> None:
    """A brown dog jumping for a yellow frisbee over the grass of a park, trees behind."""
    d.rectangle((0, 0, 320, 140), fill="#9fd3f0")
    for x in (30, 110, 270):
        d.rectangle((x + 12, 80, x + 20, 140), fill="#6b4423")
        d.ellipse((x - 5, 40, x + 37, 95), fill="#2e7d32")
    d.rectangle((0, 140, 320, 240), fill="#4caf50")
    d.ellipse((120, 120, 200, 160), fill="#8b5a2b")  # body
    d.ellipse((185, 100, 220, 130), fill="#8b5a2b")  # head
    d.polygon([(190, 105), (196, 92), (202, 106)], fill="#5d3a1a")  # ear
    for x0, x1 in ((130, 118), (145, 140), (175, 180), (190, 200)):
        d.line((x0, 150, x1, 178), fill="#8b5a2b", width=6)
    d.line((122, 135, 100, 120), fill="#8b5a2b", width=5)  # tail
    d.ellipse((215, 78, 255, 90), fill="#ffeb3b")  # frisbee


def bike(d: ImageDraw.ImageDraw) -> None:
    """A man in a blue jacket riding a bicycle down a city street, buildings and a car behind."""
    d.rectangle((0, 0, 320, 240), fill="#b0bec5")
    for x, h, c in ((0, 120, "#795548"), (70, 160, "#90a4ae"), (150, 100, "#a1887f"), (230, 140, "#78909c")):
        d.rectangle((x, 170 - h, x + 70, 170), fill=c)
        for wy in range(170 - h + 10, 160, 22):
            for wx in range(x + 8, x + 62, 18):
                d.rectangle((wx, wy, wx + 10, wy + 12), fill="#fff59d")
    d.rectangle((0, 170, 320, 240), fill="#424242")
    d.line((0, 205, 320, 205), fill="white", width=3)
    d.rounded_rectangle((230, 160, 310, 195), radius=8, fill="#c62828")  # car
    d.ellipse((240, 185, 258, 203), fill="black")
    d.ellipse((285, 185, 303, 203), fill="black")
    for cx in (100, 160):  # bicycle
        d.ellipse((cx - 20, 190, cx + 20, 230), outline="black", width=3)
    d.line((100, 210, 130, 185, 160, 210, 125, 210, 100, 210), fill="#1565c0", width=3)
    d.ellipse((120, 128, 136, 144), fill="#e0ac69")  # head
    d.ellipse((119, 124, 137, 134), fill="#263238")  # helmet
    d.polygon([(122, 144), (138, 144), (135, 182), (120, 182)], fill="#1976d2")  # blue jacket
    d.line((128, 182, 135, 210), fill="#37474f", width=5)


def kitchen(d: ImageDraw.ImageDraw) -> None:
    """Two women cooking at a stove in a bright kitchen, a pot and vegetables on the counter."""
    d.rectangle((0, 0, 320, 240), fill="#fff3e0")
    d.rectangle((20, 20, 100, 80), fill="#bbdefb", outline="#8d6e63", width=4)  # window
    d.rectangle((0, 150, 320, 240), fill="#8d6e63")  # counter front
    d.rectangle((0, 140, 320, 152), fill="#d7ccc8")  # counter top
    d.rectangle((130, 140, 210, 240), fill="#9e9e9e")  # stove
    d.ellipse((140, 132, 165, 144), fill="#212121")
    d.rectangle((170, 112, 205, 140), fill="#607d8b")  # pot
    d.ellipse((40, 128, 60, 142), fill="#e53935")  # tomato
    d.ellipse((62, 130, 90, 142), fill="#43a047")  # cucumber
    _person(d, 110, 140, body="#7b1fa2", h=70)
    _person(d, 240, 140, body="#00897b", skin="#8d5524", h=72)


SCENES: dict[str, Callable[[ImageDraw.ImageDraw], None]] = {
    "beach": beach,
    "dog": dog,
    "bike": bike,
    "kitchen": kitchen,
}


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, draw in SCENES.items():
        image = Image.new("RGB", SIZE, "white")
        draw(ImageDraw.Draw(image))
        path = OUT / f"{name}.png"
        image.save(path, optimize=True)
        print(f"{path} ({path.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
