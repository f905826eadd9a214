"""The fair baseline: what a strong engineer writes in a day with Hugging Face ``generate``.

Every stage is one pass over its distinct prompts (exact-prompt de-duplication through a dict),
tokenised in one call through the tokenizer's Rust backend (`qace.engine.tokenize.encode_texts`, as the
engine does: ``tokenizer(...)`` wraps every prompt in Python and cost the text stages a fifth of their
time), sorted by length and cut into batches of ``batch_size`` (2,048) rows. A helper thread pads the
next batch in one scatter, builds its forced outputs vectorised exactly as the engine's are
(`benchmarks.workload.padded_target_tokens`) and copies it to the device from pinned memory while the
current batch generates; outputs are decoded through the Rust backend after the last batch
(`qace.engine.tokenize.decode`). The models run in bf16 (or the precision they
were loaded in); region features go to the GPU once per run; spaCy, loaded as spaCy loads it (its
BLIS products, single-threaded in each process, and its attribute ruler), parses through
``nlp.pipe(n_process=...)``; token F1 and BERTScore are the same batched kernels the engine uses
(BERTScore on the GPU); the cyclic garbage collector is paused while scoring, as the engine pauses it
(`qace.engine.gc_pause`). No loop in the hot path runs Python per caption: the loops run per batch.

`generate_bound` replays sampled batches of each stage through plain ``generate`` alone (inputs already
on the device, nothing else timed): the rate no ``generate``-based pipeline can beat at these shapes.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from benchmarks.workload import padded_target_tokens
from qace.config import QACEConfig
from qace.data.records import Record
from qace.engine.gc_pause import collector_paused
from qace.engine.scheduler import pad_batch
from qace.engine.tokenize import decode, encode_texts
from qace.kernels.token_f1 import token_f1
from qace.metric.candidates import candidates_from_doc
from qace.metric.prompts import MAX_LENGTH, clean_question, qg_input, tqa_input, unanswerable_id
from qace.metric.text import filter_stopwords_all
from qace.models.visual_inputs import visual_question_inputs

MAX_INPUT_TOKENS = QACEConfig.max_input_tokens
"""Prompts are cut to the engine's default ``max_input_tokens`` (keeping EOS), T5's 512 positions, as
``tokenizer(truncation=True, max_length=512)`` does; no prompt of the workload comes near it."""


class ForceTokens:
    """A logits processor that makes row ``i`` emit ``tokens[i]`` step by step, and keeps the
    answerability (``1 - softmax(first-step logits)[unanswerable]``) when ``unanswerable`` is given."""

    def __init__(self, tokens: torch.Tensor, unanswerable: int | None = None) -> None:
        self.tokens = tokens
        self.unanswerable = unanswerable
        self.answerability: torch.Tensor | None = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        step = input_ids.shape[1] - 1  # tokens generated so far (the decoder start is not one)
        if step == 0 and self.unanswerable is not None:
            self.answerability = 1 - torch.softmax(scores.float(), -1)[:, self.unanswerable]
        forced = torch.full_like(scores, float("-inf"))
        forced.scatter_(1, self.tokens[:, step : step + 1], 0.0)
        return forced


@dataclass
class Batch:
    """One batch's device inputs, kept so `generate_bound` can replay it."""

    role: str
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    forced: torch.Tensor
    image_rows: torch.Tensor | None = None


@dataclass
class StageRun:
    """What one stage did: distinct rows, wall seconds (tokenising to decoded text), its batches, and
    where the wall went: ``tokenize`` (all prompts, before the first batch), ``generate`` (inside the
    ``generate`` calls, outputs copied to the host), ``wait_inputs`` (for the helper thread's next batch),
    ``decode`` (every output, after the last batch); each batch's ``generate`` seconds; and the CUDA
    caching allocator's device allocations (``cudaMalloc``) and retries after freeing its cache."""

    rows: int
    seconds: float
    batches: list[Batch] = field(default_factory=list)
    parts: dict[str, float] = field(default_factory=dict)
    batch_seconds: list[float] = field(default_factory=list)
    allocations: dict[str, int] = field(default_factory=dict)


