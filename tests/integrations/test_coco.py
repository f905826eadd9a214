"""pycocoevalcap door: QACEScorer in a COCOEvalCap-style loop; raw, annotation-dict, PTB-tokenised input."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from qace.api import QACE
from qace.errors import ConfigError, InputError
from qace.integrations.coco import QACEScorer

GTS = {
    391895: [
        "A man with a red helmet on a small moped on a dirt road.",
        "Man riding a motor bike on a dirt road.",
    ],
    522418: [
        "A woman wearing a net on her head cutting a cake.",
        "A woman cutting a large white sheet cake.",
    ],
    184613: [
        "A child holding a flowered umbrella and petting a yak.",
        "A young boy holding an umbrella next to a herd of cattle.",
    ],
}
RES = {
    391895: ["a man rides a motorcycle on a dirt road"],
    522418: ["a woman cuts a cake in the kitchen"],
    184613: ["a boy with an umbrella stands next to cows"],
}


@pytest.fixture(scope="module")
def scorer(test_models_dir: Path) -> QACEScorer:
    return QACEScorer(models=test_models_dir)


def test_scores_equal_the_engine_in_gts_order(scorer: QACEScorer, test_models_dir: Path) -> None:
    score, scores = scorer.compute_score(GTS, RES)
    ids = list(GTS)
    rows = QACE(models=test_models_dir, progress=False).score(
        [RES[i][0] for i in ids], references=[GTS[i] for i in ids]
    )
    assert scores.tolist() == pytest.approx([r["qace"] for r in rows], abs=1e-6)
    assert score == pytest.approx(float(np.mean(scores)))
    assert scorer.last_components["qace_f1"].tolist() == pytest.approx([r["qace_f1"] for r in rows], abs=1e-6)
    assert scorer.method() == "QACE-Ref"
    # COCOEvalCap pairs scores with gts' key order; a reordered gts reorders the scores
    reversed_gts = dict(reversed(list(GTS.items())))
    _, again = scorer.compute_score(reversed_gts, RES)
    assert again.tolist() == pytest.approx(scores[::-1].tolist(), abs=1e-6)


def test_annotation_dicts_equal_strings(scorer: QACEScorer) -> None:
    gts = {k: [{"image_id": k, "id": n, "caption": c} for n, c in enumerate(v)] for k, v in GTS.items()}
    res = {k: [{"image_id": k, "caption": v[0]}] for k, v in RES.items()}
    assert scorer.compute_score(gts, res)[1].tolist() == pytest.approx(
        scorer.compute_score(GTS, RES)[1].tolist(), abs=1e-6
    )


def test_cocoevalcap_loop_with_ptb_tokenizer(scorer: QACEScorer) -> None:
    """The COCOEvalCap.evaluate loop as pycocoevalcap writes it: PTB-tokenise, then every scorer."""
    if shutil.which("java") is None:
        pytest.skip("pycocoevalcap's PTBTokenizer needs Java (install a JRE: apt-get install default-jre)")
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    tokenizer = PTBTokenizer()
    gts = tokenizer.tokenize({k: [{"caption": c} for c in v] for k, v in GTS.items()})
    res = tokenizer.tokenize({k: [{"caption": c} for c in v] for k, v in RES.items()})
    assert res[522418] == ["a woman cuts a cake in the kitchen"]  # tokenised as the scorers receive it
    evaluations: dict[str, float] = {}
    per_image: dict[int, dict[str, float]] = {}
    for metric, method in [
        (Bleu(4), ["Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4"]),
        (Cider(), "CIDEr"),
        (scorer, scorer.method()),
    ]:
        score, scores = metric.compute_score(gts, res)
        for name, value, values in zip(*_as_lists(method, score, scores), strict=True):
            evaluations[name] = value
            for image_id, v in zip(gts.keys(), values, strict=True):
                per_image.setdefault(image_id, {})[name] = v
    assert set(evaluations) == {"Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4", "CIDEr", "QACE-Ref"}
    assert 0.0 < evaluations["QACE-Ref"] <= 1.0
    _, direct = scorer.compute_score({k: list(v) for k, v in gts.items()}, res)
    assert [per_image[k]["QACE-Ref"] for k in gts] == pytest.approx(direct.tolist())


def _as_lists(method, score, scores):  # noqa: ANN001, ANN202
    """COCOEvalCap's own branch: Bleu returns lists of four, the others one value."""
    return (method, score, scores) if isinstance(method, list) else ([method], [score], [scores])


def test_bad_input_names_the_image(scorer: QACEScorer) -> None:
    with pytest.raises(InputError, match="only in gts"):
        scorer.compute_score(GTS, {391895: RES[391895]})
    with pytest.raises(InputError, match="exactly one caption.*|.*'522418'"):
        scorer.compute_score(GTS, {**RES, 522418: ["one", "two"]})
    with pytest.raises(InputError, match="'184613'.*non-empty reference"):
        scorer.compute_score({**GTS, 184613: []}, RES)
    with pytest.raises(InputError, match="lists of captions"):
        scorer.compute_score(GTS, {**RES, 184613: "a bare string"})
    with pytest.raises(ConfigError, match="variant"):
        QACEScorer(variant="both")


def test_empty_caption_scores_zero(scorer: QACEScorer) -> None:
    _, scores = scorer.compute_score(GTS, {**RES, 522418: [""]})
    assert scores[1] == 0.0 and scores[0] > 0.0


def test_qace_img_reads_res_ids_as_image_ids(test_models_dir: Path) -> None:
    from qace.data.features import RandomFeatureStore

    features = RandomFeatureStore(seed=0)
    scorer = QACEScorer(models=test_models_dir, variant="img", features=features)
    assert scorer.method() == "QACE-Img"
    _, scores = scorer.compute_score(GTS, RES)
    ids = list(GTS)
    engine = QACE(models=test_models_dir, variant="img", features=features, progress=False)
    rows = engine.score([RES[i][0] for i in ids], image_ids=[str(i) for i in ids])
    assert scores.tolist() == pytest.approx([r["qace"] for r in rows], abs=1e-6)


def test_example_runs(test_models_dir: Path) -> None:
    if shutil.which("java") is None:
        pytest.skip("pycocoevalcap's PTBTokenizer needs Java (install a JRE: apt-get install default-jre)")
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, str(repo / "examples" / "coco_eval.py"), "--models", str(test_models_dir)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(repo)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert any(line.startswith("CIDEr: ") for line in lines)
    qace = [line for line in lines if line.startswith("QACE-Ref: ")]
    per_image = [
        float(line.split()[2]) for line in lines if line.startswith(("391895:", "522418:", "184613:"))
    ]
    assert len(qace) == 1 and len(per_image) == 3
    assert float(qace[0].split()[1]) == pytest.approx(sum(per_image) / 3, abs=1e-3)
