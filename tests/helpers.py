"""Shared test helpers: where the shared data lives and small record builders."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from qace.data.records import Record

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


def run_benchmark(module: str, argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``python -m benchmarks.<module> ARGV`` from the checkout, as a user runs it: in a process of its own,
    so what it starts in its interpreter (a Ray driver and Ray Data's threads) ends with it and never
    reaches the tests that run after it in pytest's process."""
    return subprocess.run(
        [sys.executable, "-m", f"benchmarks.{module}", *argv], cwd=REPO, capture_output=True, text=True
    )


def flickr_records(n: int, refs: int = 5) -> list[Record]:
    """The first ``n`` Flickr8k-Expert candidates with up to ``refs`` references each (skips if absent)."""
    folder = SHARED_DATA / "flickr8k_expert"
    if not folder.is_dir():
        pytest.skip(f"shared data not found at {folder}")
    candidates = json.loads((folder / "candidates.json").read_text())
    references: dict[str, list[str]] = {}
    for entry in json.loads((folder / "refs.json").read_text()):
        captions = references.setdefault(entry["image_id"], [])
        if entry["caption"] not in captions:
            captions.append(entry["caption"])
    return [
        Record(str(i), c["caption"], c["image_id"], tuple(references[c["image_id"]][:refs]))
        for i, c in enumerate(candidates[:n])
    ]


def random_regions(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """36 random region features (2,048 values) and well-formed normalised boxes
    ``(x1, y1, x2, y2, w, h)`` inside the image, as the box rule requires."""
    rng = np.random.default_rng(seed)
    corner = rng.uniform(0.0, 0.5, size=(36, 2))
    size = rng.uniform(0.05, 0.5, size=(36, 2))
    boxes = np.concatenate([corner, corner + size, size], axis=1)
    return rng.random((36, 2048), dtype=np.float32), boxes


def kill_in_chunk(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    """Make the ``n``-th chunk a scorer scores from now on raise KeyboardInterrupt, as a kill mid-run
    would (the chunks before it are committed); ``monkeypatch.undo()`` ends it."""
    from qace import api

    real, calls = api.score_chunk, {"n": 0}

    def dying(*args: object, **kwargs: object) -> object:
        calls["n"] += 1
        if calls["n"] == n:
            raise KeyboardInterrupt("killed")
        return real(*args, **kwargs)

    monkeypatch.setattr(api, "score_chunk", dying)
