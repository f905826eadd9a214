"""`benchmarks.spacy_parse` on a few captions: each pipeline in a parsing process, and their agreement."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from benchmarks import spacy_parse


def test_a_small_run_times_each_pipeline_and_compares_their_parses(tmp_path: Path) -> None:
    out = tmp_path / "spacy.json"
    argv = ["--captions", "40", "--speed-captions", "32", "--task", "16", "--rounds", "2", "--out", str(out)]
    argv += ["--parallel-processes", "2", "--parallel-calls", "7", "--parallel-repeats", "2"]
    assert spacy_parse.main(argv) == 0
    record = json.loads(out.read_text())
    assert record["command"].startswith("python -m benchmarks.spacy_parse") and record["commit"]
    assert record["speed_captions"] == 32 and record["versions"]["thinc"]
    assert list(spacy_parse.PIPELINES) == ["spacy", "numpy_blas", "qace"]
    for name in spacy_parse.PIPELINES:
        cell = record["speed"][name]
        assert len(cell["rounds_ms_per_caption"]) == 2 and cell["ms_per_caption"] > 0
        assert 0 < cell["ms_per_caption_inside"] and cell["gemm_gflops"] > 0
    for name in ("numpy_blas", "qace"):
        ratio = record["speed"]["spacy"]["ms_per_caption"] / record["speed"][name]["ms_per_caption"]
        assert record["speed"][f"spacy_over_{name}"] == ratio
    assert record["agreement"]["captions"] == 40
    fields = ("coarse_tags", "tags", "dependency_labels", "heads", "entities", "candidates")
    assert record["agreement"]["differing_from_spacy"] == {
        name: dict.fromkeys(fields, 0) for name in ("numpy_blas", "qace")
    }
    # a call of 7 captions cut in two parts each way, each part timed inside its process on the host's clock
    cell = record["parallel"]["2_processes_7_captions"]
    assert (cell["processes"], cell["captions"]) == (2, 7)
    assert 3 <= cell["by_count"]["longest_part_captions"] <= 4  # parts of 4 and 3 captions (a median)
    for split in ("balanced", "by_count"):
        timed = cell[split]
        assert timed["parts"] == 2 and len(timed["calls_wall_ms"]) == 2
        assert timed["wall_ms"] == statistics.median(timed["calls_wall_ms"])
        assert 0 < timed["first_back_ms"] <= timed["wall_ms"]
        assert 0 < timed["shortest_parse_ms"] <= timed["longest_parse_ms"] <= timed["wall_ms"]
        assert timed["longest_wait_to_begin_ms"] >= 0 and timed["longest_wait_for_result_ms"] >= 0
        assert timed["longest_part_alone_ms"] > 0 and timed["longest_part_characters"] > 0


def test_the_splits_cut_a_call_as_the_extractor_does_and_as_it_did() -> None:
    call = ["a" * 40, "b" * 40, "c" * 40, "d", "e", "f"]
    assert spacy_parse.SPLITS["by_count"](call, 2) == [call[:3], call[3:]]
    assert spacy_parse.SPLITS["balanced"](call, 2) == [["a" * 40, "c" * 40], ["b" * 40, "d", "e", "f"]]
    for split in spacy_parse.SPLITS.values():
        assert sorted(c for part in split(call, 4) for c in part) == sorted(call)
