"""Loaders for human-judgment data sets: Flickr8k-Expert, PASCAL-50S and generic user files.

Each loader returns a plain dataclass with parallel sequences, so statistics and metrics can be
computed on numpy arrays without knowing where the data came from. The shared data lives outside
the repository (``<repo>/../shared/data``); it is read in place and never copied.
"""

from __future__ import annotations

import csv
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from qace.data.sniff import read_json_lines, table_format
from qace.errors import ConfigError, InputError

logger = logging.getLogger(__name__)

#: Environment variable that overrides the default shared-data folder.
DATA_ENV = "QACE_SHARED_DATA"
#: PASCAL-50S category codes in ``pair_pascal.mat`` and their names.
PASCAL_CATEGORIES = {1: "HC", 2: "HI", 3: "HM", 4: "MM"}
#: Seeds whose mean the PASCAL-50S report shows (the 5-reference sampling moves accuracy 1-2 points).
PASCAL_SEEDS = (0, 1, 2, 3, 4)
#: References sampled per PASCAL-50S image, as in the CLIPScore/PAC-S protocol.
PASCAL_NUM_REFS = 5


def default_data_dir() -> Path:
    """``$QACE_SHARED_DATA`` if set, else ``<repo root>/../shared/data`` (the CI layout)."""
    env = os.environ.get(DATA_ENV)
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2].parent / "shared" / "data"


def spread(n: int, limit: int | None) -> np.ndarray:
    """``limit`` indices spread evenly over ``range(n)`` (all of them when ``limit`` is None or >= n)."""
    if limit is None or limit >= n:
        return np.arange(n)
    if limit < 1:
        raise ConfigError(f"--limit must be at least 1, got {limit}")
    return np.unique(np.linspace(0, n - 1, limit).round().astype(int))


@dataclass
class CaptionSet:
    """Captions with absolute human scores: one row per candidate caption.

    ``human`` is (n_rows, n_judges) with NaN where a judge gave no score; ``metrics`` holds
    per-row metric scores that came with the data (generic files) or were joined later.
    """

    name: str
    ids: list[str]
    image_ids: list[str]
    candidates: list[str]
    references: list[list[str]]
    human: np.ndarray
    judges: list[str]
    systems: list[str] | None = None
    metrics: dict[str, np.ndarray] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.ids)

    def subset(self, mask: np.ndarray, name: str | None = None) -> CaptionSet:
        """Rows where ``mask`` is true, keeping every parallel field aligned."""
        idx = np.flatnonzero(mask)
        return CaptionSet(
            name=name or self.name,
            ids=[self.ids[i] for i in idx],
            image_ids=[self.image_ids[i] for i in idx],
            candidates=[self.candidates[i] for i in idx],
            references=[self.references[i] for i in idx],
            human=self.human[idx],
            judges=list(self.judges),
            systems=None if self.systems is None else [self.systems[i] for i in idx],
            metrics={k: v[idx] for k, v in self.metrics.items()},
        )


@dataclass
class PairSet:
    """PASCAL-50S style pairwise judgments: which of two candidates people prefer.

    ``votes[i]`` holds +1 (first preferred) / -1 (second preferred) per voter; ``references[i]``
    holds every reference of the image, from which :meth:`sample_references` draws.
    """

    name: str
    ids: list[str]
    image_ids: list[str]
    cand1: list[str]
    cand2: list[str]
    references: list[list[str]]
    votes: list[np.ndarray]
    categories: list[str]
    sources: np.ndarray

    def __len__(self) -> int:
        return len(self.ids)

    def majority(self) -> np.ndarray:
        """+1 where most voters preferred ``cand1``, -1 for ``cand2``, 0 on an even split."""
        return np.sign(np.array([v.sum() for v in self.votes], dtype=float))

    def subset(self, idx: Sequence[int] | np.ndarray) -> PairSet:
        """The pairs at positions ``idx``, keeping their ids (so export ids still join)."""
        ix = [int(i) for i in idx]
        return PairSet(
            name=self.name,
            ids=[self.ids[i] for i in ix],
            image_ids=[self.image_ids[i] for i in ix],
            cand1=[self.cand1[i] for i in ix],
            cand2=[self.cand2[i] for i in ix],
            references=[self.references[i] for i in ix],
            votes=[self.votes[i] for i in ix],
            categories=[self.categories[i] for i in ix],
            sources=self.sources[ix],
        )

    def sample_references(self, seed: int, k: int = PASCAL_NUM_REFS) -> list[list[str]]:
        """``k`` references per pair, the same for both candidates, reproducible from ``seed``.

        Draws with ``numpy.random.default_rng(seed)`` pair by pair, in pair order, without
        replacement; images with fewer than ``k`` references keep all of them.
        """
        rng = np.random.default_rng(seed)
        out = []
        for refs in self.references:
            if len(refs) <= k:
                out.append(list(refs))
            else:
                pick = rng.choice(len(refs), size=k, replace=False)
                out.append([refs[j] for j in sorted(pick)])
        return out


