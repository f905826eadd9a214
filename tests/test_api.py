"""End-to-end behaviour of the scorer on the test models: bad input, flags, batching, resume, signature."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest

from qace import api
from qace.api import QACE
from qace.config import QACEConfig, build_signature, parse_signature
from qace.data.features import RandomFeatureStore
from qace.data.records import Record
from qace.demo import example_path
from qace.errors import ConfigError, InputError, ModelNotFoundError, ResumeError
from tests.helpers import kill_in_chunk

REFS = ["a young girl in a red dress runs on the beach", "a girl runs along the sand near the sea"]


@pytest.fixture(scope="module")
def ref_scorer(test_models_dir):
    return QACE(models=test_models_dir, variant="ref", progress=False, explain=True)


def test_bad_captions_are_reported_and_others_scored(ref_scorer):
    long_caption = " ".join(["a girl in a red dress runs on the beach"] * 80)
    rows = ref_scorer.score(
        ["a girl in a red dress runs on the beach", "   ", "the the the", long_caption, "a dog in the park"],
        references=[REFS, REFS, REFS, REFS, []],
    )
    assert rows[0]["qace"] > 0 and rows[0]["n_questions"] >= 1 and rows[0]["flags"] == []
    assert rows[1] == {"id": "1", "error": "empty or whitespace-only caption"}
    assert rows[2]["n_questions"] == 0 and rows[2]["qace"] == 0.0 and rows[2]["flags"] == ["no_questions"]
    assert "truncated_input" in rows[3]["flags"]
    assert rows[4]["id"] == "4" and "missing references" in rows[4]["error"]


def test_batch_size_does_not_change_fp32_scores(test_models_dir, ref_scorer):
    captions = [json.loads(line) for line in example_path().open()]
    captions = [c for c in captions if c["caption"].strip()]
    args = ([c["caption"] for c in captions], [c["references"] for c in captions])
    small = QACE(
        models=test_models_dir,
        variant="ref",
        progress=False,
        explain=True,
        max_batch_rows=3,
        max_batch_tokens=64,
        chunk_size=4,
    )
    assert small.signature == ref_scorer.signature
    a, b = small.score(*args), ref_scorer.score(*args)

    # Texts are identical; floats may differ in the last bits, since BLAS sums in a shape-dependent order.
    def texts(rows):
        return [
            [
                (q["question"], q["answer_on_caption"], q["answers_on_context"])
                for q in r["explanation"]["questions"]
            ]
            for r in rows
        ]

    assert texts(a) == texts(b)
    for x, y in zip(a, b, strict=True):
        assert {k: v for k, v in x.items() if not isinstance(v, float | dict)} == {
            k: v for k, v in y.items() if not isinstance(v, float | dict)
        }
        for key in ("qace", "qace_f1", "qace_bs", "qace_an", "qace_max"):
            assert x[key] == pytest.approx(y[key], abs=2e-6)  # see TOLERANCE in test_parity.py


def test_qace_img_reports_missing_and_malformed_features(test_models_dir, tmp_path):
    good = RandomFeatureStore(seed=0).get("x")
    np.savez(tmp_path / "ok.npz", features=good[:, :2048], norm_bb=good[:, 2048:])
    bad = good[:, :2048].copy()
    bad[0, 0] = np.nan
    np.savez(tmp_path / "nan.npz", features=bad, norm_bb=good[:, 2048:])
    np.savez(tmp_path / "shape.npz", features=good[:20, :2048], norm_bb=good[:20, 2048:])
    scorer = QACE(models=test_models_dir, variant="img", features=tmp_path, progress=False)
    rows = scorer.score(["a girl on the beach"] * 5, image_ids=["ok", "nan", "shape", "absent", None])
    assert "qace" in rows[0]
    assert "nan" in rows[1]["error"].lower()
    assert "shape" in rows[2]["error"].lower()
    assert "absent" in rows[3]["error"]
    assert "missing image_id" in rows[4]["error"]


def test_a_record_whose_features_fail_leaves_the_others_rows_as_without_it(test_models_dir, tmp_path):
    """The chunk's parse starts before its features are read; a record they reject is listed and the
    others are parsed again without it, so their rows are those of a chunk without it."""
    good = RandomFeatureStore(seed=0).get("x")
    np.savez(tmp_path / "ok.npz", features=good[:, :2048], norm_bb=good[:, 2048:])
    captions = ["a girl runs on the beach", "two dogs play in the park", "a man rides a red bike"]
    scorer = QACE(models=test_models_dir, variant="img", features=tmp_path, progress=False)
    rows = scorer.score(captions, image_ids=["ok", "absent", "ok"])
    assert "absent" in rows[1]["error"]
    alone = QACE(models=test_models_dir, variant="img", features=tmp_path, progress=False)
    expected = alone.score([captions[0], captions[2]], image_ids=["ok", "ok"])
    assert [rows[0], {**rows[2], "id": "1"}] == expected  # ids are positions in the input


def test_qace_img_without_features_is_a_config_error(test_models_dir):
    scorer = QACE(models=test_models_dir, variant="img", progress=False)
    with pytest.raises(ConfigError, match="region features"):
        scorer.score(["a girl"], image_ids=["x"])


def test_a_missing_feature_store_fails_before_the_models_load(test_models_dir, tmp_path, monkeypatch):
    def build_models(*args, **kwargs):
        raise AssertionError("models loaded before the feature store was checked")

    monkeypatch.setattr("qace.metric.runners.build_models", build_models)
    with pytest.raises(ConfigError, match="missing.h5"):
        QACE(models=test_models_dir, variant="img", features=tmp_path / "missing.h5", progress=False)


def test_missing_or_wrong_model_directory_is_named(tmp_path, test_models_dir):
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        QACE(models=tmp_path / "nowhere")
    (tmp_path / "qg").mkdir()
    with pytest.raises(ModelNotFoundError, match="has no tqa/"):  # checked before anything loads
        QACE(models=tmp_path)
    (tmp_path / "tqa").mkdir()
    (tmp_path / "qg" / "notes.txt").write_text("not a model")
    with pytest.raises(ModelNotFoundError, match="QG"):
        QACE(models=tmp_path)


def test_resumed_file_run_equals_uninterrupted_run(test_models_dir, tmp_path, monkeypatch):
    scorer = QACE(models=test_models_dir, variant="ref", progress=False, chunk_size=3)
    whole = tmp_path / "whole.jsonl"
    scorer.score_file(example_path(), whole)

    kill_in_chunk(monkeypatch, 3)
    broken = tmp_path / "broken.jsonl"
    with pytest.raises(KeyboardInterrupt):
        scorer.score_file(example_path(), broken)
    assert not broken.exists()  # never visible half-written
    monkeypatch.undo()
    with pytest.raises(ResumeError, match="--resume"):
        scorer.score_file(example_path(), broken)
    summary = scorer.score_file(example_path(), broken, resume=True)
    assert summary.skipped == 6
    assert broken.read_bytes() == whole.read_bytes()
    assert (tmp_path / "broken.errors.jsonl").read_bytes() == (tmp_path / "whole.errors.jsonl").read_bytes()
    ids = [json.loads(line)["id"] for line in broken.open()]
    errors = [json.loads(line)["id"] for line in (tmp_path / "broken.errors.jsonl").open()]
    assert sorted(ids + errors) == sorted(json.loads(line)["id"] for line in example_path().open())


def test_resume_refuses_output_of_other_settings(test_models_dir, tmp_path, monkeypatch):
    out = tmp_path / "out.jsonl"
    first = QACE(models=test_models_dir, variant="ref", progress=False, chunk_size=3)
    kill_in_chunk(monkeypatch, 2)  # the first chunk is committed
    with pytest.raises(KeyboardInterrupt):
        first.score_file(example_path(), out)
    monkeypatch.undo()
    other = QACE(models=test_models_dir, variant="ref", progress=False, max_input_tokens=64)
    with pytest.raises(ResumeError, match="signature"):
        other.score_file(example_path(), out, resume=True)


def test_signature_names_what_changes_scores_and_parses_back():
    config = QACEConfig(variant="img", precision="bf16")
    sig = build_signature(config, qg="q", qa="a", vqa="v", bertscore="bs_L6")
    fields = parse_signature(sig)
    assert fields["metric"] == "QACE-Img" and fields["prec"] == "bf16" and fields["vqa"] == "v"
    assert sig == build_signature(
        config.with_(max_batch_rows=7, device="cuda"), qg="q", qa="a", vqa="v", bertscore="bs_L6"
    )


def test_unknown_setting_is_rejected():
    with pytest.raises(ConfigError, match="unknown setting"):
        QACE(batch=3)


def test_chunk_with_no_work_for_the_models(ref_scorer):
    rows = ref_scorer.score(["", "the the the", "  "], references=[REFS] * 3)
    assert "error" in rows[0] and "error" in rows[2]
    assert rows[1]["flags"] == ["no_questions"] and rows[1]["qace"] == 0.0


def test_misaligned_list_columns_are_the_callers_error(ref_scorer):
    """A references/ids list of another length than the captions raises before any work, naming both."""
    with pytest.raises(InputError, match="got 2 captions but 1 references"):
        ref_scorer.score(["a girl runs", "a dog"], references=[REFS])
    with pytest.raises(InputError, match="got 1 captions but 2 ids"):
        ref_scorer.score(["a girl runs"], references=[REFS], ids=["a", "b"])


def test_a_lone_surrogate_in_an_id_or_image_id_is_an_error_of_its_record(ref_scorer, tmp_path):
    """As in file input: the list API used to score such records, and give the surrogate back in the row."""
    rows = ref_scorer.score(
        ["a girl runs", "a girl runs", "a girl runs"],
        references=[REFS] * 3,
        ids=["bad\ud800", "fine", "also-fine"],
        image_ids=[None, "img\udc00", "img"],
    )
    assert rows[0] == {"id": None, "error": ref_scorer.score(["a"], ids=["bad\ud800"])[0]["error"]}
    assert rows[0]["error"].startswith("id holds a lone surrogate (\\ud800 at character 4)")
    assert rows[1]["id"] == "fine" and rows[1]["error"].startswith("image_id holds a lone surrogate (\\udc00")
    assert rows[2]["qace"] > 0
    data = tmp_path / "in.jsonl"  # the same records from a file: the same errors
    lines = [{"id": i, "caption": "a girl runs", "references": REFS, "image_id": m}
             for i, m in (("bad\ud800", None), ("fine", "img\udc00"))]  # fmt: skip
    data.write_text("".join(json.dumps(line) + "\n" for line in lines))
    ref_scorer.score_file(data, tmp_path / "out.jsonl")
    errors = [json.loads(line) for line in (tmp_path / "out.errors.jsonl").read_text().splitlines()]
    assert [e["id"] for e in errors] == [None, "fine"]
    assert [e["reason"].split(": ", 1)[1] for e in errors] == [rows[0]["error"], rows[1]["error"]]


class _ThreadRecordingStore(RandomFeatureStore):
    """Random features that note which thread loaded each image, and signal once ``watch`` is loaded."""

    def __init__(self, watch: str) -> None:
        super().__init__(seed=0)
        self.threads: dict[str, str] = {}
        self.watch, self.watched = watch, threading.Event()

    def get(self, image_id: str) -> np.ndarray:
        self.threads[image_id] = threading.current_thread().name
        if image_id == self.watch:
            self.watched.set()
        return super().get(image_id)


def test_next_chunk_is_prepared_while_this_one_is_scored(test_models_dir, monkeypatch):
    """Chunk 2's features are loaded by the prefetch thread while chunk 1 is still in the models."""
    store = _ThreadRecordingStore(watch="img-b")
    scored: list[list[str]] = []

    def score_chunk_waiting_for_prefetch(records, *args, **kwargs):
        if not scored:  # chunk 1 cannot finish unless chunk 2 is prepared meanwhile
            assert store.watched.wait(30), "chunk 2 was not prepared while chunk 1 was scored"
        scored.append([r.id for r in records])
        return real(records, *args, **kwargs)

    real = api.score_chunk
    monkeypatch.setattr(api, "score_chunk", score_chunk_waiting_for_prefetch)
    scorer = QACE(models=test_models_dir, variant="img", features=store, chunk_size=2, progress=False)
    records = [
        Record("1", "a dog runs", "img-a"),
        Record("2", "a cat", "img-b"),
        Record("3", "a girl", "img-c"),
    ]
    rows = list(scorer.score_records(records))
    assert [r["id"] for r in rows] == ["1", "2", "3"] and scored == [["1"], ["2"], ["3"]]  # tapered
    assert set(store.threads) == {"img-a", "img-b", "img-c"}
    assert all(name.startswith("qace-prefetch") for name in store.threads.values())
    assert scorer.features is not None and scorer.features.loads == 3  # each image read once


