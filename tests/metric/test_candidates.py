"""Answer candidates: the release's rules; the fast paths (cache, workers, no lemmatizer, numpy's BLAS, the
attribute ruler as lookups) change nothing."""

from __future__ import annotations

import pytest
import spacy

from qace.metric.candidates import (
    DEFAULT_SPACY_MODEL,
    CandidateExtractor,
    balanced_parts,
    extract_candidates,
    load_spacy,
)
from qace.metric.text import filter_stopwords, stopwords
from tests.helpers import flickr_records


def test_entities_first_then_noun_chunks_filtered_and_deduplicated():
    cands = extract_candidates(
        ["Barack Obama walks in Paris with two dogs.", "the the the", "A dog and a dog."]
    )
    assert cands[0] == ["barack obama", "paris", "two", "two dogs"]
    assert cands[1] == []
    assert cands[2] == ["dog"]


def test_stopword_filter_splits_on_single_spaces_like_the_release():
    assert len(stopwords()) == 179
    assert filter_stopwords("The  Red Dress") == " red dress"  # double space keeps an empty word
    assert filter_stopwords("a the of") == ""


def test_fast_paths_equal_the_plain_full_pipeline():
    captions = [r.caption for r in flickr_records(300)] * 2
    full = spacy.load(DEFAULT_SPACY_MODEL)  # lemmatizer included
    expected = extract_candidates(captions, full)
    assert extract_candidates(captions, load_spacy()) == expected
    in_process = CandidateExtractor()
    assert in_process(captions) == expected
    assert in_process(captions[:10]) == expected[:10]  # from the cache
    pooled = CandidateExtractor(workers=2, cache_size=50)
    try:
        assert pooled.processes == 0  # not started: parsed in this process
        pooled.start(wait=True)
        assert pooled.processes == 2
        assert pooled.submit(captions).result() == expected  # split between the two processes
        pooled.limit(1)  # as beside running host processes: one part on one process at a time
        assert pooled.processes == 1
        assert pooled.submit(captions[::-1]).result() == expected[::-1]
        pooled.limit(None)
        assert pooled.processes == 2
    finally:
        pooled.close()
    assert pooled.processes == 0


def test_a_call_is_cut_into_parts_of_about_equal_length_not_of_equal_count():
    captions = ["x" * 50] * 3 + ["y"] * 3  # cut by count: 150 characters against 3
    parts = balanced_parts(captions, 2)
    assert sorted(i for part in parts for i in part) == list(range(6))  # every caption once
    assert all(part == sorted(part) for part in parts)  # in the call's order within a part
    assert max(sum(len(captions[i]) for i in part) for part in parts) == 100
    assert parts == [[0, 2], [1, 3, 4, 5]]  # longest first, each to the lightest part, ties to the lower
    assert balanced_parts(captions, 14) == [[i] for i in range(6)]  # never an empty part
    assert balanced_parts([], 4) == [] and balanced_parts(["a", "b"], 1) == [[0, 1]]
    with pytest.raises(ValueError, match="at least 1"):
        balanced_parts(captions, 0)


def test_the_pipeline_multiplies_through_numpys_blas_not_blis():
    nlp = load_spacy()
    layers = [layer for _, pipe in nlp.pipeline if hasattr(pipe, "model") for layer in pipe.model.walk()]
    assert not nlp.get_pipe("tok2vec").model.ops.use_blis
    assert sum(not layer.ops.use_blis for layer in layers) > len(layers) // 2


def test_the_parse_runs_blas_on_one_thread_and_gives_the_threads_back():
    from threadpoolctl import threadpool_info, threadpool_limits

    def blas_threads() -> list[int]:
        return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]

    seen: list[list[int]] = []
    nlp = load_spacy()

    class Recording:
        def pipe(self, captions, batch_size):
            for caption in captions:
                seen.append(blas_threads())
                yield nlp(caption)

    with threadpool_limits(limits=2, user_api="blas"):
        assert blas_threads() and set(blas_threads()) == {2}
        assert extract_candidates(["a dog", "a cat"], Recording()) == [["dog"], ["cat"]]
        assert blas_threads() and set(blas_threads()) == {2}
    assert seen == [[1] * len(blas_threads())] * 2


def test_parsing_processes_end_with_the_process_that_started_them(tmp_path):
    """#37.6: kill -9 of a scorer's process (a `--gpus` shard worker, say) leaves no spaCy process."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    script = tmp_path / "parse.py"
    script.write_text(
        "import sys, time\n"
        "from qace.metric.candidates import CandidateExtractor\n"
        "if __name__ == '__main__':\n"
        "    extractor = CandidateExtractor(workers=1)\n"
        "    extractor.start(wait=True)\n"
        "    print(*extractor._pool.pids, flush=True)\n"
        "    time.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert pids
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)

    def alive(pid: int) -> bool:
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    assert not any(alive(p) for p in pids), os.popen("ps -ef").read()
