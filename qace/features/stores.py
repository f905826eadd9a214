"""The one front door for region features given by location (``--features``, ``QACE(features=PATH)``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qace.data.features import FeatureStore, HDF5Store, NpzDirStore, RandomFeatureStore, store_identity
from qace.errors import ConfigError
from qace.features.formats import open_published


def open_feature_store(path: str | Path | Any) -> FeatureStore:
    """Open features by location: a directory of ``.npz``, an ``.h5``/``.hdf5`` file (qace's store or
    VL-T5's), a bottom-up-attention ``.tsv`` (`qace.features.formats`), or ``random:<seed>``. A store
    object is returned as it is, once it states its ``identity`` (`ConfigError` if not)."""
    if not isinstance(path, str | Path):
        store_identity(path)
        return path  # type: ignore[no-any-return]
    text = str(path)
    if text.startswith("random:"):
        try:
            return RandomFeatureStore(int(text.split(":", 1)[1]))
        except ValueError as exc:
            raise ConfigError(
                f"random feature store needs an integer seed, e.g. 'random:0', not {text!r}"
            ) from exc
    path = Path(path)
    if path.is_dir():
        return NpzDirStore(path)
    published = open_published(path)
    if published is not None:
        return published
    if path.suffix.lower() in (".h5", ".hdf5"):
        return HDF5Store(path)
    raise ConfigError(
        f"cannot open region features at {text!r}: give a directory of .npz files, an .h5 file or a .tsv file"
    )
