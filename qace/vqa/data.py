"""``qace vqa-data``: the paper's synthetic VQA set (section 4, appendix B), on the engine.

For each caption: noun-phrase answer candidates (spaCy, spec section 1), one QG question each, and the
text-QA answer on the caption (`qace.vqa.qgqa`). A question is kept only where that answer is the
phrase it was generated from; a (question, image) pair is kept once. Then unanswerable questions are
mixed in: questions from captions of other images of the chunk, asked of this image, with the answer
``unanswerable``, so that they make ``--unanswerable`` (default 0.2) of each chunk's triples. Images
are split 9:1 into ``train`` and ``val`` (``--val-fraction``), by a hash of seed and image id, so no
image is in both.

Captions run in chunks (the QG and TQA stages batched across a chunk's captions; the next chunk's
candidates are parsed while this one runs on the device). Each chunk's triples are committed as a
Parquet part beside the output, and the unanswerable draws of chunk ``k`` use the generator seeded by
``(seed, k)``, so the output depends only on the input, the models and the settings: a killed run
continues with ``--resume`` and gives the same file as an uninterrupted one.

Output columns: ``question``, ``answer``, ``image_id``, ``split`` (``train``/``val``), ``answerable``
(False for the mixed-in ones), ``caption_id`` (the caption the question came from).
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from qace.data.records import Record, RecordError
from qace.errors import ConfigError, ResumeError

logger = logging.getLogger(__name__)

UNANSWERABLE = "unanswerable"
COLUMNS = ("question", "answer", "image_id", "split", "answerable", "caption_id")
UNANSWERABLE_ROUNDS = 8
"""Rounds of unanswerable draws per chunk; a chunk of one image (no other image to take questions
from) ends with fewer than wanted."""
PARTS_VERSION = 1
"""Bump when a part's content for the same settings changes, so an old part is never resumed."""