def _allocations(device: torch.device, since: dict[str, int] | None = None) -> dict[str, int]:
    """The CUDA caching allocator's device allocations and retries so far (minus ``since``)."""
    if device.type != "cuda":
        return {}
    stats = torch.cuda.memory_stats(device)
    now = {"cuda_malloc": stats.get("num_device_alloc", 0), "retries": stats.get("num_alloc_retries", 0)}
    return {k: v - (since or {}).get(k, 0) for k, v in now.items()}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def _run(model: Any, batch: Batch, features: torch.Tensor | None, an_id: int | None) -> tuple[Any, Any]:
    """One ``generate`` call on a prepared batch; returns the sequences and the answerability."""
    force = ForceTokens(batch.forced, an_id)
    common = dict(max_length=MAX_LENGTH, num_beams=1, do_sample=False, logits_processor=[force])
    if batch.image_rows is None:
        out = model.generate(input_ids=batch.input_ids, attention_mask=batch.attention_mask, **common)
    else:
        assert features is not None
        enc, mask = model.encode_visual(batch.input_ids, batch.attention_mask, features[batch.image_rows])
        out = model.generate(encoder_outputs=enc, attention_mask=mask, **common)
    return out, force.answerability


class Baseline:
    """Scores records stage by stage; ``models`` maps role -> (model, tokenizer)."""

    def __init__(
        self,
        models: dict[str, tuple[Any, Any]],
        nlp: Any,
        matcher: Any,
        features: Any,
        *,
        batch_size: int,
        spacy_processes: int,
        device: torch.device,
    ) -> None:
        self.models, self.nlp, self.matcher, self.features = models, nlp, matcher, features
        self.batch_size, self.spacy_processes, self.device = batch_size, spacy_processes, device
        self.stages: dict[str, StageRun] = {}
        self.seconds: dict[str, float] = {}
        self.feature_table: torch.Tensor | None = None
        """QACE-Img: the run's images' region features on the device, rows in first-seen order."""

    def _stage(
        self, role: str, prompts: list[str], an_id: int | None, image_rows: np.ndarray | None = None
    ) -> tuple[list[str], np.ndarray]:
        """Texts (only <pad> and </s> dropped) and answerability of every distinct prompt, in prompt order."""
        _sync(self.device)
        start = time.perf_counter()
        model, tok = self.models[role]
        if image_rows is None:
            encoded, _ = encode_texts(tok, prompts, MAX_INPUT_TOKENS)
            lengths = np.fromiter(map(len, encoded), np.int64, len(prompts))
            order = np.argsort(-lengths, kind="stable")
        else:  # Visual-T5's 64 question slots, tokenised and padded in one call
            ids_t, mask_t, _ = visual_question_inputs(tok, prompts)
            ids_all, mask_all = ids_t.numpy(), mask_t.numpy()
            order = np.arange(len(prompts))
        run = StageRun(rows=len(prompts), seconds=0.0)
        run.parts = {"tokenize": time.perf_counter() - start, "wait_inputs": 0.0}
        texts = np.empty(len(prompts), dtype=object)
        answerability = np.zeros(len(prompts))

        def prepare(index: np.ndarray) -> Batch:
            if image_rows is None:
                ids, mask = pad_batch([encoded[i] for i in index])
            else:
                ids, mask = ids_all[index], mask_all[index]
            forced = padded_target_tokens(ids, mask, role)

            def upload(array: np.ndarray) -> torch.Tensor:
                host = torch.from_numpy(array)
                if self.device.type != "cuda":
                    return host
                return host.pin_memory().to(self.device, non_blocking=True)

            rows = None if image_rows is None else upload(image_rows[index])
            return Batch(role, upload(ids), upload(mask), upload(forced), rows)

        # the next batch is prepared in a helper thread while the current one generates; outputs are
        # decoded once the last batch is done (a decoding thread took the interpreter lock from
        # generate's Python step loop and slowed it by a third)
        cuts = [order[lo : lo + self.batch_size] for lo in range(0, len(order), self.batch_size)]
        outputs = []
        allocated = _allocations(self.device)
        with ThreadPoolExecutor(1, thread_name_prefix="hf-inputs") as inputs:
            upcoming = inputs.submit(prepare, cuts[0]) if cuts else None
            for k, index in enumerate(cuts):
                tick = time.perf_counter()
                batch = upcoming.result()  # type: ignore[union-attr]
                if k + 1 < len(cuts):
                    upcoming = inputs.submit(prepare, cuts[k + 1])
                between = time.perf_counter()
                out, an = _run(model, batch, self.feature_table, an_id)
                outputs.append((index, out.cpu(), None if an is None else an.cpu()))
                run.batch_seconds.append(time.perf_counter() - between)
                run.parts["wait_inputs"] += between - tick
                run.batches.append(batch)
        tick = time.perf_counter()
        for index, out, an in outputs:  # the spec's rule: only <pad> and </s> are dropped
            texts[index] = decode(tok, out.tolist(), only_pad_eos=True)
            if an is not None:
                answerability[index] = an.numpy()
        run.parts["generate"] = sum(run.batch_seconds)
        run.parts["decode"] = time.perf_counter() - tick
        run.allocations = _allocations(self.device, allocated)
        run.seconds = time.perf_counter() - start
        self.stages[role] = run
        return texts.tolist(), answerability

    def score(self, records: Sequence[Record], variant: str) -> list[float]:
        """QACE per record: the mean over contexts of (F1 + BERTScore + answerability) / 3, averaged over
        the record's questions; 0 without questions. Stage runs land in ``stages``, walls in ``seconds``."""
        with collector_paused():
            return self._score(records, variant)

    def _score(self, records: Sequence[Record], variant: str) -> list[float]:
        self.stages, self.seconds = {}, {}
        start = time.perf_counter()
        captions = [r.caption for r in records]
        docs = self.nlp.pipe(captions, batch_size=256, n_process=self.spacy_processes)
        cands = [candidates_from_doc(doc) for doc in docs]
        self.seconds["spacy"] = time.perf_counter() - start

        self.feature_table = None
        if variant == "img":  # every image of the run to the GPU once
            tick = time.perf_counter()
            images = {r.image_id: None for r in records}
            image_index = {image: i for i, image in enumerate(images)}
            table = np.stack([self.features.get(image) for image in images])
            dtype = self.models["vqa"][0].dtype
            self.feature_table = torch.from_numpy(table).to(self.device, dtype)
            self.seconds["features_to_gpu"] = time.perf_counter() - tick

        # questions: one per distinct (candidate, caption) prompt
        qg_prompts: dict[str, int] = {}
        owner_prompt = [
            (i, qg_prompts.setdefault(qg_input(a, captions[i]), len(qg_prompts)))
            for i, cs in enumerate(cands)
            for a in cs
        ]
        generated, _ = self._stage("qg", list(qg_prompts), None)
        cleaned = [clean_question(t) for t in generated]
        questions: list[dict[str, None]] = [{} for _ in records]
        for i, p in owner_prompt:
            questions[i].setdefault(cleaned[p], None)

        # answers on the caption and on each context (text QA in one stage; Visual-T5 for the image)
        tqa_tok = self.models["tqa"][1]
        an_tqa = unanswerable_id(tqa_tok)
        tqa_prompts: dict[str, int] = {}
        own = [
            (i, q, tqa_prompts.setdefault(tqa_input(q, captions[i]), len(tqa_prompts)))
            for i, qs in enumerate(questions)
            for q in qs
        ]
        if variant == "ref":
            pairs = [
                (i, k, q, tqa_prompts.setdefault(tqa_input(q, ref), len(tqa_prompts)))
                for i, qs in enumerate(questions)
                for k, ref in enumerate(records[i].references or ())
                for q in qs
            ]
            answers, an = self._stage("tqa", list(tqa_prompts), an_tqa)
            ctx_answers, ctx_an = answers, an
        else:
            answers, _ = self._stage("tqa", list(tqa_prompts), an_tqa)
            visual: dict[tuple[str, int], int] = {}
            pairs = [
                (i, 0, q, visual.setdefault((q, image_index[records[i].image_id]), len(visual)))
                for i, qs in enumerate(questions)
                for q in qs
            ]
            keys = list(visual)
            ctx_answers, ctx_an = self._stage(
                "vqa",
                [q for q, _ in keys],
                unanswerable_id(self.models["vqa"][1]),
                np.fromiter((image for _, image in keys), np.int64, len(keys)),
            )

        # compare: F1 and BERTScore over the pairs, then means per (caption, context) and per caption
        tick = time.perf_counter()
        own_answers = filter_stopwords_all(answers)
        own_of = {(i, q): p for i, q, p in own}
        ctx_filtered = filter_stopwords_all(ctx_answers)
        a = [own_answers[own_of[(i, q)]] for i, _, q, _ in pairs]
        b = [ctx_filtered[p] for _, _, _, p in pairs]
        at = np.fromiter((p for _, _, _, p in pairs), np.int64, len(pairs))
        values = (token_f1(a, b) + self.matcher.score(a, b) + ctx_an[at]) / 3
        owner = np.fromiter((i for i, _, _, _ in pairs), np.int64, len(pairs))
        context = np.fromiter((k for _, k, _, _ in pairs), np.int64, len(pairs))
        scores = aggregate(values, owner, context, len(records))
        self.seconds["compare"] = time.perf_counter() - tick
        self.seconds["total"] = time.perf_counter() - start
        return scores.tolist()


