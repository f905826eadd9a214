"""A plain, slow reference implementation of QACE, written from the spec (docs/spec.md) alone.

It imports nothing from ``qace`` (``tests/test_reference_independent.py`` checks that), so a bug the engine
shares with a helper cannot pass the parity tests: candidate extraction, stopword filtering, the prompts,
the Visual-T5 input, decoding, token F1 and the aggregation are written again here from the spec, and
BERTScore is the ``bert-score`` package's own. It follows the release's loop structure: for each caption,
parse it alone, generate one question per candidate with Hugging Face ``generate`` (batch size 1, greedy),
answer each question on the caption and on each context one at a time, then compare.
"""

from __future__ import annotations

import json
import re
import string
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
STOPWORDS = SHARED_DATA / "nltk_english_stopwords.txt"
"""Spec 1: NLTK's 179-word English list, read from the shared data folder (not from the package)."""

MAX_LENGTH = 32  # spec 2-4: generate(max_length=32), the decoder start token included
MAX_INPUT_TOKENS = 512  # the engine's default input cap (EOS kept last); part of the signature
QUESTION_SLOTS, NUM_REGIONS = 64, 36  # spec 4
RELEASE_IMAGE_PREFIX = (1023, 10)  # spec 4: "image :" in the T5 vocabulary


def load_stopwords(path: Path = STOPWORDS) -> frozenset[str]:
    """The stopword list, one word a line."""
    return frozenset(w for w in path.read_text(encoding="utf-8").split("\n") if w)


def drop_stopwords(text: str, stop: frozenset[str]) -> str:
    """Spec 1/3: lowercase, split on single spaces, drop stopwords, join the kept words with single spaces."""
    return " ".join(w for w in text.lower().split(" ") if w not in stop)


def answer_candidates(doc: Any, stop: frozenset[str]) -> list[str]:
    """Spec 1: entities, then noun chunks (document order), filtered; empties dropped, first one kept."""
    out: list[str] = []
    for span in list(doc.ents) + list(doc.noun_chunks):
        text = drop_stopwords(span.text, stop)
        if text and text not in out:
            out.append(text)
    return out


def squad_f1(prediction: str, truth: str) -> float:
    """Spec 6: token F1 exactly as the SQuAD v2 evaluation script computes it."""

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


def decode_keeping_unk(tokenizer: Any, ids: Sequence[int]) -> str:
    """Spec 2/3: drop ``<pad>`` and ``</s>`` only (an ``<unk>`` stays), strip surrounding whitespace."""
    dropped = {tokenizer.pad_token_id, tokenizer.eos_token_id}
    return tokenizer.decode([i for i in ids if i not in dropped], skip_special_tokens=False).strip()


def strip_question_prefix(text: str) -> str:
    """Spec 2: the QG model writes ``question: `` before the question; take it off."""
    for prefix in ("question: ", "question:"):
        if text.startswith(prefix):
            return text[len(prefix) :].strip()
    return text.strip()


class PackageBertScore:
    """Spec 6's BERTScore F1 through the ``bert-score`` package; both answers empty give 1, one gives 0.

    Pairs are scored one at a time (``batch_size=1``): inside a batch the package zeroes padded
    similarities, which clamps a negative best cosine to 0 and makes a score depend on its batch mates.
    An answer is empty when the encoder's tokenizer gives it no token.
    """

    def __init__(self, model_dir: str | Path, num_layers: int, device: str = "cpu") -> None:
        import bert_score

        self.scorer = bert_score.BERTScorer(
            model_type=str(model_dir),
            num_layers=num_layers,
            idf=False,
            rescale_with_baseline=False,
            lang="en",
            device=device,
        )
        self.memo: dict[tuple[str, str], float] = {}
        """Scores of pairs already scored (each pair is scored alone, so its score never changes)."""

    def __call__(self, cands: Sequence[str], refs: Sequence[str]) -> np.ndarray:
        tokenize = self.scorer._tokenizer.tokenize
        todo = sorted({(c, r) for c, r in zip(cands, refs, strict=True) if (c, r) not in self.memo})
        pairs = [(c, r) for c, r in todo if tokenize(c) and tokenize(r)]
        for c, r in todo:
            self.memo[(c, r)] = float(not tokenize(c) and not tokenize(r))  # both empty 1, one empty 0
        if pairs:
            _, _, f1 = self.scorer.score([c for c, _ in pairs], [r for _, r in pairs], batch_size=1)
            self.memo.update(zip(pairs, f1.double().tolist(), strict=True))
        return np.array([self.memo[(c, r)] for c, r in zip(cands, refs, strict=True)], dtype=np.float64)


