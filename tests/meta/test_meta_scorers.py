"""``qace meta report --with-scorers``: QACE rows in Table 1 from one command (here on the test models)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qace.meta.cli import main


def _args(shared_data: Path, tmp_path: Path, *extra: str) -> list[str]:
    return [
        "report",
        "--data-dir",
        str(shared_data),
        "--metrics",
        "--seeds",
        "0",
        "1",
        "--bootstrap",
        "10",
        "--no-plots",
        "--out",
        str(tmp_path / "report"),
        "--cache-dir",
        str(tmp_path / "cache"),
        *extra,
    ]


def test_report_with_scorers_adds_cached_rows(
    shared_data: Path,
    test_models_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = _args(
        shared_data, tmp_path, "--with-scorers", "qace-ref", "--models", str(test_models_dir), "--limit", "16"
    )
    assert main(args) == 0
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    flickr = report["flickr8k_expert"]
    assert flickr["n_captions"] == 16 and list(flickr["metrics"]) == ["qace-ref"]
    assert -1 <= flickr["metrics"]["qace-ref"]["correlations"]["kendall_c"]["value"] <= 1
    pascal = report["pascal50s"]["accuracy"]["qace-ref"]
    assert report["pascal50s"]["n_pairs"] == 16 and set(pascal["per_seed"]) == {"0", "1"}
    assert 0 <= pascal["mean"]["mean"] <= 100 and "sd" in pascal and "ci" in pascal
    md = (tmp_path / "report" / "report.md").read_text()
    assert "| QACE-Ref |" in md and "TINY TEST MODELS" in md and "--limit 16" in md
    assert len(list((tmp_path / "cache").glob("qace-ref-*.npy"))) == 3  # Flickr8k, PASCAL-50S seed 0 and 1

    # a second report reads the cached scores: the scorer is never asked again
    from qace.api import QACE

    def refuse(*_a: object, **_k: object) -> None:
        raise AssertionError("scored again despite the cache")

    monkeypatch.setattr(QACE, "score", refuse)
    assert main(args) == 0
    again = json.loads((tmp_path / "report" / "report.json").read_text())
    assert again["pascal50s"]["accuracy"]["qace-ref"]["mean"] == pascal["mean"]
    capsys.readouterr()


def test_with_scorers_is_checked_before_any_model_loads(
    shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(_args(shared_data, tmp_path, "--with-scorers", "qace-img", "--models", "/nonexistent")) == 2
    assert "qace-img needs the region features" in capsys.readouterr().err
    assert main(_args(shared_data, tmp_path, "--limit", "0")) == 2
    assert "--limit must be at least 1" in capsys.readouterr().err


def test_report_with_image_scorers_reads_the_images_by_id(
    shared_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--with-scorers clip-s refclip-s --images DIR``: each caption's image is found by its image id
    (here every id links to one drawn picture), the rows sit in Table 1 beside the published values."""
    pytest.importorskip("PIL")
    from PIL import Image

    from qace.meta.datasets import load_flickr8k_expert
    from qace.testing.clip import make_clip_test_model

    clip = make_clip_test_model(tmp_path / "clip")
    images = tmp_path / "images"
    images.mkdir()
    picture = tmp_path / "picture.png"
    Image.new("RGB", (40, 30), "#4caf50").save(picture)
    for image_id in set(load_flickr8k_expert(shared_data, standard=True).image_ids):
        (images / f"{Path(image_id).stem}.png").symlink_to(picture)
    base = _args(shared_data, tmp_path, "--datasets", "flickr8k", "--limit", "16")
    argv = [*base, "--with-scorers", "clip-s", "refclip-s", "--images", str(images)]
    assert main([*argv, "--scorer-setting", f"model={clip}"]) == 0
    report = json.loads((tmp_path / "report" / "report.json").read_text())
    metrics = report["flickr8k_expert"]["metrics"]
    assert list(metrics) == ["clip-s", "refclip-s"]
    for name in metrics:
        assert -1 <= metrics[name]["correlations"]["kendall_c"]["value"] <= 1
    md = (tmp_path / "report" / "report.md").read_text()
    assert "| CLIP-S |" in md and "(51.2)" in md and "| RefCLIP-S |" in md and "(53.0)" in md
    capsys.readouterr()
    assert main([*base, "--with-scorers", "clip-s"]) == 2  # no --images: refused before loading
    assert "clip-s read the benchmark images: pass --images" in capsys.readouterr().err
