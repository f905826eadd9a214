"""The baseline a competent user would write: every stage batched (2,048 inputs, length-sorted) through
Hugging Face ``generate`` in bf16, spaCy through ``nlp.pipe``, the same F1 and BERTScore kernels."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from benchmarks.workload import ForceTokens, target_tokens
from qace.data.records import Record
from qace.engine.tokenize import unanswerable_id
from qace.kernels.token_f1 import token_f1
from qace.metric.candidates import candidates_from_doc
from qace.metric.prompts import MAX_LENGTH, clean_question, qg_input, tqa_input
from qace.metric.text import filter_stopwords
from qace.models.visual_t5 import visual_question_inputs


@torch.inference_mode()
def _generate(
    model: Any,
    tok: Any,
    prompts: Sequence[str],
    role: str,
    batch_size: int,
    an_id: int | None,
    device: torch.device,
) -> tuple[list[str], np.ndarray]:
    order = np.argsort([-len(p) for p in prompts], kind="stable")
    texts: list[str] = [""] * len(prompts)
    an = np.zeros(len(prompts))
    for start in range(0, len(order), batch_size):
        idx = order[start : start + batch_size]
        enc = tok(
            [prompts[i] for i in idx], return_tensors="pt", padding=True, truncation=True, max_length=512
        )
        targets = target_tokens(
            [ids[m == 1].numpy() for ids, m in zip(enc.input_ids, enc.attention_mask, strict=False)], role
        )
        out = model.generate(
            input_ids=enc.input_ids.to(device),
            attention_mask=enc.attention_mask.to(device),
            max_length=MAX_LENGTH,
            num_beams=1,
            do_sample=False,
            logits_processor=[ForceTokens(targets, device)],
            return_dict_in_generate=True,
            output_logits=an_id is not None,
        )
        decoded = tok.batch_decode(out.sequences, skip_special_tokens=True)
        for row, i in enumerate(idx):
            texts[i] = decoded[row].strip()
        if an_id is not None:
            an[idx] = (1 - torch.softmax(out.logits[0].float(), -1)[:, an_id]).cpu().numpy()
    return texts, an


@torch.inference_mode()
def _generate_visual(
    model: Any,
    tok: Any,
    questions: Sequence[str],
    feats: Sequence[np.ndarray],
    batch_size: int,
    device: torch.device,
) -> tuple[list[str], np.ndarray]:
    texts: list[str] = []
    an = []
    an_id = unanswerable_id(tok)
    for start in range(0, len(questions), batch_size):
        ids, mask, _ = visual_question_inputs(tok, questions[start : start + batch_size])
        f = torch.from_numpy(np.stack(feats[start : start + batch_size])).to(device, model.dtype)
        enc, full_mask = model.encode_visual(ids.to(device), mask.to(device), f)
        targets = target_tokens([i[m == 1].numpy() for i, m in zip(ids, mask, strict=False)], "vqa")
        out = model.generate(
            encoder_outputs=enc,
            attention_mask=full_mask,
            max_length=MAX_LENGTH,
            num_beams=1,
            do_sample=False,
            logits_processor=[ForceTokens(targets, device)],
            return_dict_in_generate=True,
            output_logits=True,
        )
        texts += [t.strip() for t in tok.batch_decode(out.sequences, skip_special_tokens=True)]
        an.append((1 - torch.softmax(out.logits[0].float(), -1)[:, an_id]).cpu().numpy())
    return texts, np.concatenate(an) if an else np.zeros(0)


def score(
    records: Sequence[Record],
    variant: str,
    models: dict[str, tuple[Any, Any]],
    nlp: Any,
    matcher: Any,
    features: Any,
    batch_size: int,
    device: torch.device,
    timings: dict[str, float] | None = None,
) -> list[float]:
    """QACE per caption, stage by stage, each stage one big batched ``generate``."""
    captions = [r.caption for r in records]
    start = time.perf_counter()
    cands = [candidates_from_doc(doc) for doc in nlp.pipe(captions, batch_size=256)]
    if timings is not None:
        timings["spacy_seconds"] = time.perf_counter() - start
    qg, qg_tok = models["qg"]
    owners = [(i, a) for i, cs in enumerate(cands) for a in cs]
    texts, _ = _generate(
        qg, qg_tok, [qg_input(a, captions[i]) for i, a in owners], "qg", batch_size, None, device
    )
    questions: list[list[str]] = [[] for _ in records]
    for (i, _), text in zip(owners, texts, strict=True):
        q = clean_question(text)
        if q not in questions[i]:
            questions[i].append(q)
    tqa, tqa_tok = models["tqa"]
    an_id = unanswerable_id(tqa_tok)
    own_pairs = [(i, q) for i, qs in enumerate(questions) for q in qs]
    own, _ = _generate(
        tqa, tqa_tok, [tqa_input(q, captions[i]) for i, q in own_pairs], "tqa", batch_size, an_id, device
    )
    if variant == "ref":
        ctx_pairs = [
            (i, k, q)
            for i, qs in enumerate(questions)
            for k, ref in enumerate(records[i].references or ())
            for q in qs
        ]
        ctx, an = _generate(
            tqa,
            tqa_tok,
            [tqa_input(q, records[i].references[k]) for i, k, q in ctx_pairs],
            "tqa",
            batch_size,
            an_id,
            device,
        )
    else:
        vqa, vqa_tok = models["vqa"]
        ctx_pairs = [(i, 0, q) for i, q in own_pairs]
        ctx, an = _generate_visual(
            vqa,
            vqa_tok,
            [q for _, _, q in ctx_pairs],
            [features.get(records[i].image_id) for i, _, _ in ctx_pairs],
            batch_size,
            device,
        )
    own_of = {(i, q): filter_stopwords(a) for (i, q), a in zip(own_pairs, own, strict=True)}
    a = [own_of[(i, q)] for i, _, q in ctx_pairs]
    b = [filter_stopwords(t) for t in ctx]
    f1, bs = token_f1(a, b), matcher.score(a, b)
    per: dict[tuple[int, int], list[float]] = {}
    for (i, k, _), x, y, z in zip(ctx_pairs, f1, bs, an, strict=True):
        per.setdefault((i, k), []).append((x + y + z) / 3)
    by_caption: dict[int, list[float]] = {}
    for (i, _), values in per.items():
        by_caption.setdefault(i, []).append(float(np.mean(values)))
    return [float(np.mean(by_caption[i])) if i in by_caption else 0.0 for i in range(len(records))]
