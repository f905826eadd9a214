"""The one rule every feature store matches image ids by (`IdIndex`): exactly as stored first, then in
canonical form (`canonical_id`).

So a COCO id ``391895``, ``"000000391895"``, ``COCO_val2014_000000391895`` and a file name or path
``val2014/COCO_val2014_000000391895.jpg`` all find the same image, and a Flickr ``1000092795.jpg`` finds
``1000092795``, whether the store is a published file, an ``.npz`` folder or qace's own HDF5 store. Two
stored ids with one canonical form (say the same number in two COCO splits) are found only by their
exact names.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable

from qace.errors import FeatureError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp", ".tif", ".tiff", ".npz")
_COCO_NAME = re.compile(r"^COCO_[A-Za-z]+\d{4}_(\d+)$")


def canonical_id(image_id: object) -> str:
    """The form ids are matched in: a path's file stem, COCO names and zero-padded numbers as the bare
    number (``COCO_val2014_000000391895`` -> ``391895``), anything else as written. Only ASCII digits are
    a number (``²`` and ``①`` stay as written), and a number of any length is handled as text."""
    text = os.path.basename(str(image_id).strip().replace("\\", "/"))
    stem, ext = os.path.splitext(text)
    if ext.lower() in IMAGE_EXTENSIONS:
        text = stem
    match = _COCO_NAME.match(text)
    if match:
        text = match.group(1)
    if text.isascii() and text.isdigit():
        return text.lstrip("0") or "0"
    return text


class IdIndex:
    """A store's ids, looked up exactly first and then by `canonical_id`; ``where`` names the store in
    the error of an id it does not hold."""

    def __init__(self, stored: Iterable[str], where: str) -> None:
        self.where = where
        self.stored = list(stored)
        self._exact = set(self.stored)
        canon: dict[str, str | None] = {}
        for key in self.stored:
            c = canonical_id(key)
            canon[c] = key if c not in canon else None  # None: ambiguous, exact names only
        self._canon = {c: k for c, k in canon.items() if k is not None}

    def __len__(self) -> int:
        return len(self.stored)

    def find(self, image_id: object) -> str | None:
        """The stored id ``image_id`` matches, or None."""
        text = str(image_id)
        if text in self._exact:
            return text
        return self._canon.get(canonical_id(text))

    def key(self, image_id: object) -> str:
        """The stored id ``image_id`` matches; `FeatureError` (`missing`) when none does."""
        found = self.find(image_id)
        if found is None:
            raise self.missing(image_id)
        return found

    def missing(self, image_id: object, why: str = "") -> FeatureError:
        """The error of an id this store does not hold; ``why`` adds what is known of the reason."""
        examples = ", ".join(repr(k) for k in self.stored[:3])
        return FeatureError(
            f"no region features for image {str(image_id)!r} (matched as {canonical_id(image_id)!r}) in "
            f"{self.where}{why}; its ids look like {examples or 'nothing: it is empty'}"
        )