def test_callers_in_several_threads_take_turns_on_the_device(test_models_dir, monkeypatch):
    """Scorers in several threads overlap their chunks, but never run device work at the same time (on a
    GPU they would share the decoders' graph buffers), and every result equals a lone call's."""
    scorer = QACE(
        models=test_models_dir,
        variant="img",
        features=RandomFeatureStore(seed=0),
        chunk_size=1,
        progress=False,
    )
    jobs = [
        (["a dog runs on the grass", "two girls on the beach"], ["i1", "i2"]),
        (["a cat sleeps on a sofa", "a red car in the street"], ["i4", "i1"]),
        (["children play in the park", "a boy jumps", "a bird flies"], ["i2", "i5", "i3"]),
    ] * 2
    alone = [scorer.score(captions, image_ids=images) for captions, images in jobs]
    device, chunks = {"now": 0, "most": 0}, {"now": 0, "most": 0}
    guard = threading.Lock()

    def counted(fn, count):
        def wrapper(*args, **kwargs):
            with guard:
                count["now"] += 1
                count["most"] = max(count["most"], count["now"])
            time.sleep(0.02)  # long enough for another thread to arrive
            try:
                return fn(*args, **kwargs)
            finally:
                with guard:
                    count["now"] -= 1

        return wrapper

    for role in ("qg", "tqa", "vqa"):
        runner = getattr(scorer.models, role)
        monkeypatch.setattr(runner, "generate", counted(runner.generate, device))
    monkeypatch.setattr(scorer.matcher, "score", counted(scorer.matcher.score, device))
    monkeypatch.setattr(api, "score_chunk", counted(api.score_chunk, chunks))
    together: list = [None] * len(jobs)

    def run(i: int) -> None:
        together[i] = scorer.score(jobs[i][0], image_ids=jobs[i][1])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert device["most"] == 1 and chunks["most"] >= 2
    assert together == alone


