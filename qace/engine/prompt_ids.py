"""Token ids of templated prompts, composed from the ids of their parts.

A chunk's prompts repeat their parts: each caption is the context of 3-4 question prompts and of as
many text-QA prompts, each question is asked on the caption and on every reference (and the image).
Tokenising every prompt whole runs the tokenizer's model over the same words again and again. With a
tokenizer that
splits its input at spaces and treats each piece alone (T5's sentencepiece pipeline, WordPiece), the
ids of ``"answer: {answer}  context: {context} </s>"`` are the template's own pieces' ids around the
ids of each part tokenised alone, so each distinct part is tokenised once and its ids reused. The same
holds one level down: a part's ids are its words' ids, so a new part (a caption, a question) costs the
tokenizer only its words not met before, and the words of captions repeat far more than the captions.

That holds only under conditions checked here, never assumed:

- the tokenizer's pipeline (`composable`): a normalizer that works character by character (or none),
  a pre-tokenizer that splits at whitespace, no truncation or padding;
- each part (`_plain`): printable ASCII with no whitespace at either end, no added token inside, and
  left as it is by the normalizer, so nothing can merge across the spaces around it; or, where the
  normalizer maps printable ASCII one character at a time (checked on every pair of characters), mapped
  by it into such a text, whose ids it then has (`_fold`: BERT's lowercasing);
- the template (`PromptIds.__init__`): probe prompts composed equal the same prompts tokenised whole;
- words (`PromptIds._check_words`): probe parts composed from their words equal the parts tokenised
  whole, and a part is cut into words only where single spaces separate them.

Anything else (a part with an accent, say) is tokenised whole, exactly as before, so the ids are always
those of ``tokenizer(prompt)``; `tests/engine/test_prompt_ids.py` checks both paths on a T5-style
sentencepiece tokenizer and on the test models' tokenizer.
"""

from __future__ import annotations

import json
import logging
import re
import string
import threading
import weakref
from collections.abc import Sequence
from typing import Any

from qace.engine.tokenize import plain_backend, token_ids

log = logging.getLogger(__name__)

CACHE_PARTS = 200_000
"""Parts whose ids are kept per (tokenizer, template); the cache starts over when full (a chunk of
QACE-Ref holds about 40,000 distinct parts)."""
CACHE_WORDS = 200_000
"""Words whose ids are kept per (tokenizer, template); the cache starts over when full."""

_LOCAL_NORMALIZERS = {
    "Precompiled",
    "NFC",
    "NFD",
    "NFKC",
    "NFKD",
    "Lowercase",
    "StripAccents",
    "BertNormalizer",
    "Strip",
}
"""Normalizers that map characters one by one (sentencepiece's precompiled charsmap, Unicode forms,
case) or trim a text's ends, so a part left unchanged alone is left unchanged inside a prompt."""

_WHITESPACE_SPLITTERS = {"WhitespaceSplit", "Whitespace", "BertPreTokenizer", "Metaspace"}
"""Pre-tokenizers that cut at whitespace, so no piece spans the space around a part."""

_SPACES_ONLY = re.compile(r"[ {}0-9,+*]+")
"""A `Replace` pattern made of spaces and repetition only (T5's ``" {2,}"``)."""

_PROBES = [
    ("a dog", "A dog runs on the grass ."),
    ("two men", "Two men, one woman and 3 kids (at 12:30) play ball!"),
    ("What is the girl wearing?", "x"),
    ("the-red_ball's", "a b c d e f"),
]
"""Parts the template check composes; the first field takes the first part, later fields the second."""


def _components(spec: dict[str, Any] | None, key: str) -> list[dict[str, Any]]:
    """A normalizer's or pre-tokenizer's members (one, or those of a ``Sequence``)."""
    if spec is None:
        return []
    return spec.get(key, []) if spec["type"] == "Sequence" else [spec]


def composable(tokenizer: Any) -> bool:
    """Whether ``tokenizer``'s pipeline lets a prompt's ids be composed from its parts' ids."""
    backend = plain_backend(tokenizer)
    if backend is None:
        return False
    spec = json.loads(backend.to_str())
    normalizers = _components(spec.get("normalizer"), "normalizers")
    for member in normalizers:
        if member["type"] == "Replace":
            pattern = member["pattern"].get("Regex", member["pattern"].get("String", ""))
            if not _SPACES_ONLY.fullmatch(pattern):
                return False
        elif member["type"] not in _LOCAL_NORMALIZERS:
            return False
    splitters = _components(spec.get("pre_tokenizer"), "pretokenizers")
    if not splitters or splitters[0]["type"] not in _WHITESPACE_SPLITTERS:
        return False
    return all(m["type"] in _WHITESPACE_SPLITTERS for m in splitters)


