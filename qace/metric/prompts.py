"""Prompt templates and output cleanup of the release, as named constants (spec sections 2-4).

Keeping them here, and only here, means the engine and the reference implementation cannot drift.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

QG_TEMPLATE = "answer: {answer}  context: {context} </s>"
"""QG input: two spaces before ``context:`` and a literal ``</s>`` although the tokenizer appends EOS too."""

TQA_TEMPLATE = "question: {question}  context: {context} </s>"
"""Text-QA input, same quirks as :data:`QG_TEMPLATE`."""

QUESTION_PREFIX = "question: "
"""What the QG model writes before each question; stripped from its output."""

MAX_LENGTH = 32
"""``generate(max_length=32)``: Hugging Face counts the decoder start token, so at most 31 new tokens."""

MAX_NEW_TOKENS = MAX_LENGTH - 1

UNANSWERABLE = "unanswerable"
"""The literal answer a SQuAD-v2 style model gives to an unanswerable question."""


def qg_input(answer: str, caption: str) -> str:
    """The QG model's input for one answer candidate of ``caption``."""
    return QG_TEMPLATE.format(answer=answer, context=caption)


def tqa_input(question: str, context: str) -> str:
    """The text-QA model's input for ``question`` asked on ``context``."""
    return TQA_TEMPLATE.format(question=question, context=context)


def clean_question(decoded: str) -> str:
    """Strip the ``question: `` prefix the QG model emits (text decoded without special tokens)."""
    text = decoded.strip()
    if text.startswith(QUESTION_PREFIX):
        text = text[len(QUESTION_PREFIX) :]
    elif text.startswith(QUESTION_PREFIX.strip()):
        text = text[len(QUESTION_PREFIX.strip()) :]
    return text.strip()


def unanswerable_id(tokenizer: Any, override: int | None = None) -> int:
    """Id of the first piece of ``unanswerable`` (73 in T5's vocabulary), looked up, not hard-coded."""
    if override is not None:
        return override
    pieces = tokenizer(UNANSWERABLE, add_special_tokens=False)["input_ids"]
    if len(pieces) != 1:
        log.warning(
            "the QA tokenizer splits %r into %d pieces; answerability uses the first one (id %d)",
            UNANSWERABLE,
            len(pieces),
            pieces[0],
        )
    return int(pieces[0])