@pytest.mark.parametrize(
    ("n", "chunks"),
    [(16, [16]), (17, [2, 4, 8, 3]), (40, [2, 4, 8, 13, 7, 3, 3]), (80, [2, 4, 8, 16, 16, 16, 9, 5, 4])],
)
def test_chunks_grow_then_shrink_only_when_there_is_more_than_one(ref_scorer, monkeypatch, n, chunks):
    """A call that fits one chunk (a reward call) stays one chunk; a longer input starts the models on an
    eighth of one, grows to whole chunks, and ends in halves down to an eighth (`qace.chunks.Tapered`),
    whichever design scores it. Files keep whole chunks (resume), tested above."""
    sizes: list[int] = []
    real = api.score_chunk

    def recording(records, *args, **kwargs):
        sizes.append(len(records))
        return real(records, *args, **kwargs)

    monkeypatch.setattr(api, "score_chunk", recording)
    scorer = ref_scorer
    old = scorer.config
    scorer.config = old.with_(chunk_size=16)
    try:
        captions = [f"a dog number {i} runs on the grass" for i in range(n)]
        rows = scorer.score(captions, references=[["a dog runs", "a dog on grass"]] * n)
    finally:
        scorer.config = old
    assert sizes == chunks and [r["id"] for r in rows] == [str(i) for i in range(n)]