def _require(path: Path, what: str) -> Path:
    if not path.exists():
        raise ConfigError(f"{what} not found at {path}; pass --data-dir or set ${DATA_ENV}")
    return path


def load_flickr8k_expert(data_dir: Path | str | None = None, standard: bool = True) -> CaptionSet:
    """Flickr8k-Expert judgements with their candidates and the judged image's references.

    With ``standard`` (the CLIPScore/PAC-S protocol) the 158 rows whose candidate was written
    for the judged image itself are dropped, leaving 5,664; without it all 5,822 rows are kept,
    which is what inter-annotator agreement studies use. Row ids are the ``id`` column of
    ``judgements.csv``, so scores computed on an export join back by id.
    """
    base = Path(data_dir) if data_dir is not None else default_data_dir()
    folder = _require(base / "flickr8k_expert", "Flickr8k-Expert folder")
    with open(_require(folder / "judgements.csv", "judgements.csv"), newline="") as fh:
        rows = list(csv.DictReader(fh))
    with open(_require(folder / "candidates.json", "candidates.json")) as fh:
        cands = json.load(fh)
    with open(_require(folder / "refs.json", "refs.json")) as fh:
        ref_entries = json.load(fh)
    if len(cands) != len(rows):
        raise InputError(f"candidates.json has {len(cands)} entries but judgements.csv {len(rows)} rows")
    refs_by_image: dict[str, list[str]] = {}
    for entry in ref_entries:
        lst = refs_by_image.setdefault(entry["image_id"], [])
        if entry["caption"] not in lst:
            lst.append(entry["caption"])
    keep = []
    for row, cand in zip(rows, cands, strict=True):
        if cand["image_id"] != row["imageid"]:
            raise InputError("candidates.json is not row-aligned with judgements.csv", row["id"])
        if row["imageid"] not in refs_by_image:
            raise InputError(f"no references for image {row['imageid']}", row["id"])
        own = row["textid"].split("#")[0] == row["imageid"]
        keep.append(not (standard and own))
    idx = [i for i, k in enumerate(keep) if k]
    human = np.array([[float(rows[i][j]) for j in ("j1", "j2", "j3")] for i in idx])
    logger.info("Flickr8k-Expert: %d of %d rows (standard=%s)", len(idx), len(rows), standard)
    return CaptionSet(
        name="flickr8k_expert",
        ids=[rows[i]["id"] for i in idx],
        image_ids=[rows[i]["imageid"] for i in idx],
        candidates=[cands[i]["caption"].strip() for i in idx],
        references=[refs_by_image[rows[i]["imageid"]] for i in idx],
        human=human,
        judges=["j1", "j2", "j3"],
    )


def load_pascal50s(data_dir: Path | str | None = None) -> PairSet:
    """The 4,000 PASCAL-50S candidate pairs with votes, categories and all 50 references.

    Pair ids are the 0-based pair index as a string; the candidates are ``"<id>-1"`` and
    ``"<id>-2"`` in exports. Needs scipy to read the MATLAB files.
    """
    from scipy.io import loadmat

    base = Path(data_dir) if data_dir is not None else default_data_dir()
    folder = _require(base / "pascal50s", "PASCAL-50S folder")
    pairs = loadmat(
        _require(folder / "pair_pascal.mat", "pair_pascal.mat"), squeeze_me=True, struct_as_record=False
    )
    refmat = loadmat(
        _require(folder / "pascal50S.mat", "pascal50S.mat"), squeeze_me=True, struct_as_record=False
    )
    refs_by_image = {str(r.image): [str(s).strip() for s in np.atleast_1d(r.sent)] for r in refmat["refs"]}
    n = len(pairs["new_input"])
    image_ids, cand1, cand2, references, votes = [], [], [], [], []
    for i, inp in enumerate(pairs["new_input"]):
        name = str(inp.name)
        if name not in refs_by_image:
            raise InputError(f"no references for image {name}", str(i))
        image_ids.append(name)
        cand1.append(str(inp.sent1).strip())
        cand2.append(str(inp.sent2).strip())
        references.append(refs_by_image[name])
        # Stored as uint8 when all votes are +1 and int16 otherwise: cast before summing.
        votes.append(np.atleast_1d(pairs["result"][i].result).astype(np.int64))
    categories = [PASCAL_CATEGORIES[int(c)] for c in pairs["category"]]
    logger.info("PASCAL-50S: %d pairs", n)
    return PairSet(
        name="pascal50s",
        ids=[str(i) for i in range(n)],
        image_ids=image_ids,
        cand1=cand1,
        cand2=cand2,
        references=references,
        votes=votes,
        categories=categories,
        sources=np.asarray(pairs["new_data"], dtype=np.int64),
    )


