"""Shared test helpers: where the shared data lives and small record builders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qace.data.records import Record

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


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