def test_token_f1_runs_beside_bertscore(ref_scorer, monkeypatch):
    """BERTScore cannot finish unless token F1 is running meanwhile, in its helper thread."""
    import qace.kernels.token_f1 as f1_module

    started, threads = threading.Event(), []
    real_f1, real_score = f1_module.token_f1, ref_scorer.matcher.score

    def f1_spy(a, b):
        threads.append(threading.current_thread().name)
        started.set()
        return real_f1(a, b)

    def waiting_score(a, b):
        assert started.wait(30), "token F1 did not run while BERTScore ran"
        return real_score(a, b)

    monkeypatch.setattr(f1_module, "token_f1", f1_spy)
    monkeypatch.setattr(ref_scorer.matcher, "score", waiting_score)
    rows = ref_scorer.score(["a dog runs on the grass"], references=[["a dog runs", "a dog on grass"]])
    assert "qace" in rows[0] and threads and threads[0].startswith("qace-f1")


@pytest.mark.parametrize(
    ("device", "precision", "bertscore"),
    [("cpu", "bf16", "fp32"), ("cuda", "bf16", "fp16"), ("cuda:1", "fp16", "fp16"), ("cuda", "fp32", "fp32")],
)
def test_bertscore_encoder_is_half_for_half_precision_on_a_gpu(device, precision, bertscore):
    """Half-precision engines on a GPU embed answers in fp16; fp32 engines keep the reference's."""
    assert api.bertscore_precision(QACEConfig(device=device, precision=precision)) == bertscore