def _parse_refs(value: object, record_id: str) -> list[str]:
    if isinstance(value, list):
        return [str(v) for v in value]
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                return [str(v) for v in json.loads(text)]
            except json.JSONDecodeError as exc:
                raise InputError(f"references is not a valid JSON list: {exc}", record_id) from exc
        return [r.strip() for r in text.split("|||") if r.strip()]
    if value is None:
        return []
    raise InputError(f"references must be a list or a string, got {type(value).__name__}", record_id)


def _to_float(value: object, column: str, record_id: str) -> float:
    if value is None or value == "":
        return float("nan")
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        raise InputError(f"column {column!r} is not numeric: {value!r}", record_id) from exc


def read_records(path: Path | str, fmt: str = "auto") -> list[dict]:
    """Rows of a JSONL, JSON (list), CSV or Parquet file as dicts: ``fmt``, or by the name and, for
    JSON, the content (`qace.data.sniff.table_format`)."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"file not found: {p}")
    kind = table_format(p, fmt)
    if kind == "parquet":
        import pyarrow.parquet as pq

        return pq.read_table(p).to_pylist()
    if kind == "csv":
        with open(p, newline="") as fh:
            return list(csv.DictReader(fh))
    if kind == "jsonl":
        return read_json_lines(p)  # type: ignore[return-value]
    try:
        data = json.loads(p.read_bytes())
    except ValueError as exc:
        raise InputError(
            f"{p} is not JSON ({exc}); if it holds one object a line, pass --format jsonl"
        ) from exc
    if not isinstance(data, list):
        raise InputError(f"{p}: expected a JSON list of records")
    return data


def load_generic(
    path: Path | str,
    human_cols: Sequence[str],
    metric_cols: Sequence[str] | None = None,
    id_col: str = "id",
    item_col: str = "item",
    system_col: str = "system",
    candidate_col: str = "candidate",
    references_col: str = "references",
    fmt: str = "auto",
) -> CaptionSet:
    """A user file (JSONL/JSON/CSV/Parquet, or ``fmt``) with one row per judged caption.

    ``human_cols`` name the judge columns (one or more); ``metric_cols`` name metric-score
    columns to carry along (default: every other numeric column). Text columns are optional,
    since agreement needs only the human scores; ``references`` may be a JSON list or a
    ``|||``-separated string. Missing ids become the row number.
    """
    records = read_records(path, fmt)
    if not records:
        raise InputError(f"{path}: no records")
    if not human_cols:
        raise ConfigError("name at least one human score column (e.g. --human j1 j2 j3)")
    for col in human_cols:
        if col not in records[0]:
            raise InputError(f"{path}: no human score column {col!r}; columns are {sorted(records[0])}")
    reserved = {id_col, item_col, system_col, candidate_col, references_col, *human_cols}
    if metric_cols is None:
        metric_cols = [k for k, v in records[0].items() if k not in reserved and _numeric(v)]
    ids, items, systems, cands, refs, human = [], [], [], [], [], []
    metrics: dict[str, list[float]] = {c: [] for c in metric_cols}
    for n, rec in enumerate(records):
        rid = str(rec.get(id_col, n))
        ids.append(rid)
        items.append(str(rec.get(item_col, rid)))
        systems.append(str(rec.get(system_col, "")))
        cands.append(str(rec.get(candidate_col, "") or ""))
        refs.append(_parse_refs(rec.get(references_col), rid))
        human.append([_to_float(rec.get(c), c, rid) for c in human_cols])
        for c in metric_cols:
            metrics[c].append(_to_float(rec.get(c), c, rid))
    has_system = any(systems)
    return CaptionSet(
        name=Path(path).stem,
        ids=ids,
        image_ids=items,
        candidates=cands,
        references=refs,
        human=np.array(human, dtype=float),
        judges=list(human_cols),
        systems=systems if has_system else None,
        metrics={k: np.array(v, dtype=float) for k, v in metrics.items()},
    )


def _numeric(value: object) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int | float):
        return True
    if isinstance(value, str):
        try:
            float(value)
        except ValueError:
            return False
        return True
    return False
