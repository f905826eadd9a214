"""QACE as a Hugging Face ``evaluate`` metric: ``evaluate.load("path/to/qace_metric")``.

``compute(predictions=[...], references=[...], **settings)`` scores through qace's shared engine
(`qace.integrations.shared.shared_reward`): the same scorer as the pycocoevalcap and torchmetrics
doors, its models loaded once per process for the same settings. ``settings`` are `qace.api.QACE`
keyword arguments (``models=DIR``, ``variant="img"``, ``features=...``, ``device="cuda"``, ...).
``metric="clip-s"`` (any registered metric) scores that metric instead, ``references`` holding what it
reads (CLIP-S: one image file per prediction) and ``settings`` its scorer's keyword arguments.
"""

from __future__ import annotations

from typing import Any

import datasets
import evaluate

from qace.integrations.shared import PARTS, check_settings, metric_rows, shared_reward, shared_scorer

_DESCRIPTION = """QACE (Lee et al., 2021) asks questions about a caption and compares the answers on the
caption with the answers on its references (QACE-Ref) or on its image (QACE-Img): token F1, BERTScore
and answerability, averaged. Implemented by the `qace` engine."""

_KWARGS_DESCRIPTION = """
Args:
    predictions: list of captions (str).
    references: QACE-Ref: one list of reference captions (or one reference string) per prediction;
        QACE-Img (variant="img"): one image id per prediction, looked up in `features`.
    variant: "ref" (default) or "img".
    metric: another registered metric ("clip-s", "pac-s", ...): references are then what it reads per
        prediction (CLIP-S: an image file path), and settings its scorer's keyword arguments.
    **settings: qace.QACE keyword arguments (models, qg, tqa, vqa, features, device, precision, ...).
Returns:
    qace: mean QACE; qace_f1, qace_bs, qace_an: means of its three components;
    scores: QACE per prediction, in order; signature: the score signature (compare only equal ones).
An empty or non-string prediction scores 0.0.
Example:
    >>> qace = evaluate.load("path/to/qace_metric")
    >>> qace.compute(predictions=["a dog runs"], references=[["a brown dog running in a field"]])
"""

_CITATION = """@inproceedings{lee-etal-2021-qace,
  title = "{QACE}: Asking Questions to Evaluate an Image Caption",
  author = "Lee, Hwanhee and Scialom, Thomas and Yoon, Seunghyun and Dernoncourt, Franck and Jung, Kyomin",
  booktitle = "Findings of the Association for Computational Linguistics: EMNLP 2021",
  year = "2021",
}"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class QACEMetric(evaluate.Metric):
    """QACE-Ref / QACE-Img; see the module docstring."""

    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=[
                datasets.Features(
                    {
                        "predictions": datasets.Value("string"),
                        "references": datasets.Sequence(datasets.Value("string")),
                    }
                ),
                datasets.Features(
                    {"predictions": datasets.Value("string"), "references": datasets.Value("string")}
                ),
            ],
            reference_urls=["https://aclanthology.org/2021.findings-emnlp.395/"],
        )

    def _compute(
        self,
        predictions: list[Any],
        references: list[Any],
        variant: str = "ref",
        metric: str | None = None,
        **settings: Any,
    ) -> dict[str, Any]:
        if metric is not None:
            from qace import scorers

            rows = metric_rows(metric, predictions, references, **settings)
            names = list(rows[0]) if rows else [scorers.get(metric).score_key]
            n = max(len(rows), 1)
            result: dict[str, Any] = {name: sum(r[name] for r in rows) / n for name in names}
            result["scores"] = [r[names[0]] for r in rows]
            result["signature"] = shared_scorer(metric, **settings).signature
            return result
        check_settings({"variant": variant, **settings})
        reward = shared_reward(variant=variant, **settings)
        captions = [p if isinstance(p, str) else "" for p in predictions]
        if variant == "img":
            results = reward.score(captions, image_ids=list(references))
        else:
            refs = [[r] if isinstance(r, str) else list(r) for r in references]
            results = reward.score(captions, references=refs)
        n = max(len(results), 1)
        out: dict[str, Any] = {"qace": sum(r.reward for r in results) / n}
        for part in PARTS:
            out[part] = sum(r.scores.get(part, r.reward) for r in results) / n
        out["scores"] = [r.reward for r in results]
        out["signature"] = reward.signature
        return out