def test_warm_up_starts_spacy_then_scores_a_caption_and_captures_nothing_on_the_cpu(ref_scorer, monkeypatch):
    """spaCy's processes start first (beside the graph captures); then one synthetic caption runs through
    every stage, so a first call loads no kernel and allocates no buffer for the first time; the
    processes are ready when it returns."""
    seen: list[str] = []
    real_chunk, real_start = api.score_chunk, ref_scorer.candidates.start

    def score_chunk(records, candidates, *args, **kwargs):
        rows = real_chunk(records, candidates, *args, **kwargs)
        seen.append(f"chain of {len(records)}: {rows[0]['n_questions'] > 0}")
        return rows

    def start(wait: bool = False) -> None:
        seen.append(f"start spaCy processes, wait={wait}")
        real_start(wait)

    monkeypatch.setattr(api, "score_chunk", score_chunk)
    monkeypatch.setattr(ref_scorer.candidates, "start", start)
    assert ref_scorer.warm_up() == 0
    assert seen == [
        "start spaCy processes, wait=False", "chain of 1: True", "start spaCy processes, wait=True"
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("device", "max_rows", "sizes"),
    [("cuda", None, [1, 64, 256, 1024]), ("cuda", 600, [1, 64]), ("cuda", 64, [1]), ("cpu", None, [1])],
)
def test_warm_up_calls_on_a_gpu_are_reward_sized_within_the_captured_rows(
    ref_scorer, monkeypatch, device, max_rows, sizes
):
    """On a GPU the warm-up scores 1 to 1,024 distinct captions (the kernels a call of each size picks),
    but never a batch above the rows its graphs were captured for; elsewhere one caption."""
    import dataclasses

    seen: list[int] = []

    def score_chunk(records, candidates, *args, **kwargs):
        assert len({r.caption for r in records}) == len(records) == len(candidates)
        seen.append(len(records))
        return []

    monkeypatch.setattr(api, "score_chunk", score_chunk)
    monkeypatch.setattr(ref_scorer, "candidates", lambda captions: [[]] * len(captions))
    config = dataclasses.replace(ref_scorer.config, device=device, max_batch_rows=2048)
    monkeypatch.setattr(ref_scorer, "config", config)
    ref_scorer._warm_chain(2048 if max_rows is None else max_rows)
    assert seen == sizes


