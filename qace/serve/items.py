"""The items of a reward request: a caption with its context, checked as the service reads them.

Only a request's envelope is refused whole (`RequestError`, 422: not an object, no item list, no
``request_id``, an unknown component, lists of other lengths). Everything about one item is the item's
own: a missing or malformed context (no references where the metric reads them, no image id, a label
that cannot be read), a missing or repeated id, a context that is well formed but cannot be scored (a
reference over the length limit, too many references, text that is not valid Unicode). `Item.problem`
says why, the item is rewarded as invalid, and its neighbours are scored: one bad dataset row must not
cost a training step (OpenRLHF 0.8 raises after five tries on a 422).
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
    *,
    max_chars: int,
    max_references: int,
) -> Item:
    """The item of ``caption`` with the context the metric ``reads`` (``references``, ``image_id``,
    ``image`` or None). A missing or malformed context, references over ``max_chars`` characters or more
    than ``max_references`` of them set `Item.problem`. The caption itself is judged by the reward."""
    if reads == "references":
        refs: Any = context.get("references")
        shape = _references_shape(refs)
        if shape is not None:
            return Item(caption, problem=shape)
        return Item(
            caption, references=tuple(refs), problem=references_problem(refs, max_chars, max_references)
        )
    if reads is None:
        return Item(caption)
    value = context.get(reads)
    if reads == "image_id" and isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value.strip():
        kind = "a string or integer" if reads == "image_id" else "a file path on the server"
        got = "an empty string" if isinstance(value, str) else json_type(value)
        return Item(caption, problem=f"{reads} must be {kind}, got {got}")
    problem = surrogate_problem(reads, value)
    if problem is None and len(value) > max_chars:
        problem = f"{reads} has {len(value)} characters; the limit is {max_chars}"
    if reads == "image_id":
        return Item(caption, image_id=value, problem=problem)
    return Item(caption, image=value, problem=problem)


def _references_shape(refs: Any) -> str | None:
    """Why ``refs`` is not a non-empty list of non-empty strings, or None."""
    if refs is None:
        return "no references (null or missing)"
    if not isinstance(refs, list):
        return f"references must be a list of strings, got {json_type(refs)}"
    if not refs:
        return "references is an empty list"
    other = next((r for r in refs if not isinstance(r, str)), "")
    if not isinstance(other, str):
        return f"references must be a list of strings, got one that is {json_type(other)}"
    if not all(r.strip() for r in refs):
        return "references contain an empty or whitespace-only string"
    return None


def json_type(value: Any) -> str:
    """What JSON calls ``value``'s kind, with an article (``null``, ``a number``, ``an array``, ...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    kinds = ((str, "a string"), (int | float, "a number"), (list, "an array"), (dict, "an object"))
    return next((name for kind, name in kinds if isinstance(value, kind)), type(value).__name__)


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