@dataclass(frozen=True)
class DataSettings:
    """What decides the triples, besides the input and the models."""

    unanswerable: float = 0.2
    """Fraction of the output that is unanswerable (paper: 20%)."""
    val_fraction: float = 0.1
    """Fraction of the images in the validation split (paper: 9:1)."""
    seed: int = 0
    chunk_size: int = 2048
    """Captions per chunk; part of the settings, since the unanswerable draws are per chunk."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.unanswerable < 1.0:
            raise ConfigError(f"--unanswerable must be in [0, 1), got {self.unanswerable}")
        if not 0.0 <= self.val_fraction < 1.0:
            raise ConfigError(f"--val-fraction must be in [0, 1), got {self.val_fraction}")
        if self.chunk_size < 1:
            raise ConfigError(f"--chunk-size must be at least 1, got {self.chunk_size}")


@dataclass(frozen=True)
class DataSummary:
    """What a `make_vqa_data` run did."""

    captions: int
    skipped: int
    questions: int
    """Distinct questions asked (QG and TQA ran on these)."""
    triples: int
    unanswerable: int
    val: int
    seconds: float
    """Time of the chunks this run processed (a resumed run's earlier chunks not included)."""
    processed_captions: int

    def line(self) -> str:
        rate = self.processed_captions / self.seconds if self.seconds else 0.0
        return (
            f"{self.triples} triples ({self.unanswerable} unanswerable, {self.val} in val) from "
            f"{self.captions} captions ({self.skipped} skipped), {self.questions} questions asked; "
            f"{rate:.1f} captions/s"
        )


def split_of(image_id: str, settings: DataSettings) -> str:
    """``val`` for a ``val_fraction`` share of the images (a hash of seed and id), else ``train``."""
    digest = hashlib.blake2b(f"{settings.seed}\0{image_id}".encode(), digest_size=8).digest()
    return "val" if int.from_bytes(digest, "little") / 2**64 < settings.val_fraction else "train"


def chunk_triples(
    records: Sequence[Record],
    asked: Sequence[Sequence[Any]],
    settings: DataSettings,
    chunk: int,
) -> list[dict[str, Any]]:
    """The triples of one chunk from its captions' `CaptionQA` lists: the consistent questions, then the
    unanswerable ones drawn with the generator seeded by ``(seed, chunk)``."""
    rows: list[dict[str, Any]] = []
    seen: set[tuple[str, str]] = set()
    for record, pairs in zip(records, asked, strict=True):
        for qa in pairs:
            key = (qa.question, str(record.image_id))
            if qa.consistent and qa.question and key not in seen:
                seen.add(key)
                rows.append(_row(qa.question, qa.candidate, key[1], True, record.id))
    rng = np.random.default_rng([settings.seed, chunk])
    n = len(rows)
    wanted = round(n * settings.unanswerable / (1.0 - settings.unanswerable)) if n else 0
    for _ in range(UNANSWERABLE_ROUNDS):  # a draw on the same image, or of a pair already there, is redrawn
        if len(rows) - n >= wanted:
            break
        targets, donors = rng.integers(n, size=(2, wanted - (len(rows) - n))).tolist()
        for target, donor in zip(targets, donors, strict=True):
            image, question = rows[target]["image_id"], rows[donor]["question"]
            if image != rows[donor]["image_id"] and (question, image) not in seen:
                seen.add((question, image))
                rows.append(_row(question, UNANSWERABLE, image, False, rows[donor]["caption_id"]))
    for row in rows:
        row["split"] = split_of(row["image_id"], settings)
    return rows


def _row(question: str, answer: str, image_id: str, answerable: bool, caption_id: str) -> dict[str, Any]:
    return {
        "question": question,
        "answer": answer,
        "image_id": image_id,
        "answerable": answerable,
        "caption_id": caption_id,
    }


def input_digest(path: Path) -> str:
    """sha256 of the caption file's bytes: a resumed run must read the same input."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class Parts:
    """The committed chunks of one output: ``<output>.parts/`` with a manifest of what made them."""

    def __init__(self, output: Path, manifest: dict[str, Any], *, resume: bool) -> None:
        self.dir = output.with_name(output.name + ".parts")
        self.output = output
        stored = self.dir / "manifest.json"
        if self.dir.exists() and not resume:
            raise ResumeError(
                f"{self.dir} holds the parts of an unfinished run; pass --resume to continue it, "
                "or delete it to start again"
            )
        if resume and stored.is_file():
            before = json.loads(stored.read_text())
            changed = sorted(k for k in manifest.keys() | before.keys() if manifest.get(k) != before.get(k))
            if changed:
                raise ResumeError(
                    f"cannot resume {self.output}: {', '.join(changed)} differ from the run that wrote "
                    f"{self.dir}; rerun with the same input, models and settings, or delete {self.dir}"
                )
        self.dir.mkdir(parents=True, exist_ok=True)
        stored.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")

    def path(self, chunk: int) -> Path:
        return self.dir / f"chunk-{chunk:06d}.parquet"

    def done(self, chunk: int) -> bool:
        return self.path(chunk).is_file()

    def commit(self, chunk: int, rows: list[dict[str, Any]]) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.table({name: [row[name] for row in rows] for name in COLUMNS}, schema=_schema())
        tmp = self.path(chunk).with_suffix(".tmp")
        pq.write_table(table, tmp)
        tmp.replace(self.path(chunk))

    def finish(self, chunks: int) -> dict[str, int]:
        """Join the parts into the output (written beside it, then renamed) and remove them; return the
        output's counts."""
        import pyarrow.compute as pc
        import pyarrow.parquet as pq

        tmp = self.output.with_name(self.output.name + ".tmp")
        counts = {"triples": 0, "unanswerable": 0, "val": 0}
        with pq.ParquetWriter(tmp, _schema()) as writer:
            for chunk in range(chunks):
                table = pq.read_table(self.path(chunk), schema=_schema())
                writer.write_table(table)
                counts["triples"] += table.num_rows
                counts["unanswerable"] += table.num_rows - int(pc.sum(table["answerable"]).as_py() or 0)
                counts["val"] += int(pc.sum(pc.equal(table["split"], "val")).as_py() or 0)
        tmp.replace(self.output)
        shutil.rmtree(self.dir)
        return counts


def _schema() -> Any:
    import pyarrow as pa

    return pa.schema(
        [
            ("question", pa.string()),
            ("answer", pa.string()),
            ("image_id", pa.string()),
            ("split", pa.string()),
            ("answerable", pa.bool_()),
            ("caption_id", pa.string()),
        ]
    )


def make_vqa_data(
    captions: str | Path,
    output: str | Path,
    *,
    models: Any,
    fingerprints: dict[str, str],
    extractor: Any,
    settings: DataSettings = DataSettings(),
    fmt: str = "auto",
    limits: Any = None,
    resume: bool = False,
    progress: bool = True,
) -> DataSummary:
    """Write the triples of ``captions`` to the Parquet file ``output`` (see the module docstring).

    ``models``: `qace.metric.pipeline.ModelRunners` with QG and TQA; ``fingerprints`` their signature
    names (a resumed run must use the same); ``extractor``: a `CandidateExtractor`.
    """
    from qace.engine.engine import BatchLimits
    from qace.progress import track
    from qace.vqa.captions import read_captions
    from qace.vqa.qgqa import caption_qa

    path, output = Path(captions), Path(output)
    records: list[Record] = []
    skipped = 0
    for row in read_captions(path, fmt):
        if isinstance(row, RecordError):
            skipped += 1
            logger.warning("caption file line %s (id %s) left out: %s", row.line, row.id, row.reason)
        else:
            records.append(row)
    manifest = {
        "version": PARTS_VERSION,
        "input": input_digest(path),
        "models": fingerprints,
        "settings": asdict(settings),
    }
    parts = Parts(output, manifest, resume=resume)
    size = settings.chunk_size
    chunks = -(-len(records) // size)
    todo = [k for k in range(chunks) if not parts.done(k)]
    questions, processed, seconds = 0, 0, 0.0
    bar = track("vqa-data", total=len(records), unit="caption", enabled=progress)
    bar.update(len(records) - sum(len(records[k * size : (k + 1) * size]) for k in todo))

    def parse(k: int) -> Any:
        return extractor.submit([r.caption for r in records[k * size : (k + 1) * size]])

    parsing = [parse(todo[0])] if todo else []
    for at, k in enumerate(todo):
        start = time.perf_counter()
        chunk = records[k * size : (k + 1) * size]
        candidates = parsing.pop().result()
        if at + 1 < len(todo):  # parse the next chunk while this one runs on the device
            parsing.append(parse(todo[at + 1]))
        asked = caption_qa(
            [r.caption for r in chunk], candidates, models, limits=limits or BatchLimits(), progress=False
        )
        parts.commit(k, chunk_triples(chunk, asked, settings, k))
        questions += sum(map(len, asked))
        processed += len(chunk)
        seconds += time.perf_counter() - start
        bar.update(len(chunk))
    bar.close()
    counts = parts.finish(chunks)
    return DataSummary(
        captions=len(records),
        skipped=skipped,
        questions=questions,
        seconds=seconds,
        processed_captions=processed,
        **counts,
    )
