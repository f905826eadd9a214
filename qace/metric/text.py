"""Answer normalisation shared by candidates and QA answers (spec sections 1, 3, 4).

The release lowercases a string, splits it on single spaces and drops NLTK English stopwords.
Splitting on single spaces (not arbitrary whitespace) is kept on purpose: it is what the release does,
and changing it would change scores.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from importlib import resources


@lru_cache(maxsize=1)
def stopwords() -> frozenset[str]:
    """NLTK's 179-word English stopword list, shipped as package data (the corpus cannot be downloaded)."""
    text = resources.files("qace.metric").joinpath("data/stopwords_en.txt").read_text(encoding="utf-8")
    return frozenset(word for word in text.split("\n") if word)


def filter_stopwords(text: str) -> str:
    """Lowercase, split on single spaces, drop stopwords and join the kept words with single spaces."""
    stop = stopwords()
    return " ".join([word for word in text.lower().split(" ") if word not in stop])


def filter_stopwords_all(texts: Sequence[str]) -> list[str]:
    """`filter_stopwords` of every text, each distinct text filtered once (a chunk's answers repeat)."""
    done: dict[str, str] = {}
    return [done[t] if t in done else done.setdefault(t, filter_stopwords(t)) for t in texts]