class PromptIds:
    """Token ids of prompts from one template, e.g. ``"answer: {answer}  context: {context} </s>"``,
    given the values of its fields in order; equal to ``token_ids(tokenizer, [template.format(...)])``.
    """

    def __init__(self, tokenizer: Any, template: str, *, special_tokens: bool = True) -> None:
        self._tokenizer = weakref.ref(tokenizer)  # `prompt_ids` keeps encoders per tokenizer, weakly
        self.special_tokens = special_tokens
        pieces = list(string.Formatter().parse(template))
        self.literals = [text for text, _, _, _ in pieces]
        self.fields = sum(field is not None for _, field, _, _ in pieces)
        if len(self.literals) == self.fields:
            self.literals.append("")
        self.template = "{}".join(self.literals)
        self._parts: dict[str, tuple[int, ...] | None] = {}
        """Each part's ids, as tuples: a tuple of ints leaves the collector's lists at its first
        collection, so a cache of distinct parts adds nothing to the full collections that follow the
        warm-up's `qace.engine.gc_pause.freeze_heap` (lists would, one per distinct part)."""
        self._words: dict[str, tuple[int, ...]] = {}
        """Each word's ids (a part's ids are its words', `_check_words`)."""
        self._lock = threading.Lock()
        self._glue: list[list[int]] = []
        self._normalize: Any = None
        self._changing: re.Pattern[str] | None = None
        """The printable ASCII characters the normalizer changes, where it maps them one by one
        (`_changing_characters`)."""
        self._folding: dict[int, str] | None = None
        """What the normalizer makes of each of them, where that is settled (`_fold`)."""
        self._per_character = False
        self._added: re.Pattern[str] | None = None
        self.by_words = False
        self.composed = self._check_template()
        self.by_words = self.composed and self._check_words()
        """Whether new parts' ids are composed from their words' ids (else each is tokenised)."""

    @property
    def tokenizer(self) -> Any:
        """The tokenizer these ids come from (held by its models, not by this object)."""
        tokenizer = self._tokenizer()
        if tokenizer is None:
            raise ReferenceError("the tokenizer of these prompt ids was garbage-collected")
        return tokenizer

    def format(self, values: Sequence[str]) -> str:
        """The prompt text of one row of field values."""
        return self.template.format(*values)

    def __call__(self, rows: Sequence[Sequence[str]]) -> list[list[int]]:
        """Token ids of every row's prompt."""
        return self._compose(rows) if self.composed else self._whole(rows)

    def _compose(self, rows: Sequence[Sequence[str]]) -> list[list[int]]:
        """Ids from the template's pieces and each part's (learnt on first sight); rows with a part that
        cannot be composed are tokenised whole."""
        parts = self._parts
        new = {value for row in rows for value in row if value not in parts}
        if new:
            self._learn(sorted(new))
        out: list[list[int]] = []
        whole: list[int] = []
        glue = self._glue
        for at, row in enumerate(rows):
            ids = list(glue[0])
            for value, after in zip(row, glue[1:], strict=True):
                part = parts.get(value)
                if part is None:
                    whole.append(at)
                    break
                ids += part
                ids += after
            out.append(ids)
        if whole:
            for at, ids in zip(whole, self._whole([rows[i] for i in whole]), strict=True):
                out[at] = ids
        return out

    def _whole(self, rows: Sequence[Sequence[str]]) -> list[list[int]]:
        return token_ids(self.tokenizer, [self.format(r) for r in rows], special_tokens=self.special_tokens)

    def _plain(self, value: str) -> bool:
        """Whether ``value`` can be tokenised alone (module docstring); others go whole."""
        return (
            value.isascii()
            and value.isprintable()
            and value != ""
            and value == value.strip()
            and not (self._added is not None and self._added.search(value))
            and self._settled(value)
        )

    def _settled(self, value: str) -> bool:
        """Whether the normalizer leaves printable-ASCII ``value`` as it is, or maps it character by
        character into a text it leaves as it is (`_fold`): read off the characters it changes where it
        maps them one by one (a regular-expression search, not a call of the normalizer: BERT's takes
        4 us a text); by normalizing where spaces repeat (T5's collapses them) or the characters' check
        failed."""
        if self._normalize is None:
            return True
        if self._per_character and "  " not in value:
            return self._changing is None or self._folding is not None or self._changing.search(value) is None
        return bool(self._normalize(value) == value)

    def _fold(self, value: str) -> str:
        """``value`` (`_plain`) as the normalizer makes it: the same ids, tokenised alone or inside a
        prompt (BERT's lowercasing: ``"A dog"`` has the ids of ``"a dog"``)."""
        if self._folding is None or self._changing is None or self._changing.search(value) is None:
            return value
        return value.translate(self._folding)

    def _learn(self, values: list[str]) -> None:
        """Tokenise new parts (those that may be composed; from their words' ids where `by_words`) in one
        batch; the rest are marked whole."""
        plain = [v for v in values if self._plain(v)]
        ids = self._plain_ids(plain)
        with self._lock:
            if len(self._parts) + len(values) > CACHE_PARTS:
                self._parts.clear()
            self._parts.update(dict.fromkeys(values))
            self._parts.update(zip(plain, map(tuple, ids), strict=True))

    def _plain_ids(self, plain: list[str]) -> list[list[int]]:
        """Ids of `_plain` parts, each tokenised alone as the normalizer makes it (`_fold`): composed from
        their words' where `by_words`."""
        texts = [self._fold(value) for value in plain]
        return (
            self._part_ids(texts) if self.by_words else token_ids(self.tokenizer, texts, special_tokens=False)
        )

    def _part_ids(self, parts: list[str]) -> list[list[int]]:
        """Ids of plain ``parts``: of their words (new words tokenised in one batch) where single spaces
        separate them, else of the part tokenised alone."""
        words = self._words
        split = [part.split(" ") if "  " not in part else None for part in parts]
        new = sorted({w for pieces in split if pieces is not None for w in pieces if w not in words})
        fresh: dict[str, tuple[int, ...]] = {}
        if new:
            learnt = token_ids(self.tokenizer, new, special_tokens=False)
            fresh = dict(zip(new, map(tuple, learnt), strict=True))
            with self._lock:
                if len(words) + len(fresh) > CACHE_WORDS:
                    words.clear()
                words.update(fresh)
        out: list[list[int] | None] = []
        for pieces in split:
            composed: list[int] | None = None if pieces is None else []
            for word in pieces or ():
                known = fresh.get(word)
                if known is None:
                    known = words.get(word)  # None only if another thread emptied the full cache
                if known is None or composed is None:
                    composed = None
                    break
                composed += known
            out.append(composed)
        alone = [at for at, ids in enumerate(out) if ids is None]
        if alone:
            redone = token_ids(self.tokenizer, [parts[at] for at in alone], special_tokens=False)
            for at, ids in zip(alone, redone, strict=True):
                out[at] = ids
        return [ids for ids in out if ids is not None]

    def _check_words(self) -> bool:
        """Whether probe parts composed from their words' ids equal them tokenised whole."""
        probes = [p for pair in _PROBES for p in pair if self._plain(p)]
        self.by_words = True
        composed = self._plain_ids(probes)
        self._words.clear()
        if composed != token_ids(self.tokenizer, probes, special_tokens=False):
            log.info("parts of %r are tokenised whole: composing them from words differs", self.template)
            return False
        return True

    def _check_template(self) -> bool:
        """Set up the template's own ids and check composition on probe prompts (module docstring)."""
        if self.fields == 0 or not composable(self.tokenizer):
            return False
        backend = self.tokenizer.backend_tokenizer
        self._normalize = backend.normalizer.normalize_str if backend.normalizer is not None else None
        if self._normalize is not None:
            self._per_character, self._changing, self._folding = _changing_characters(self._normalize)
        added = [t.content for t in self.tokenizer.added_tokens_decoder.values() if t.content]
        self._added = re.compile("|".join(map(re.escape, added))) if added else None
        inner = self.literals[1:-1]
        if any(not s.startswith(" ") or not s.endswith(" ") for s in inner) or not (
            (self.literals[0] == "" or self.literals[0].endswith(" "))
            and (self.literals[-1] == "" or self.literals[-1].startswith(" "))
        ):
            return False  # a field must sit between spaces (or at either end)
        glue = self._literal_ids()
        if glue is None:
            return False
        start, end = _special_ends(self.tokenizer) if self.special_tokens else ([], [])
        self._glue = [start + glue[0], *glue[1:-1], glue[-1] + end]
        probes = [[a] + [b] * (self.fields - 1) for a, b in _PROBES]
        composed = self._compose(probes)
        whole = self._whole(probes)
        self._parts.clear()
        if composed != whole:
            log.info("prompt ids of %r are tokenised whole: composing them differs", self.template)
            return False
        return True

    def _literal_ids(self) -> list[list[int]] | None:
        """The ids of each of the template's own pieces as they come out between fields: tokenised with
        an anchor part on each side that has a field, whose ids are then taken off again (a piece ending
        before ``</s>`` can give a lone ``"▁"`` token in some T5 tokenizers, as in the prompt)."""
        anchor = _PROBES[0][0]
        (anchor_ids,) = token_ids(self.tokenizer, [anchor], special_tokens=False)
        last = len(self.literals) - 1
        texts = [
            (anchor if i > 0 else "") + text + (anchor if i < last else "")
            for i, text in enumerate(self.literals)
        ]
        pieces = []
        for i, ids in enumerate(token_ids(self.tokenizer, texts, special_tokens=False)):
            head, tail = (len(anchor_ids) if i > 0 else 0), (len(anchor_ids) if i < last else 0)
            if (
                len(ids) < head + tail
                or ids[:head] != anchor_ids[:head]
                or ids[len(ids) - tail :] != anchor_ids[:tail]
            ):
                return None
            pieces.append(ids[head : len(ids) - tail])
        return pieces


