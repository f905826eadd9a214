"""The items of a reward request: a caption with its context, checked as the service reads them.

A malformed request (no references where the metric reads them, no image id) is the caller's bug and
is refused whole (`RequestError`, 422). A context that is well formed but cannot be scored (a reference
over the length limit, too many references, text that is not valid Unicode) makes only its own item
invalid: `Item.problem` says why, and the item's neighbours are scored.
"""

from __future__ import annotations

from typing import Any

from qace.data.records import surrogate_problem
from qace.serve.batcher import Item


class RequestError(Exception):
    """A request the service refuses: its HTTP ``status``, the ``detail`` it answers and its headers."""

    def __init__(self, status: int, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status, self.detail, self.headers = status, detail, headers or {}


def make_item(
    caption: Any,
    context: dict[str, Any],
    reads: str | None,
    where: str,
    *,
    max_chars: int,
    max_references: int,
) -> Item:
    """The item of ``caption`` with the context the metric ``reads`` (``references``, ``image_id``,
    ``image`` or None); ``where`` names it in errors. A missing or malformed context raises
    `RequestError` (422); references over ``max_chars`` characters or more than ``max_references`` of
    them set `Item.problem`. The caption itself is judged by the reward."""
    if reads == "references":
        refs = context.get("references")
        if not isinstance(refs, list) or not refs or not all(isinstance(r, str) and r.strip() for r in refs):
            raise RequestError(422, f"{where}: references must be a non-empty list of non-empty strings")
        return Item(
            caption, references=tuple(refs), problem=references_problem(refs, max_chars, max_references)
        )
    if reads is None:
        return Item(caption)
    value = context.get(reads)
    if reads == "image_id" and isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value.strip():
        kind = "(string or integer)" if reads == "image_id" else "(a file path on the server)"
        raise RequestError(422, f"{where}: needs an {reads} {kind}")
    problem = surrogate_problem(reads, value)
    if problem is None and len(value) > max_chars:
        problem = f"{reads} has {len(value)} characters; the limit is {max_chars}"
    if reads == "image_id":
        return Item(caption, image_id=value, problem=problem)
    return Item(caption, image=value, problem=problem)


def references_problem(refs: list[str], max_chars: int, max_references: int) -> str | None:
    """Why references that are a non-empty list of non-empty strings still cannot be scored, or None."""
    if len(refs) > max_references:
        return f"{len(refs)} references; the limit is {max_references} per caption"
    for n, ref in enumerate(refs):
        if len(ref) > max_chars:
            return f"reference {n} has {len(ref)} characters; the limit is {max_chars}"
        problem = surrogate_problem(f"reference {n}", ref)
        if problem is not None:
            return problem
    return None