def test_a_warm_up_freezes_the_heap_and_closing_the_scorer_thaws_it(test_models_dir):
    """After the warm-up, reward calls meet no collection that walks the models (`freeze_heap`); once
    the scorer is closed, what was frozen can be collected again."""
    import gc

    scorer = QACE(models=test_models_dir, variant="ref", progress=False)
    try:
        before = gc.get_freeze_count()  # another test's scorer may have frozen some already
        scorer.warm_up()
        assert gc.get_freeze_count() > before
    finally:
        scorer.close()
    assert gc.get_freeze_count() == 0


def test_caches_of_distinct_captions_give_the_collector_nothing_to_walk(test_models_dir):
    """After the warm-up froze the heap, what a scorer caches per distinct caption (its candidates, its
    prompts' parts) leaves the collector's lists at the next collection, so a long run's full collections
    stay as short as the first: the values are tuples of strings and ints, which CPython stops tracking."""
    import gc

    from qace.engine import prompt_ids

    scorer = QACE(models=test_models_dir, variant="ref", progress=False)
    try:
        scorer.warm_up()
        captions = [f"a dog number {i} runs after {i + 1} red balls" for i in range(40)]
        scorer.score(captions, references=[[f"a dog plays with ball {i}"] for i in range(40)])
        gc.collect()
        candidates = list(scorer.candidates._cache.values())
        parts = [
            ids
            for per_tokenizer in prompt_ids._ENCODERS.values()
            for encoder in per_tokenizer.values()
            for ids in encoder._parts.values()
            if ids is not None
        ]
        assert len(candidates) >= 40 and len(parts) >= 40
        assert not [c for c in candidates if gc.is_tracked(c)]
        assert not [ids for ids in parts if gc.is_tracked(ids)]
    finally:
        scorer.close()


def test_the_warm_up_image_leaves_no_trace(test_models_dir):
    """QACE-Img's warm-up caption reads zero features under an id no store holds; the device's feature
    cache forgets them, and rows after a warm-up equal a cold scorer's."""
    kwargs = dict(models=test_models_dir, variant="img", features=RandomFeatureStore(seed=0), progress=False)
    warm, cold = QACE(**kwargs), QACE(**kwargs)
    warm.warm_up()
    resident = warm.models.vqa.features
    assert resident is not None and resident.uploads == 1 and api._WARM_UP_IMAGE not in resident._slots
    captions, images = ["a dog runs on the grass", "two girls on the beach"], ["i1", "i2"]
    assert warm.score(captions, image_ids=images) == cold.score(captions, image_ids=images)


def _graph_shapes(scorer: QACE) -> int:
    runners = (scorer.models.qg, scorer.models.tqa, scorer.models.vqa)
    return sum(r.decoder._graphs.captures for r in runners if r is not None and r.decoder._graphs)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["ref", "img"])