_ASCII = [chr(c) for c in range(33, 127)]
"""Printable ASCII but the space."""


def _changing_characters(
    normalize: Any,
) -> tuple[bool, re.Pattern[str] | None, dict[int, str] | None]:
    """Whether ``normalize`` maps printable ASCII (spaces aside) one character at a time; the class of the
    characters it changes (None: none); and a ``str.translate`` table of what it makes of them, where each
    becomes printable ASCII without spaces that it leaves as it is (else None). Checked on one text holding
    every pair of them: it must come out as each character normalised alone, in order."""
    alone = {c: normalize(c) for c in _ASCII}
    pairs = "".join(a + b for a in _ASCII for b in _ASCII)
    if normalize(pairs) != "".join(alone[c] for c in pairs):
        return False, None, None
    changed = [c for c in _ASCII if alone[c] != c]
    if not changed:
        return True, None, None
    settled = all(
        alone[c] and alone[c].isascii() and alone[c].isprintable() and " " not in alone[c]
        and normalize(alone[c]) == alone[c]
        for c in changed
    )  # fmt: skip
    folding = {ord(c): alone[c] for c in changed} if settled else None
    return True, re.compile("[" + "".join(map(re.escape, changed)) + "]"), folding


def _special_ends(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The ids the tokenizer puts before and after a text's own (T5: nothing, then EOS)."""
    bare = token_ids(tokenizer, ["x"], special_tokens=False)[0]
    full = token_ids(tokenizer, ["x"])[0]
    for at in range(len(full) - len(bare) + 1):
        if full[at : at + len(bare)] == bare:
            return full[:at], full[at + len(bare) :]
    raise ValueError("the tokenizer's special tokens do not wrap the text's own ids")


_ENCODERS: weakref.WeakKeyDictionary[Any, dict[tuple[str, bool], PromptIds]] = weakref.WeakKeyDictionary()
_ENCODERS_LOCK = threading.Lock()


def prompt_ids(tokenizer: Any, template: str, *, special_tokens: bool = True) -> PromptIds:
    """The `PromptIds` of ``(tokenizer, template)``, made once, so parts' ids are reused across calls."""
    with _ENCODERS_LOCK:
        per_tokenizer = _ENCODERS.setdefault(tokenizer, {})
        key = (template, special_tokens)
        if key not in per_tokenizer:
            per_tokenizer[key] = PromptIds(tokenizer, template, special_tokens=special_tokens)
        return per_tokenizer[key]


def clear_parts() -> None:
    """Forget the cached ids of every part and word, of every tokenizer and template, so the next prompts
    are tokenised cold (benchmarks empty it between passes)."""
    with _ENCODERS_LOCK:
        encoders = [e for per in _ENCODERS.values() for e in per.values()]
    for encoder in encoders:
        with encoder._lock:
            encoder._parts.clear()
            encoder._words.clear()
