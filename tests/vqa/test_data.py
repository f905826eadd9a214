"""``qace vqa-data``: the paper's filter, the unanswerable mix, the split, determinism and resume."""

from __future__ import annotations

import json
from concurrent.futures import Future

import pyarrow.parquet as pq
import pytest

from qace.data.records import Record, RecordError
from qace.errors import InputError, ResumeError
from qace.vqa import qgqa
from qace.vqa.captions import read_captions
from qace.vqa.data import DataSettings, chunk_triples, make_vqa_data, split_of
from qace.vqa.qgqa import CaptionQA


def fake_qa(captions, candidates, models, **_):
    """Every candidate asked once; the answer is the candidate except for candidates starting with 'x'."""
    return [
        [CaptionQA(c, f"what about {c} in {caption}?", "other" if c.startswith("x") else c) for c in cands]
        for caption, cands in zip(captions, candidates, strict=True)
    ]


class Extractor:
    def submit(self, captions):
        done: Future = Future()
        done.set_result([[w for w in caption.split() if len(w) > 2] for caption in captions])
        return done


def records(n: int, images: int) -> list[Record]:
    return [
        Record(f"c{i}", f"word{i} xword{i} thing{i % 3}", f"img{i % images}", line=i + 1) for i in range(n)
    ]


def test_only_consistent_questions_are_kept_and_a_fifth_is_unanswerable() -> None:
    recs = records(200, 40)
    asked = fake_qa([r.caption for r in recs], Extractor().submit([r.caption for r in recs]).result(), None)
    rows = chunk_triples(recs, asked, DataSettings(seed=1), chunk=0)
    answerable = [r for r in rows if r["answerable"]]
    assert {r["answer"] for r in answerable} == {f"word{i}" for i in range(200)} | {
        f"thing{i}" for i in range(3)
    }
    assert not any(r["answer"].startswith("x") for r in rows)
    unanswerable = [r for r in rows if not r["answerable"]]
    assert len(unanswerable) == round(len(answerable) * 0.2 / 0.8)  # a fifth of the output
    by_question = {r["question"]: r for r in answerable}
    for row in unanswerable:
        assert row["answer"] == "unanswerable"
        assert by_question[row["question"]]["image_id"] != row["image_id"]  # from another image's caption
    assert len({(r["question"], r["image_id"]) for r in rows}) == len(rows)
    for row in rows:  # the split is by image: no image in both
        assert row["split"] == split_of(row["image_id"], DataSettings(seed=1))
    assert 0 < sum(r["split"] == "val" for r in rows) < len(rows)


def test_triples_are_deterministic_for_a_seed() -> None:
    recs = records(60, 12)
    asked = fake_qa([r.caption for r in recs], Extractor().submit([r.caption for r in recs]).result(), None)
    one = chunk_triples(recs, asked, DataSettings(seed=3), chunk=2)
    assert one == chunk_triples(recs, asked, DataSettings(seed=3), chunk=2)
    assert one != chunk_triples(recs, asked, DataSettings(seed=4), chunk=2)


def write_jsonl(path, recs):
    path.write_text(
        "".join(json.dumps({"id": r.id, "image_id": r.image_id, "caption": r.caption}) + "\n" for r in recs)
    )
    return path


def run(captions, output, *, resume=False, seed=0):
    return make_vqa_data(
        captions,
        output,
        models=None,
        fingerprints={"qg": "a", "tqa": "b"},
        extractor=Extractor(),
        settings=DataSettings(seed=seed, chunk_size=10),
        resume=resume,
        progress=False,
    )


def test_a_killed_run_resumes_to_the_same_file(tmp_path, monkeypatch) -> None:
    captions = write_jsonl(tmp_path / "caps.jsonl", records(45, 9))
    monkeypatch.setattr(qgqa, "caption_qa", fake_qa)
    whole = run(captions, tmp_path / "whole.parquet")
    calls = []

    def dies_on_the_third_chunk(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return fake_qa(*args, **kwargs)

    monkeypatch.setattr(qgqa, "caption_qa", dies_on_the_third_chunk)
    with pytest.raises(KeyboardInterrupt):
        run(captions, tmp_path / "resumed.parquet")
    with pytest.raises(ResumeError, match="--resume"):
        run(captions, tmp_path / "resumed.parquet")
    with pytest.raises(ResumeError, match="settings"):
        run(captions, tmp_path / "resumed.parquet", resume=True, seed=5)
    monkeypatch.setattr(qgqa, "caption_qa", fake_qa)
    resumed = run(captions, tmp_path / "resumed.parquet", resume=True)
    assert resumed.processed_captions == 25 and whole.processed_captions == 45
    assert pq.read_table(tmp_path / "resumed.parquet").equals(pq.read_table(tmp_path / "whole.parquet"))
    assert resumed.triples == whole.triples > 0 and not (tmp_path / "resumed.parquet.parts").exists()


def test_coco_annotations_results_jsonl_and_csv_are_read(tmp_path) -> None:
    annotations = {
        "images": [],
        "annotations": [{"id": 7, "image_id": 42, "caption": "a dog runs"}, {"id": 8, "image_id": 42}],
    }
    (tmp_path / "ann.json").write_text(json.dumps(annotations))
    rows = list(read_captions(tmp_path / "ann.json"))
    assert rows[0] == Record("7", "a dog runs", "42")
    assert isinstance(rows[1], RecordError) and "caption" in rows[1].reason and rows[1].line == 2
    (tmp_path / "res.json").write_text(json.dumps([{"image_id": 1, "caption": "a cat"}]))
    assert list(read_captions(tmp_path / "res.json")) == [Record("0", "a cat", "1")]
    (tmp_path / "c.csv").write_text("id,image_id,caption\na,1,a red kite\nb,,no image\n")
    good, bad = list(read_captions(tmp_path / "c.csv"))
    assert good.caption == "a red kite" and good.image_id == "1"
    assert isinstance(bad, RecordError) and "image_id" in bad.reason and bad.id == "b"
    with pytest.raises(InputError, match="annotations"):
        (tmp_path / "bad.json").write_text(json.dumps({"images": []}))
        list(read_captions(tmp_path / "bad.json"))
