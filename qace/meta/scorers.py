"""Score the benchmark captions with QACE itself or another registered metric (``qace meta report
--with-scorers``, `qace.scorers`), cached.

A :class:`ScorerRun` builds the scorer once, on first use, through its registry entry, and keeps its
per-caption scores on disk keyed by the scorer's signature (models, variant, settings) and the exact
inputs, like the baseline cache, so a second report reads them instead of re-running the models.
QACE-Ref reads each caption's references; QACE-Img reads the region features of its image instead (a
feature store named with ``features``), so its scores do not depend on the sampled references. Metrics
that read image files (CLIP-S, RefCLIP-S, VisCE², ...) get each caption's image from ``images``, a
folder, list or records file of the benchmark images named by image id (the data sets carry ids, not
files), and the references too (RefCLIP-S reads them); ``settings`` are their keyword arguments
(``model=DIR``).
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from qace import scorers
from qace.errors import ConfigError
from qace.meta.baselines import default_cache_dir

logger = logging.getLogger(__name__)


DATA_SET_CONTEXTS = ("references", "image_id", "image", None)
"""What the benchmark data sets give a caption: references and an image id (image files through
``images``)."""


def scorer_names() -> list[str]:
    """The registered metrics (`qace.scorers`) that can score the benchmark data sets."""
    return [name for name in scorers.names() if scorers.get(name).reads in DATA_SET_CONTEXTS]


def check_scorers(
    names: Sequence[str], features: str | Path | None, images: str | Path | None = None
) -> None:
    """Refuse unknown scorer names, QACE-Img without features and image readers without images, before
    any model loads."""
    known = scorer_names()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ConfigError(f"unknown scorer(s) {unknown}; choose from {known}")
    readers = [n for n in names if scorers.get(n).reads == "image"]
    if readers and (images is None or not Path(images).exists()):
        raise ConfigError(
            f"{', '.join(readers)} read the benchmark images: pass --images, a folder (or list file) of "
            "the data set's image files named by image id" + (f"; {images} does not exist" if images else "")
        )
    if "qace-img" in names and features is None:
        raise ConfigError(
            "qace-img needs the region features of the benchmark images: pass --features "
            "(a folder of per-image .npz files or an HDF5 store keyed by image id)"
        )


class ScorerRun:
    """One registered metric, built lazily through its registry entry, with a disk cache of its
    per-caption scores."""

    def __init__(
        self,
        name: str,
        *,
        models: str | Path | None = None,
        features: str | Path | None = None,
        device: str = "cpu",
        cache_dir: Path | str | None = None,
        use_cache: bool = True,
        images: str | Path | None = None,
        settings: dict[str, Any] | None = None,
    ) -> None:
        check_scorers([name], features, images)
        self.name = name
        self.entry = scorers.get(name)
        self.reads_images = self.entry.reads == "image"
        if self.reads_images:
            given: dict[str, Any] = dict(settings or {})
        else:  # QACE's settings
            given = {"models": models, "features": features}
        self.settings = {key: value for key, value in given.items() if value is not None}
        self.images = images
        self.device = device
        folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.cache = folder if use_cache else None
        self._scorer: Any = None

    def _files(self, image_ids: Sequence[str]) -> list[str | None]:
        """The image file of each image id (as written, or its stem) in ``images``; None where absent."""
        from qace.features.extract import gather_images

        index = {item.key: item.path for item in gather_images(str(self.images))}
        return [index.get(i) or index.get(Path(i).stem) for i in image_ids]

    @property
    def reference_free(self) -> bool:
        return self.entry.reads != "references"

    @property
    def scorer(self) -> Any:
        """The scorer (built on first use)."""
        if self._scorer is None:
            self._scorer = self.entry.build(self.device, progress=False, **self.settings)
            if self._scorer.uses_test_models:
                logger.warning("%s runs on qace's TINY TEST MODELS: its scores mean nothing", self.name)
        return self._scorer

    @property
    def uses_test_models(self) -> bool:
        return bool(self._scorer is not None and self._scorer.uses_test_models)

    def score(
        self,
        ids: Sequence[str],
        candidates: Sequence[str],
        references: Sequence[Sequence[str]],
        image_ids: Sequence[str],
    ) -> np.ndarray:
        """Per-caption score (the metric's score column), NaN where the scorer refused a caption."""
        from qace.data.records import Record, RecordError

        reads = self.entry.reads
        refs = [list(r) for r in references] if reads in ("references", "image") else None
        images = list(image_ids) if reads in ("image_id", "image") else None
        files = self._files(images) if self.reads_images and images is not None else None
        key = [self.scorer.signature, list(ids), list(candidates), refs, images, files]
        h = hashlib.sha256(json.dumps(key).encode())
        path = self.cache / f"{self.name}-{h.hexdigest()[:20]}.npy" if self.cache else None
        if path is not None and path.exists():
            return np.load(path)
        logger.info("%s: scoring %d captions", self.name, len(candidates))
        records = [
            Record(
                str(i),
                c,
                None if images is None else str(images[n]),
                None if refs is None else tuple(refs[n]),
                None if files is None else files[n],
            )
            for n, (i, c) in enumerate(zip(ids, candidates, strict=True))
        ]
        rows = list(self.scorer.score_records(records))
        failed = [r for r in rows if isinstance(r, RecordError)]
        if failed:
            logger.warning(
                "%s could not score %d captions (first: %s: %s)",
                self.name,
                len(failed),
                failed[0].id,
                failed[0].reason,
            )
        key_col = self.scorer.score_key
        values = np.array(
            [np.nan if isinstance(r, RecordError) else r.get(key_col, np.nan) for r in rows], dtype=float
        )
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            np.save(path, values)
        return values