def aggregate(values: np.ndarray, owner: np.ndarray, context: np.ndarray, n: int) -> np.ndarray:
    """Per record: the mean over its contexts of the mean over the context's pair ``values``; 0 for a
    record without pairs. ``owner``/``context`` give each value's record and context index."""
    width = int(context.max(initial=0)) + 1
    group = owner * width + context
    sums = np.bincount(group, weights=values, minlength=n * width)
    counts = np.bincount(group, minlength=n * width)
    present = counts > 0
    means = np.where(present, sums / np.maximum(counts, 1), 0.0).reshape(n, width)
    contexts = present.reshape(n, width).sum(axis=1)
    return np.where(contexts > 0, means.sum(axis=1) / np.maximum(contexts, 1), 0.0)


@torch.inference_mode()
def generate_bound(
    models: dict[str, tuple[Any, Any]],
    stages: dict[str, StageRun],
    features: torch.Tensor | None,
    device: torch.device,
    samples: int,
) -> dict[str, Any]:
    """Per stage: plain ``generate`` alone on up to ``samples`` of its batches (evenly spaced over the
    length-sorted order, inputs already on the device), its rows/s, and the stage's own rows/s as a
    fraction of it. ``all``: the stages together (their rows at the bound's rates against their wall)."""
    out: dict[str, Any] = {}
    bound_seconds = stage_seconds = 0.0
    for name, run in stages.items():
        if not run.batches:
            continue
        picks = np.unique(np.linspace(0, len(run.batches) - 1, min(samples, len(run.batches))).round())
        batches = [run.batches[int(i)] for i in picks]
        model, tok = models[batches[0].role]
        an_id = None if batches[0].role == "qg" else unanswerable_id(tok)
        _run(model, batches[0], features, an_id)  # this shape's first call pays one-off costs
        _sync(device)
        allocated = _allocations(device)
        replayed = []
        for batch in batches:
            tick = time.perf_counter()
            _run(model, batch, features, an_id)
            _sync(device)
            replayed.append(time.perf_counter() - tick)
        seconds = sum(replayed)
        rows = sum(int(b.input_ids.shape[0]) for b in batches)
        bound_rate = rows / seconds
        stage_rate = run.rows / run.seconds
        out[name] = {
            "rows": run.rows,
            "batches": len(run.batches),
            "batches_sampled": len(batches),
            "stage_seconds": run.seconds,
            "stage_rows_per_s": stage_rate,
            "bound_rows_per_s": bound_rate,
            "fraction": stage_rate / bound_rate,
            "stage_parts_seconds": run.parts,
            "sampled_batches": [int(i) for i in picks],
            "sampled_seconds_in_stage": [run.batch_seconds[int(i)] for i in picks],
            "sampled_seconds_alone": replayed,
            "allocations_in_stage": run.allocations,
            "allocations_alone": _allocations(device, allocated),
        }
        bound_seconds += run.rows / bound_rate
        stage_seconds += run.seconds
    out["all"] = {"fraction": bound_seconds / stage_seconds if stage_seconds else float("nan")}
    return out
