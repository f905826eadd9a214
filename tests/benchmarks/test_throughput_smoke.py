"""``benchmarks/throughput.py --tiny``: every section runs, the report merges across invocations, the
baseline does the engine's work (fp32: the same scores), and the workload is what it claims."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks import hf_batched, throughput
from benchmarks.workload import distinct_captions, pascal_workload
from tests.helpers import SHARED_DATA

N, CLI_N, CHUNK = 8, 24, 8


@pytest.fixture(scope="module")
def report(tiny_models: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if not (SHARED_DATA / "pascal50s").is_dir():
        pytest.skip("PASCAL-50S not in the shared data")
    out = tmp_path_factory.mktemp("throughput") / "throughput.json"
    common = ["--tiny", "--out", str(out), "--models-dir", str(tiny_models), "--captions", str(N)]
    common += ["--warmup", "4", "--chunk-size", str(CHUNK), "--baseline-spacy-processes", "1"]
    argv = [*common, "--variant", "img", "--cli-captions", str(CLI_N), "--profile-captions", "4"]
    assert throughput.main(argv) == 0
    # a second invocation adds a section of another variant to the same file
    assert throughput.main([*common, "--variant", "ref", "--skip-engine", "--skip-cli"]) == 0
    return json.loads(out.read_text())


def test_sections_and_merge(report: dict[str, Any]) -> None:
    assert report["workload"]["captions"] == report["workload"]["distinct_captions"] == N
    assert len(report["runs"]) == 2 and report["command"].endswith("--skip-engine --skip-cli")
    img, ref = (next(e for e in report["results"] if e["variant"] == v) for v in ("img", "ref"))
    assert img["workload"] == ref["workload"] == "distinct"
    assert set(img) >= {"engine", "baseline", "cli", "speedup_vs_baseline"}
    assert "engine" not in ref and "cli" not in ref and "speedup_vs_baseline" not in ref
    engine, baseline, cli = img["engine"], img["baseline"], img["cli"]
    assert engine["captions_per_s"] > 0 and engine["cold_captions_per_s"] > 0
    assert len(engine["pass_seconds"]) == 1 and engine["warm_up_captions"] == 4
    assert set(engine["mfu"]) >= {"qg", "tqa", "vqa"} and engine["mfu"]["captions"] == 4
    assert engine["mfu"]["graph_captures_in_profiled_pass"] == 0  # no CUDA graphs on the CPU
    assert img["speedup_vs_baseline"] == engine["captions_per_s"] / baseline["captions_per_s"]
    # both systems ran the same distinct rows per model
    assert baseline["rows_per_stage_after_dedup"] == engine["rows_per_stage_after_dedup"]
    assert baseline["warm_up_captions"] == 4  # --warmup's 4 other captions (the default asks for 256)
    assert baseline["spacy_load"] == {"blis": True, "pos_rules": False}  # spaCy's own load, not qace's
    assert 0 < baseline["generate_bound_fraction"] and set(baseline["generate_bound"]) >= {"qg", "tqa", "vqa"}
    for stage in ("qg", "tqa", "vqa"):  # where each baseline stage's wall went
        parts = baseline["generate_bound"][stage]["stage_parts_seconds"]
        assert set(parts) == {"tokenize", "generate", "wait_inputs", "decode"}
        assert sum(parts.values()) <= baseline["generate_bound"][stage]["stage_seconds"]
    assert cli["captions"] == CLI_N and cli["captions_per_s"] > 0 and cli["in_process_captions_per_s"] > 0
    assert cli["fraction_of_in_process"] == cli["captions_per_s"] / cli["in_process_captions_per_s"]
    assert cli["steady_rows"] == CLI_N - CHUNK
    # where the time went: every scorer stage of both processes, the file loop only in qace score's
    for breakdown in (cli["breakdown"], cli["in_process_breakdown"]):
        assert set(breakdown["stages"]) >= {"prepare", "candidates", "questions", "answers", "bertscore"}
        assert all(s["wall"] >= 0 and s["cpu"] >= 0 for s in breakdown["stages"].values())
    assert cli["breakdown"]["consumer_seconds"] > cli["in_process_breakdown"]["consumer_seconds"]
    for breakdown in (cli["breakdown"], cli["in_process_breakdown"]):  # the steady window is part of the run
        steady = breakdown["steady"]
        assert 0 < steady["main_thread_cpu_seconds"] < breakdown["main_thread_cpu_seconds"]
        assert 0 < steady["stages"]["questions"]["wall"] < breakdown["stages"]["questions"]["wall"]
    assert set(ref["baseline"]["rows_per_stage_after_dedup"]) == {"qg", "tqa"}


def test_baseline_does_the_engines_work(report: dict[str, Any]) -> None:
    """fp32, the same forced outputs: the baseline's scores are the engine's up to rounding."""
    img = next(e for e in report["results"] if e["variant"] == "img")
    assert img["baseline"]["max_abs_qace_diff_vs_engine"] < 1e-6


def test_pascal_workload() -> None:
    if not (SHARED_DATA / "pascal50s").is_dir():
        pytest.skip("PASCAL-50S not in the shared data")
    records = pascal_workload(SHARED_DATA, 48_715 + 300, seed=0)
    first, again = records[:48_715], records[48_715:]
    assert distinct_captions(first) == 48_715 and distinct_captions(records) == 48_715
    assert len({r.id for r in records}) == len(records)
    from scipy.io import loadmat

    mat = loadmat(SHARED_DATA / "pascal50s" / "pascal50S.mat", squeeze_me=True, struct_as_record=False)
    by_image = {str(e.image): {str(s).strip() for s in e.sent} for e in mat["refs"]}
    for r in records[:2000] + again:
        assert len(r.references) == 5 and len(set(r.references)) == 5 and r.caption not in r.references
        assert set(r.references) <= by_image[r.image_id]  # other captions of the record's image
    own = {r.caption: r.image_id for r in first}
    assert sum(own[r.caption] != r.image_id for r in again) > 250  # reused captions meet other images
    assert pascal_workload(SHARED_DATA, 50, seed=0) == pascal_workload(SHARED_DATA, 50, seed=0)


def test_aggregate_is_the_mean_over_contexts_of_the_mean_over_questions() -> None:
    rng = np.random.default_rng(0)
    owner = rng.integers(0, 6, size=60)
    context = rng.integers(0, 3, size=60)
    values = rng.random(60)
    got = hf_batched.aggregate(values, owner, context, 8)
    for i in range(8):
        per = [
            values[(owner == i) & (context == k)].mean()
            for k in range(3)
            if ((owner == i) & (context == k)).any()
        ]
        assert got[i] == pytest.approx(np.mean(per) if per else 0.0)


def test_steady_rate_leaves_out_the_first_chunk() -> None:
    stamps = [[8, 10.0], [16, 11.0], [24, 12.0], [30, 12.5]]
    steady = throughput._steady(stamps, end=13.0, chunk=8)
    assert steady["rows"] == 22 and steady["seconds"] == 3.0
    assert np.isnan(throughput._steady([[5, 1.0]], end=2.0, chunk=8)["captions_per_s"])


def test_reset_caches_empties_every_engine_cache(test_models_dir: Path) -> None:
    from benchmarks.workload import reset_caches
    from qace.api import QACE
    from qace.data.features import RandomFeatureStore
    from qace.engine import prompt_ids

    scorer = QACE(models=test_models_dir, variant="img", features=RandomFeatureStore(seed=0), progress=False)
    scorer.score(["a dog runs on the grass", "two girls play ball"], image_ids=["i1", "i2"])

    def parts() -> int:
        return sum(len(e._parts) for per in prompt_ids._ENCODERS.values() for e in per.values())

    assert parts() > 0 and len(scorer.candidates._cache) == 2 and scorer.models.vqa.features is not None
    reset_caches(scorer)
    assert parts() == 0 and len(scorer.candidates._cache) == 0 and scorer.models.vqa.features is None


def test_engine_core_against_the_single_process_design(tiny_models: Path, tmp_path: Path) -> None:
    """With host processes the engine section also times the single-process design on the same models
    (the same rows: fp32) and replays the pass's device work alone."""
    if not (SHARED_DATA / "pascal50s").is_dir():
        pytest.skip("PASCAL-50S not in the shared data")
    out = tmp_path / "throughput.json"
    argv = ["--tiny", "--out", str(out), "--models-dir", str(tiny_models), "--captions", str(N)]
    argv += ["--warmup", "4", "--chunk-size", "4", "--variant", "ref", "--host-workers", "2"]
    argv += ["--skip-baseline", "--skip-cli", "--profile-captions", "0"]
    assert throughput.main(argv) == 0
    (entry,) = json.loads(out.read_text())["results"]
    engine = entry["engine"]
    assert engine["host_workers"] == 2
    assert engine["single_process"]["captions_per_s"] > 0
    assert engine["single_process"]["rows_differing_from_engine"] == [0]
    assert engine["speedup_vs_single_process"] == engine["single_process"]["seconds"] / engine["seconds"]
    alone = engine["models_alone"]
    assert alone["requests"] > 0 and alone["captions_per_s"] > 0
    assert 0 < alone["models_only_seconds"] and 0 < alone["bertscore_only_seconds"]
    assert alone["whole_chunks_seconds"] > 0 and alone["whole_chunks_requests"] > 0
    assert engine["fraction_of_models_alone"] == engine["captions_per_s"] / alone["captions_per_s"]