def test_after_a_warm_up_calls_capture_no_graph_and_score_the_same(test_models_dir, variant):
    """Every batch shape a call can make is captured by `warm_up`; scores are those of a cold scorer.
    One process: the captures are the decoders' own, whichever process plans the batches."""
    words = "a young girl in red dress runs on the beach with two dogs near blue sea".split()
    captions = [" ".join(words[i % 5 : i % 5 + 3 + i % 9]) for i in range(60)]
    kwargs = dict(
        models=test_models_dir,
        variant=variant,
        device="cuda",
        precision="bf16",
        progress=False,
        max_batch_rows=64,
        max_batch_tokens=2048,
        spacy_workers=0,
        host_workers=0,
    )
    context = (
        {"references": [REFS] * 60} if variant == "ref" else {"image_ids": [f"i{i % 7}" for i in range(60)]}
    )
    if variant == "img":
        kwargs["features"] = RandomFeatureStore(seed=0)
    warm, cold = QACE(**kwargs), QACE(**kwargs)
    shapes = warm.warm_up(max_length=64)
    assert shapes > 0 and warm.warm_up(max_length=64) == 0  # the second finds them all
    captured = _graph_shapes(warm)  # the shapes, and any its synthetic calls met beyond them
    warm_rows = warm.score(captions, **context)
    assert _graph_shapes(warm) == captured  # no call captured a shape
    cold_rows = cold.score(captions, **context)
    assert 0 < _graph_shapes(cold) < shapes
    np.testing.assert_allclose([r["qace"] for r in warm_rows], [r["qace"] for r in cold_rows], atol=1e-6)


def test_the_list_api_gives_an_integer_image_id_back_as_an_integer(test_models_dir):
    """#37.8: ``image_ids=[184613]`` (COCO's integers) come back as integers, strings as strings."""
    from qace.data.features import RandomFeatureStore

    scorer = QACE(models=test_models_dir, variant="img", features=RandomFeatureStore(), progress=False)
    rows = scorer.score(["a dog runs", "a cat sleeps"], image_ids=[184613, "184613"])
    assert [r["image_id"] for r in rows] == [184613, "184613"]


def _fetching_a_job_ahead(jobs, *, max_new_tokens):
    """`TorchRunner.generate_jobs`'s order on a GPU, on the CPU: job ``i + 1`` is fetched before job
    ``i``'s result is yielded (while job ``i`` decodes there)."""
    it = iter(jobs)
    job = next(it, None)
    while job is not None:
        runner, key, batch, uid = job
        out = runner.generate(batch, max_new_tokens=max_new_tokens, unanswerable_id=uid)
        job = next(it, None)
        yield key, out


