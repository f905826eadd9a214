"""``benchmarks/backends.py --tiny --records FILE``: both backends in one run on a given workload, as JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime")

from benchmarks import backends  # noqa: E402
from tests.helpers import flickr_records  # noqa: E402

N = 6


def _argv(models: Path, source: Path) -> list[str]:
    argv = ["--tiny", "--records", str(source), "--models-dir", str(models), "--device", "cpu"]
    argv += ["--precision", "fp32", "--variants", "ref", "--spacy-workers", "0"]
    return argv + ["--batch-rows", "64", "--batch-tokens", "4096", "--chunk-size", "64"]


@pytest.fixture(scope="module")
def together(tiny_models: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[list[str], Path]:
    """Both backends in this process on ``N`` Flickr8k records: the run's arguments and its report."""
    records = flickr_records(N, refs=5)
    work = tmp_path_factory.mktemp("backends")
    source = work / "distinct.jsonl"
    rows = [
        {"id": r.id, "caption": r.caption, "image_id": r.image_id, "references": list(r.references)}
        for r in records
    ]
    source.write_text("".join(json.dumps(row) + "\n" for row in rows))
    argv, out = _argv(tiny_models, source), work / "together.json"
    assert backends.main([*argv, "--out", str(out)]) == 0
    return argv, out


def test_records_workload_runs_both_backends(together: tuple[list[str], Path]) -> None:
    argv, out = together
    records = flickr_records(N, refs=5)
    report = json.loads(out.read_text())
    assert report["workload"] == argv[argv.index("--records") + 1]
    assert report["captions"] == N and report["distinct_captions"] == len({r.caption for r in records})
    (entry,) = report["results"]
    assert entry["torch"]["captions_per_s"] > 0 and entry["onnx"]["captions_per_s"] > 0
    for backend in ("torch", "onnx"):  # the batches given on the command line, as each ran them
        assert (entry[backend]["batch_rows"], entry[backend]["batch_tokens"]) == (64, 4096)
    assert entry["mean_abs_qace_diff"] < 1e-5  # fp32 on both sides, same forced outputs
    assert entry["onnx_decoding"] == {role: {"static_cache": False} for role in ("qg", "tqa")}  # the CPU's


def test_bad_record_is_named(tmp_path: Path) -> None:
    source = tmp_path / "bad.jsonl"
    source.write_text('{"id": "x1", "caption": ""}\n')
    with pytest.raises(SystemExit, match="x1"):
        backends.main(["--tiny", "--records", str(source), "--out", str(tmp_path / "o.json")])


def test_isolated_backends_give_the_same_scores(together: tuple[list[str], Path], tmp_path: Path) -> None:
    """``--isolate`` runs each backend in a child process: the same figures come back to one report."""
    argv, out = together
    apart = tmp_path / "apart.json"
    assert backends.main([*argv, "--isolate", "--out", str(apart)]) == 0
    (a,), (b,) = (json.loads(p.read_text())["results"] for p in (out, apart))
    for backend in ("torch", "onnx"):
        assert a[backend]["mean_qace"] == b[backend]["mean_qace"]
    assert a["mean_abs_qace_diff"] == b["mean_abs_qace_diff"] and a["onnx_decoding"] == b["onnx_decoding"]


def test_a_failing_backend_is_reported_and_the_run_goes_on(
    tiny_models: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child whose backend fails (an out-of-memory, say) writes the error; the parent reports it for that
    backend, leaves out the ratio it cannot form, and finishes the other backends."""
    records = flickr_records(4, refs=5)
    source = tmp_path / "distinct.jsonl"
    source.write_text(
        "".join(
            json.dumps({"id": r.id, "caption": r.caption, "references": list(r.references)}) + "\n"
            for r in records
        )
    )
    argv = ["--tiny", "--records", str(source), "--models-dir", str(tiny_models), "--device", "cpu"]
    argv += ["--precision", "fp32", "--variants", "ref", "--spacy-workers", "0"]

    def out_of_memory(*args: object, **kwargs: object) -> None:
        raise RuntimeError(
            "Error in execution:\nFailed to allocate memory for requested buffer of size 134215680"
        )

    monkeypatch.setattr(backends, "measure", out_of_memory)
    child_out = tmp_path / "child.json"
    assert backends.main([*argv, "--child", "onnx:ref", str(child_out)]) == 0
    child = json.loads(child_out.read_text())
    assert (
        child["result"]["error"]
        == "RuntimeError: Failed to allocate memory for requested buffer of size 134215680"
    )
    assert child["scores"] is None

    ok = ({"captions_per_s": 1.0}, backends.np.zeros(4), None)
    monkeypatch.setattr(
        backends, "_in_child", lambda backend, *a: ok if backend == "torch" else (child["result"], None, None)
    )
    out = tmp_path / "report.json"
    assert backends.main([*argv, "--isolate", "--out", str(out)]) == 0
    (entry,) = json.loads(out.read_text())["results"]
    assert entry["onnx"] == child["result"] and "onnx_vs_torch" not in entry