class VisualT5:
    """Spec 4's Visual-T5 built from a checkpoint directory in Hugging Face layout: a plain T5 plus its own
    ``Linear(2054, d_model)`` read from the ``encoder.img_emb.*`` weights."""

    def __init__(self, path: str | Path) -> None:
        from safetensors.torch import load_file
        from transformers import AutoTokenizer, T5ForConditionalGeneration

        path = Path(path)
        self.model = T5ForConditionalGeneration.from_pretrained(path).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        weights = load_file(path / "model.safetensors")
        weight, bias = weights["encoder.img_emb.weight"], weights["encoder.img_emb.bias"]
        self.img_emb = torch.nn.Linear(weight.shape[1], weight.shape[0])
        self.img_emb.load_state_dict({"weight": weight, "bias": bias})
        config = json.loads((path / "config.json").read_text())
        self.prefix = tuple(config.get("image_prefix_ids") or RELEASE_IMAGE_PREFIX)

    def encoder_inputs(self, question: str, regions: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """Embeddings (1, 102, d) and mask (1, 102): ``"visual answer: " + q`` without EOS in 64
        right-padded slots (cut to 64), the two prefix ids, the 36 projected regions."""
        ids = self.tokenizer("visual answer: " + question, add_special_tokens=False)["input_ids"][
            :QUESTION_SLOTS
        ]
        slots = ids + [0] * (QUESTION_SLOTS - len(ids))
        mask = [1] * len(ids) + [0] * (QUESTION_SLOTS - len(ids)) + [1] * (len(self.prefix) + NUM_REGIONS)
        embed = self.model.get_input_embeddings()
        tokens = embed(torch.tensor([slots + list(self.prefix)]))
        projected = self.img_emb(torch.as_tensor(np.asarray(regions, dtype=np.float32))[None])
        return torch.cat([tokens, projected], dim=1), torch.tensor([mask])


@dataclass
class ReferenceQACE:
    """Per-caption QACE with plain ``generate``; ``features`` maps image id -> (36, 2054) array.

    ``bertscore(cands, refs)`` scores answer pairs (default use: `PackageBertScore`).
    """

    qg: Any
    qg_tokenizer: Any
    tqa: Any
    tqa_tokenizer: Any
    nlp: Any
    bertscore: Callable[[Sequence[str], Sequence[str]], np.ndarray]
    vqa: VisualT5 | None = None
    features: Callable[[str], np.ndarray] | None = None
    stopwords: frozenset[str] = field(default_factory=load_stopwords)
    memo: dict[tuple[int, str], tuple[str, float]] = field(default_factory=dict)
    """Outputs of inputs already run (greedy decoding is deterministic), so test suites can score the
    same captions under several variants without paying twice."""

    def _unanswerable(self, tokenizer: Any) -> int:
        """Spec 5: the first piece of ``unanswerable``."""
        return tokenizer("unanswerable", add_special_tokens=False)["input_ids"][0]

    def _text(self, model: Any, tokenizer: Any, prompt: str, answerability: bool) -> tuple[str, float]:
        key = (id(model), prompt)
        if key not in self.memo:
            ids = tokenizer(prompt)["input_ids"]
            if len(ids) > MAX_INPUT_TOKENS:
                ids = ids[: MAX_INPUT_TOKENS - 1] + [tokenizer.eos_token_id]
            input_ids = torch.tensor([ids])
            with torch.inference_mode():
                out = model.generate(
                    input_ids=input_ids,
                    attention_mask=torch.ones_like(input_ids),
                    max_length=MAX_LENGTH,
                    num_beams=1,
                    do_sample=False,
                    return_dict_in_generate=True,
                    output_logits=True,
                )
            text = decode_keeping_unk(tokenizer, out.sequences[0].tolist())
            an = self._answerability(out, tokenizer) if answerability else float("nan")
            self.memo[key] = (text, an)
        return self.memo[key]

    def _answerability(self, out: Any, tokenizer: Any) -> float:
        """Spec 5: 1 - softmax(first-step logits)[u]."""
        probs = torch.softmax(out.logits[0][0].float(), dim=-1)
        return float(1.0 - probs[self._unanswerable(tokenizer)])

    def _visual(self, question: str, image_id: str) -> tuple[str, float]:
        assert self.vqa is not None and self.features is not None
        key = (id(self.vqa), f"{image_id}\n{question}")
        if key not in self.memo:
            from transformers.modeling_outputs import BaseModelOutput

            with torch.inference_mode():
                embeds, mask = self.vqa.encoder_inputs(question, self.features(image_id))
                hidden = self.vqa.model.encoder(inputs_embeds=embeds, attention_mask=mask).last_hidden_state
                out = self.vqa.model.generate(
                    encoder_outputs=BaseModelOutput(last_hidden_state=hidden),
                    attention_mask=mask,
                    max_length=MAX_LENGTH,
                    num_beams=1,
                    do_sample=False,
                    return_dict_in_generate=True,
                    output_logits=True,
                )
            tokenizer = self.vqa.tokenizer
            text = tokenizer.decode(out.sequences[0], skip_special_tokens=True).strip()  # spec 4
            self.memo[key] = (text, self._answerability(out, tokenizer))
        return self.memo[key]

    def score_caption(
        self, caption: str, references: Sequence[str] | None = None, image_id: str | None = None
    ) -> dict[str, Any]:
        """Score one caption: QACE-Ref when ``references`` are given, else QACE-Img on ``image_id``."""
        stop = self.stopwords
        candidates = answer_candidates(self.nlp(caption), stop)
        questions: list[str] = []
        for answer in candidates:
            prompt = "answer: " + answer + "  context: " + caption + " </s>"
            question = strip_question_prefix(self._text(self.qg, self.qg_tokenizer, prompt, False)[0])
            if question not in questions:
                questions.append(question)

        def tqa(question: str, context: str) -> tuple[str, float]:
            prompt = "question: " + question + "  context: " + context + " </s>"
            text, an = self._text(self.tqa, self.tqa_tokenizer, prompt, True)
            return drop_stopwords(text, stop), an

        own = [tqa(q, caption)[0] for q in questions]
        contexts: list[Any] = list(references) if references is not None else [image_id]
        f1 = np.zeros((len(contexts), len(questions)))
        bs, an = np.zeros_like(f1), np.zeros_like(f1)
        answers: list[list[str]] = []
        for c, ctx in enumerate(contexts):
            row = []
            for i, q in enumerate(questions):
                if references is not None:
                    text, an[c, i] = tqa(q, ctx)
                else:
                    visual, an[c, i] = self._visual(q, ctx)
                    text = drop_stopwords(visual, stop)
                row.append(text)
                f1[c, i] = squad_f1(own[i], text)
            if questions:
                bs[c] = self.bertscore(own, row)
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
        else:  # spec 6: no candidate, no question: 0.0 everywhere
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