@pytest.mark.parametrize("order", ["one after another", "a job ahead"])
def test_a_large_chunk_parsed_in_two_parts_scores_as_one_part(ref_scorer, monkeypatch, order):
    """With parsing processes and at least `PARTS_MIN_CAPTIONS` distinct captions, a chunk's candidates
    come in two parts, every record of a caption in one of them, and the rows are those of one part:
    the same questions and answers, values within float32's rounding (the parts' answers run in
    batches of their own, which the CPU's products may sum in another order); also where the stream
    fetches a job before it yields the one before, as on a GPU."""
    from qace.engine.torch_runner import TorchRunner
    from qace.metric import candidates as candidates_module
    from qace.metric import pipeline

    if order == "a job ahead":
        monkeypatch.setattr(TorchRunner, "generate_jobs", staticmethod(_fetching_a_job_ahead))

    captions = [json.loads(line) for line in example_path().open()]
    captions = [c for c in captions if c["caption"].strip()]
    captions.append(captions[0])  # a caption twice: both records in the same part
    args = ([c["caption"] for c in captions], [c["references"] for c in captions])
    whole = ref_scorer.score(*args)

    seen = []
    real = pipeline.score_chunk

    def spy(records, candidates, *rest, **kw):
        seen.append(([r.caption for r in records], candidates))
        return real(records, candidates, *rest, **kw)

    monkeypatch.setattr(api, "score_chunk", spy)
    monkeypatch.setattr(candidates_module, "PARTS_MIN_CAPTIONS", 4)
    monkeypatch.setattr(candidates_module.CandidateExtractor, "processes", property(lambda self: 2))
    parted = ref_scorer.score(*args)

    ((texts, parts),) = seen
    assert isinstance(parts, candidates_module.CandidateParts) and len(parts.parts) == 2
    first, second = (set(texts[i] for i in positions) for positions, _ in parts.parts)
    assert first and second and not first & second
    assert sorted(i for positions, _ in parts.parts for i in positions) == list(range(len(texts)))
    values = ("f1", "bs", "an")

    def texts(rows):
        return [
            {**r["explanation"], "questions": [{k: v for k, v in q.items() if k not in values}
                                               for q in r["explanation"]["questions"]]}
            for r in rows
        ]  # fmt: skip

    def numbers(rows):
        return [x for r in rows for q in r["explanation"]["questions"] for k in values for x in q[k]]

    assert texts(parted) == texts(whole)
    assert numbers(parted) == pytest.approx(numbers(whole), abs=2e-6)
    assert [r["qace"] for r in parted] == pytest.approx([r["qace"] for r in whole], abs=2e-6)
    assert [r["id"] for r in parted] == [r["id"] for r in whole]


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["ref", "img"])
def test_on_a_gpu_a_chunk_in_two_parts_asks_and_answers_as_one_part(test_models_dir, monkeypatch, variant):
    """On CUDA (graphs, side-stream encoders, results yielded before the job two after is fetched), each
    part's answers built in the questions' run give the one-part rows' questions and answers (fp32)."""
    from qace.metric import candidates as candidates_module

    words = "a young girl in red dress runs on the beach with two dogs near blue sea".split()
    captions = [" ".join(words[i % 6 : i % 6 + 3 + i % 8]) for i in range(48)]
    kw = dict(models=test_models_dir, variant=variant, device="cuda", precision="fp32", progress=False)
    kw |= dict(explain=True, spacy_workers=0, host_workers=0, max_batch_rows=16, max_batch_tokens=1024)
    context = (
        {"references": [REFS] * 48} if variant == "ref" else {"image_ids": [f"i{i % 5}" for i in range(48)]}
    )
    if variant == "img":
        kw["features"] = RandomFeatureStore(seed=0)
    whole = QACE(**kw).score(captions, **context)
    monkeypatch.setattr(candidates_module, "PARTS_MIN_CAPTIONS", 4)
    monkeypatch.setattr(candidates_module.CandidateExtractor, "processes", property(lambda self: 2))
    seen, real = [], api.score_chunk
    monkeypatch.setattr(
        api,
        "score_chunk",
        lambda records, cands, *a, **k: seen.append(cands) or real(records, cands, *a, **k),
    )
    parted = QACE(**kw).score(captions, **context)
    assert [len(c.parts) for c in seen] == [2]

    def asked(rows):
        fields = ("question", "answer_on_caption", "answers_on_context")
        return [[[q[f] for f in fields] for q in r["explanation"]["questions"]] for r in rows]

    assert asked(parted) == asked(whole)
    np.testing.assert_allclose([r["qace"] for r in parted], [r["qace"] for r in whole], atol=1e-5)


def test_the_parts_joined_put_each_records_candidates_back_in_place():
    """What host processes get for a chunk parsed in parts: one list, once every part is done."""
    from concurrent.futures import Future

    from qace.metric.candidates import CandidateParts

    a, b = Future(), Future()
    joined = CandidateParts([([0, 2], a), ([1, 3], b)]).joined(4)
    a.set_result([["x"], ["z"]])
    assert not joined.done()
    b.set_result([["y"], []])
    assert joined.result(timeout=5) == [["x"], ["y"], ["z"], []]
    c, d = Future(), Future()
    failed = CandidateParts([([0], c), ([1], d)]).joined(2)
    c.set_exception(RuntimeError("the parser died"))
    d.set_result([["w"]])
    with pytest.raises(RuntimeError, match="the parser died"):
        failed.result(timeout=5)
