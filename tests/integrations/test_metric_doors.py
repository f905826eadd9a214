"""The pycocoevalcap and torchmetrics doors for any registered metric: CLIP-S and RefCLIP-S on the
tiny random CLIP give the engine's scores (QACE's own doors: test_coco.py, test_torchmetrics.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("PIL")

from qace.errors import InputError  # noqa: E402
from qace.integrations.coco import MetricScorer  # noqa: E402
from qace.judges.clip import ClipScore  # noqa: E402

IMAGES = Path(__file__).resolve().parents[2] / "qace" / "examples" / "images"
GTS = {
    "dog": ["a brown dog jumps to catch a frisbee", "a dog leaps after a yellow frisbee"],
    "beach": ["a girl in a red dress runs on the beach"],
    "bike": ["a red bike leans on a wall", "a bicycle parked by a wall"],
}
RES = {"dog": ["a dog catches a frisbee"], "beach": ["a child runs by the sea"], "bike": ["a red bike"]}


def _engine(clip_dir: Path, references: bool) -> list[dict]:
    ids = list(GTS)
    return ClipScore(model=str(clip_dir), references=references).score(
        [RES[i][0] for i in ids],
        images=[str(IMAGES / f"{i}.png") for i in ids],
        references=[GTS[i] for i in ids],
    )


def test_pycocoevalcap_door_scores_refclip_s_by_image_id(clip_dir):
    scorer = MetricScorer("refclip-s", model=str(clip_dir), images=str(IMAGES))
    score, scores = scorer.compute_score(GTS, RES)
    rows = _engine(clip_dir, references=True)
    assert scores.tolist() == pytest.approx([r["refclip_s"] for r in rows], abs=1e-6)
    assert score == pytest.approx(float(np.mean(scores)))
    assert scorer.method() == "RefCLIP-S" and set(scorer.last_components) == {"clip_s", "clip_ref"}
    with pytest.raises(InputError, match="kitchen2"):
        scorer.compute_score({**GTS, "kitchen2": ["x"]}, {**RES, "kitchen2": ["a kitchen"]})


def test_torchmetrics_door_scores_clip_s_from_image_files(clip_dir):
    from qace.integrations.torchmetrics import QACEScore

    metric = QACEScore(metric="clip-s", per_sample=True, model=str(clip_dir))
    ids = list(GTS)
    metric.update([RES[i][0] for i in ids[:2]], [str(IMAGES / f"{i}.png") for i in ids[:2]])
    metric.update([RES[ids[2]][0], ""], [str(IMAGES / f"{ids[2]}.png")] * 2)
    out = metric.compute()
    want = [r["clip_s"] for r in _engine(clip_dir, references=False)]
    assert out["clip_s_per_sample"].tolist() == pytest.approx([*want, 0.0], abs=1e-6)  # empty caption: 0
    assert float(out["clip_s"]) == pytest.approx(sum(want) / 4, abs=1e-6)
    metric.reset()
    metric.update(["a dog"], [str(IMAGES / "missing.png")])
    with pytest.raises(InputError, match="missing.png"):
        metric.compute()


def test_hugging_face_evaluate_door_scores_clip_s(clip_dir, tmp_path, monkeypatch):
    evaluate = pytest.importorskip("evaluate")
    from qace.integrations import evaluate_metric_path

    for name in ("HF_HUB_OFFLINE", "HF_EVALUATE_OFFLINE"):
        monkeypatch.setenv(name, "1")
    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "modules"))
    monkeypatch.setattr(evaluate.config, "HF_EVALUATE_OFFLINE", True)
    metric = evaluate.load(str(evaluate_metric_path()), cache_dir=str(tmp_path / "cache"))
    ids = list(GTS)
    out = metric.compute(
        predictions=[RES[i][0] for i in ids],
        references=[str(IMAGES / f"{i}.png") for i in ids],
        metric="clip-s",
        model=str(clip_dir),
    )
    want = [r["clip_s"] for r in _engine(clip_dir, references=False)]
    assert out["scores"] == pytest.approx(want, abs=1e-6)
    assert out["clip_s"] == pytest.approx(sum(want) / 3) and out["signature"].startswith("CLIP-S|")
