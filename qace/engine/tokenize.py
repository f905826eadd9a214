"""Tokenisation shared by the engine and the reference implementation, so both see identical ids."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from weakref import WeakKeyDictionary


def token_ids(tokenizer: Any, texts: Sequence[str], *, special_tokens: bool = True) -> list[list[int]]:
    """Token ids of every text: exactly ``tokenizer(texts, add_special_tokens=...)["input_ids"]``.

    A fast tokenizer is called through its Rust ``encode_batch_fast`` directly (`plain_backend`):
    ``__call__`` builds a Python dictionary per text around the same ids, and on a chunk's tens of
    thousands of prompts that wrapping cost the GPU engine more than the models' encoders (seen in
    ``benchmarks/profile.py``); the ``_fast`` variant gives the same ids without computing the character
    offsets nobody here reads.
    """
    if not texts:
        return []
    backend = plain_backend(tokenizer)
    if backend is not None:
        return [e.ids for e in backend.encode_batch_fast(list(texts), add_special_tokens=special_tokens)]
    return [list(x) for x in tokenizer(list(texts), add_special_tokens=special_tokens)["input_ids"]]


_PLAIN: WeakKeyDictionary[Any, Any] = WeakKeyDictionary()


def plain_backend(tokenizer: Any) -> Any | None:
    """``tokenizer``'s Rust backend as ``__call__`` runs it by default, without padding or truncation
    (None for a slow tokenizer).

    A backend that keeps either from its saved file is copied once without them: all-MiniLM-L6-v2,
    BERTScore's default encoder, saves padding to 128 tokens, which transformers 5.24 keeps on the loaded
    backend (5.17 dropped it), and that had sent every BERTScore call through ``__call__`` (1,800 short
    answers: 18 ms against 8 on a 2-core host). The copy is not the tokenizer's own backend, so nothing
    changes under other threads; the engine's tokenizers do not change after loading, and the copy would
    not see it if they did.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or (backend.truncation is None and backend.padding is None):
        return backend
    plain = _PLAIN.get(tokenizer)
    if plain is None:
        from tokenizers import Tokenizer

        plain = Tokenizer.from_str(backend.to_str())
        plain.no_truncation()
        plain.no_padding()
        _PLAIN[tokenizer] = plain
    return plain


def encode_texts(tokenizer: Any, texts: Sequence[str], max_tokens: int) -> tuple[list[list[int]], list[bool]]:
    """Token ids (with EOS) per text, cut to ``max_tokens`` keeping EOS last; and which were cut.

    T5 has relative positions, so nothing forces a cut; the cap bounds memory for pathological inputs and
    is part of the score signature.
    """
    return cut_to(token_ids(tokenizer, texts), max_tokens, tokenizer.eos_token_id)


def cut_to(encoded: list[list[int]], max_tokens: int, eos: int) -> tuple[list[list[int]], list[bool]]:
    """Ids (ending in EOS) cut to ``max_tokens`` keeping EOS last, as `encode_texts`; and which were cut."""
    out, truncated = [], []
    for ids in encoded:
        cut = len(ids) > max_tokens
        out.append([*ids[: max_tokens - 1], eos] if cut else ids)
        truncated.append(cut)
    return out, truncated


def decode(tokenizer: Any, tokens: Sequence[Sequence[int]], *, only_pad_eos: bool = False) -> list[str]:
    """Generated ids to text, surrounding whitespace stripped.

    By default every special token is dropped (``skip_special_tokens=True``). With ``only_pad_eos`` only
    the tokenizer's padding and end-of-sequence ids are, so an unknown-character token (T5's ``<unk>``,
    which a real model emits for ``{`` or many CJK characters) stays in the text: the spec's rule for
    questions and text-QA answers.

    A fast tokenizer without clean-up decodes straight through its Rust backend: the same strings as
    ``batch_decode`` (which calls that backend per row) without its per-id Python type checks, which
    cost more than the decoding itself on a hundred thousand answers.
    """
    rows = [t if type(t) is list else list(t) for t in tokens]
    if only_pad_eos:  # a row is copied only where it holds such an id (rows cut at EOS rarely do)
        dropped = {tokenizer.pad_token_id, tokenizer.eos_token_id} - {None}
        rows = [row if dropped.isdisjoint(row) else [i for i in row if i not in dropped] for row in rows]
    skip = not only_pad_eos
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and not tokenizer.clean_up_tokenization_spaces:
        texts = backend.decode_batch(rows, skip_special_tokens=skip)
    else:
        texts = tokenizer.batch_decode(rows, skip_special_tokens=skip)
    return [text.strip() for text in texts]
