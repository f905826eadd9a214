"""QACE's host process: a chunk's host work, its device work sent to the engine core.

`QACE` with ``host_workers > 0`` runs the models and the BERTScore encoder in an engine core
(`qace.engine.core`) and each chunk's pipeline (`score_chunk`: prompts, tokenising, de-duplication,
decoding, answer cleanup, token F1, BERTScore's tokenising, rows) in one of these processes: the same
code as in one process, with runners and a matcher that send their device work to the core. Rows are
therefore identical to the single-process design's: every batch is built the same way and runs the
same kernels.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from qace.config import QACEConfig
from qace.data.records import Record
from qace.engine.core import CoreClient, RemoteRunner
from qace.kernels.bertscore import BertScorePlanner
from qace.metric.pipeline import ModelRunners, score_chunk

BERTSCORE = "bertscore"
"""The engine core's name for BERTScore's device half (`BertScoreMatcher.match`)."""


@dataclass(frozen=True)
class HostSetup:
    """What a host process needs (pickled once, at its start): settings, tokenizers, the answerability
    token ids, BERTScore's planner and the signature rows carry."""

    config: QACEConfig
    qg_tokenizer: Any
    tqa_tokenizer: Any
    tqa_unanswerable: int
    vqa_tokenizer: Any
    vqa_unanswerable: int | None
    planner: BertScorePlanner
    signature: str


@dataclass(frozen=True)
class ScoreChunk:
    """A host task: score validated records given their answer candidates (`score_chunk`)."""

    records: Sequence[Record]
    candidates: Sequence[list[str]]


@dataclass(frozen=True)
class Call:
    """A host task: call the function ``"module:function"`` with no argument (e.g. to empty a cache)."""

    ref: str


class _RemoteMatcher:
    """BERTScore planned here, matched in the engine core."""

    def __init__(self, client: CoreClient, planner: BertScorePlanner) -> None:
        self.client, self.planner = client, planner

    def score(self, cands: Sequence[str], refs: Sequence[str]) -> np.ndarray:
        return self.client.call(BERTSCORE, self.planner.plan(cands, refs))  # type: ignore[no-any-return]


def setup(config: HostSetup, client: CoreClient) -> Callable[[Any], Any]:
    """The task function of a host process (`qace.engine.host_pool`), its models in the core."""
    from qace.engine.launch import resolve
    from qace.kernels.token_f1 import token_f1

    models = ModelRunners(
        qg=RemoteRunner(client, "qg"),
        qg_tokenizer=config.qg_tokenizer,
        tqa=RemoteRunner(client, "tqa"),
        tqa_tokenizer=config.tqa_tokenizer,
        tqa_unanswerable=config.tqa_unanswerable,
        vqa=RemoteRunner(client, "vqa") if config.vqa_tokenizer is not None else None,
        vqa_tokenizer=config.vqa_tokenizer,
        vqa_unanswerable=config.vqa_unanswerable,
    )
    matcher = _RemoteMatcher(client, config.planner)
    settings = config.config.with_(progress=False)
    token_f1(["a warm-up answer"], ["a warm-up reference"])  # compiles its kernels before the first chunk

    def run(task: ScoreChunk | Call) -> Any:
        if isinstance(task, Call):
            return resolve(task.ref)()
        return score_chunk(
            task.records, task.candidates, models, settings, matcher, signature=config.signature
        )

    return run
