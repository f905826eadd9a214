"""A plain, slow reference implementation of QACE, written to be obviously right, not fast.

It follows the release's loop structure: for each caption, parse it alone, generate one question per
candidate with Hugging Face ``generate`` (batch size 1, fp32, greedy), answer each question on the
caption and on each context one at a time, then compare. It shares only the spec's constants
(prompt templates, stopword list, tokenisation cap) with the engine, so parity tests compare two
independent paths: the engine's batching, de-duplication and decoding loop against plain ``generate``.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from qace.engine.tokenize import encode_texts, unanswerable_id
from qace.metric.candidates import candidates_from_doc
from qace.metric.prompts import MAX_LENGTH, clean_question, qg_input, tqa_input
from qace.metric.text import filter_stopwords
from qace.models.visual_t5 import visual_question_inputs


def squad_f1(prediction: str, truth: str) -> float:
    """Token F1 exactly as the SQuAD v2 evaluation script computes it."""

    def normalize(s: str) -> str:
        s = "".join(ch for ch in s.lower() if ch not in set(string.punctuation))
        s = re.sub(r"\b(a|an|the)\b", " ", s)
        return " ".join(s.split())

    pred, gold = normalize(prediction).split(), normalize(truth).split()
    if not pred or not gold:
        return float(pred == gold)
    common = sum((Counter(pred) & Counter(gold)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(gold)
    return 2 * precision * recall / (precision + recall)


@dataclass
class ReferenceQACE:
    """Per-caption QACE with plain ``generate``; ``features`` maps image id -> (36, 2054) array."""

    qg: Any
    qg_tokenizer: Any
    tqa: Any
    tqa_tokenizer: Any
    nlp: Any
    bertscore: Callable[[Sequence[str], Sequence[str]], np.ndarray]
    vqa: Any = None
    vqa_tokenizer: Any = None
    features: Callable[[str], np.ndarray] | None = None
    max_input_tokens: int = 512
    length_control: bool = False
    """Benchmarks only: force ``benchmarks.workload.target_tokens`` (random weights never stop)."""
    memo: dict[tuple[int, str], tuple[str, float]] = field(default_factory=dict)
    """Outputs of inputs already run (greedy decoding is deterministic), so test suites can score the
    same captions under several variants without paying twice."""

    def _generate_text(
        self, model: Any, tokenizer: Any, text: str, unanswerable: int | None
    ) -> tuple[str, float]:
        key = (id(model), text)
        if key not in self.memo:
            self.memo[key] = self._generate_text_once(model, tokenizer, text, unanswerable)
        return self.memo[key]

    @torch.inference_mode()
    def _generate_text_once(
        self, model: Any, tokenizer: Any, text: str, unanswerable: int | None
    ) -> tuple[str, float]:
        ids, _ = encode_texts(tokenizer, [text], self.max_input_tokens)
        input_ids = torch.tensor(ids, device=model.device)
        role = "qg" if model is self.qg else "tqa"
        out = model.generate(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_length=MAX_LENGTH,
            num_beams=1,
            do_sample=False,
            return_dict_in_generate=True,
            output_logits=True,
            **self._length_control(model, ids[0], role),
        )
        return self._finish(tokenizer, out, unanswerable)

    @torch.inference_mode()
    def _generate_visual(self, question: str, image_id: str) -> tuple[str, float]:
        ids, mask, _ = visual_question_inputs(self.vqa_tokenizer, [question])
        assert self.features is not None
        feats = torch.from_numpy(np.asarray(self.features(image_id), dtype=np.float32))[None]
        encoder_outputs, full_mask = self.vqa.encode_visual(ids, mask, feats.to(self.vqa.device))
        out = self.vqa.generate(
            encoder_outputs=encoder_outputs,
            attention_mask=full_mask,
            max_length=MAX_LENGTH,
            num_beams=1,
            do_sample=False,
            return_dict_in_generate=True,
            output_logits=True,
            **self._length_control(self.vqa, ids[0][mask[0] == 1].tolist(), "vqa"),
        )
        return self._finish(self.vqa_tokenizer, out, unanswerable_id(self.vqa_tokenizer))

    def _length_control(self, model: Any, ids: list[int], role: str) -> dict[str, Any]:
        if not self.length_control:
            return {}
        from benchmarks.workload import ForceTokens, target_tokens

        return {"logits_processor": [ForceTokens(target_tokens([ids], role), model.device)]}

    @staticmethod
    def _finish(tokenizer: Any, out: Any, unanswerable: int | None) -> tuple[str, float]:
        text = tokenizer.decode(out.sequences[0], skip_special_tokens=True).strip()
        if unanswerable is None:
            return text, float("nan")
        probs = torch.softmax(out.logits[0][0].float(), dim=-1)
        return text, float(1.0 - probs[unanswerable])

    def score_caption(
        self, caption: str, references: Sequence[str] | None = None, image_id: str | None = None
    ) -> dict[str, Any]:
        """Score one caption: QACE-Ref when ``references`` are given, else QACE-Img on ``image_id``."""
        candidates = candidates_from_doc(self.nlp(caption))
        questions: list[str] = []
        for answer in candidates:
            text, _ = self._generate_text(self.qg, self.qg_tokenizer, qg_input(answer, caption), None)
            question = clean_question(text)
            if question not in questions:
                questions.append(question)
        u = unanswerable_id(self.tqa_tokenizer)
        own = [
            filter_stopwords(self._generate_text(self.tqa, self.tqa_tokenizer, tqa_input(q, caption), u)[0])
            for q in questions
        ]
        contexts: list[Any] = list(references) if references is not None else [image_id]
        f1 = np.zeros((len(contexts), len(questions)))
        bs, an = np.zeros_like(f1), np.zeros_like(f1)
        answers: list[list[str]] = []
        for c, ctx in enumerate(contexts):
            row = []
            for i, q in enumerate(questions):
                if references is not None:
                    text, an[c, i] = self._generate_text(self.tqa, self.tqa_tokenizer, tqa_input(q, ctx), u)
                else:
                    text, an[c, i] = self._generate_visual(q, ctx)
                row.append(filter_stopwords(text))
                f1[c, i] = squad_f1(own[i], row[-1])
            bs[c] = self.bertscore(own, row) if questions else bs[c]
            answers.append(row)
        if questions:
            per_context = (f1.mean(1) + bs.mean(1) + an.mean(1)) / 3
            scores = {
                "qace": per_context.mean(),
                "qace_f1": f1.mean(1).mean(),
                "qace_bs": bs.mean(1).mean(),
                "qace_an": an.mean(1).mean(),
                "qace_max": per_context.max(),
            }
        else:
            scores = dict.fromkeys(("qace", "qace_f1", "qace_bs", "qace_an", "qace_max"), 0.0)
        return {
            **{k: float(v) for k, v in scores.items()},
            "candidates": candidates,
            "questions": questions,
            "answer_on_caption": own,
            "answers_on_context": answers,
            "f1": f1,
            "bs": bs,
            "an": an,
        }
