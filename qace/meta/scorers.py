"""Score the benchmark captions with QACE itself (``qace meta report --with-scorers``), cached.

A :class:`ScorerRun` builds the scorer once, on first use, and keeps its per-caption scores on
disk keyed by the scorer's signature (models, variant, settings) and the exact inputs, like the
baseline cache, so a second report reads them instead of re-running the models. QACE-Ref reads
each caption's references; QACE-Img reads the region features of its image instead (a feature
store named with ``features``), so its scores do not depend on the sampled references.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from qace.errors import ConfigError
from qace.meta.baselines import default_cache_dir

logger = logging.getLogger(__name__)


def scorer_variants() -> dict[str, str]:
    """``{"qace-ref": "ref", "qace-img": "img"}``: scorer name (as ``qace score --metric``) to variant."""
    from qace.config import VARIANT_NAMES

    return {name.lower(): variant for variant, name in VARIANT_NAMES.items()}


def check_scorers(names: Sequence[str], features: str | Path | None) -> None:
    """Refuse unknown scorer names and QACE-Img without features, before any model loads."""
    variants = scorer_variants()
    unknown = [n for n in names if n not in variants]
    if unknown:
        raise ConfigError(f"unknown scorer(s) {unknown}; choose from {list(variants)}")
    if "qace-img" in names and features is None:
        raise ConfigError("qace-img needs the region features of the benchmark images: pass --features "
                          "(a folder of per-image .npz files or an HDF5 store keyed by image id)")


class ScorerRun:
    """One QACE variant, built lazily, with a disk cache of its per-caption scores."""

    def __init__(self, name: str, *, models: str | Path | None = None, features: str | Path | None = None,
                 device: str = "cpu", cache_dir: Path | str | None = None, use_cache: bool = True) -> None:
        check_scorers([name], features)
        self.name = name
        self.variant = scorer_variants()[name]
        self.models, self.features, self.device = models, features, device
        folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.cache = folder if use_cache else None
        self._scorer: Any = None

    @property
    def reference_free(self) -> bool:
        return self.variant == "img"

    @property
    def scorer(self) -> Any:
        """The :class:`qace.api.QACE` scorer (loaded on first use)."""
        if self._scorer is None:
            from qace.api import QACE

            self._scorer = QACE(models=self.models, variant=self.variant, features=self.features,
                                device=self.device, progress=False)
            if self._scorer.uses_test_models:
                logger.warning("%s runs on qace's TINY TEST MODELS: its scores mean nothing", self.name)
        return self._scorer

    @property
    def uses_test_models(self) -> bool:
        return bool(self._scorer is not None and self._scorer.uses_test_models)

    def score(self, ids: Sequence[str], candidates: Sequence[str], references: Sequence[Sequence[str]],
              image_ids: Sequence[str]) -> np.ndarray:
        """Per-caption score (``qace`` column), NaN where the scorer refused a caption."""
        refs = None if self.reference_free else [list(r) for r in references]
        images = list(image_ids) if self.reference_free else None
        key = [self.scorer.signature, list(ids), list(candidates), refs, images]
        h = hashlib.sha256(json.dumps(key).encode())
        path = self.cache / f"{self.name}-{h.hexdigest()[:20]}.npy" if self.cache else None
        if path is not None and path.exists():
            return np.load(path)
        logger.info("%s: scoring %d captions", self.name, len(candidates))
        rows = self.scorer.score(list(candidates), references=refs, image_ids=images, ids=list(ids))
        failed = [r for r in rows if "error" in r]
        if failed:
            logger.warning("%s could not score %d captions (first: %s: %s)", self.name, len(failed),
                           failed[0]["id"], failed[0]["error"])
        key_col = self.scorer.score_key
        values = np.array([np.nan if "error" in r else r.get(key_col, np.nan) for r in rows], dtype=float)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            np.save(path, values)
        return values
