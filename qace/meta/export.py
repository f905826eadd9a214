"""Write the shared data sets as ``qace score`` input, with ids that join back to the judgments.

Flickr8k-Expert rows keep the ``id`` of ``judgements.csv`` (all 5,822; the report picks the
5,664 of the standard protocol). PASCAL-50S candidates are ``"<pair>-1"``/``"<pair>-2"`` (pair =
0-based index in ``pair_pascal.mat``), each with its pair's sampled references; exporting several
seeds tags ids ``"<pair>-1@<seed>"`` so the report can score every seed's references.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from pathlib import Path

from qace.errors import ConfigError
from qace.meta.datasets import PASCAL_NUM_REFS, load_flickr8k_expert, load_pascal50s
from qace.meta.evaluate import pascal_candidate_ids

logger = logging.getLogger(__name__)

EXPORTABLE = ("flickr8k", "pascal50s")


def flickr8k_records(data_dir: Path | str | None = None) -> Iterator[dict]:
    """All 5,822 judged captions: ``{"id", "image_id", "caption", "references"}``."""
    data = load_flickr8k_expert(data_dir, standard=False)
    for i in range(len(data)):
        yield {
            "id": data.ids[i],
            "image_id": data.image_ids[i],
            "caption": data.candidates[i],
            "references": data.references[i],
        }


def pascal50s_records(
    data_dir: Path | str | None = None,
    seeds: Sequence[int] = (0,),
    tag_seed: bool = False,
    k: int = PASCAL_NUM_REFS,
) -> Iterator[dict]:
    """Both candidates of every pair with ``k`` references sampled per seed.

    ``tag_seed`` appends ``@<seed>`` to ids; it is required when more than one seed is exported,
    since the ids would otherwise collide.
    """
    if len(seeds) > 1 and not tag_seed:
        raise ConfigError("exporting several PASCAL-50S seeds needs seed-tagged ids (tag_seed=True)")
    pairs = load_pascal50s(data_dir)
    for seed in seeds:
        refs = pairs.sample_references(seed, k)
        ids1, ids2 = pascal_candidate_ids(pairs, seed if tag_seed else None)
        for i in range(len(pairs)):
            for cid, cand in ((ids1[i], pairs.cand1[i]), (ids2[i], pairs.cand2[i])):
                yield {"id": cid, "image_id": pairs.image_ids[i], "caption": cand, "references": refs[i]}


def with_images(records: Iterator[dict], images: Path | str) -> Iterator[dict]:
    """Add ``image``: the absolute path of ``images/<image_id>`` (judges such as VisCE² read it).

    Image ids are the data sets' file names (``1056338697_4f7d7ce270.jpg``, ``2008_003849.jpg``).
    Missing files are not an error here: the scorer reports each one with its record.
    """
    folder = Path(images).expanduser().resolve()
    if not folder.is_dir():
        raise ConfigError(f"--images {str(images)!r} is not a directory of the data set's image files")
    for rec in records:
        yield {**rec, "image": str(folder / str(rec["image_id"]))}


def export(
    dataset: str,
    out: Path | str,
    data_dir: Path | str | None = None,
    seeds: Sequence[int] = (0,),
    tag_seed: bool = False,
    images: Path | str | None = None,
) -> int:
    """Write ``dataset`` as JSONL to ``out``; returns the number of lines.

    ``images``: a folder holding the data set's image files; each record then carries its ``image`` path.
    """
    if dataset not in EXPORTABLE:
        raise ConfigError(f"cannot export {dataset!r}; choose from {EXPORTABLE}")
    records = (
        flickr8k_records(data_dir) if dataset == "flickr8k" else pascal50s_records(data_dir, seeds, tag_seed)
    )
    if images is not None:
        records = with_images(records, images)
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as fh:
        for rec in records:
            fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
            n += 1
    tmp.replace(path)
    logger.info("exported %d %s captions to %s", n, dataset, path)
    return n
