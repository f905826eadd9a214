"""OpenRLHF's remote reward protocol: ``{"query", "prompts", "labels"}`` -> ``{"rewards", "scores"[,
"extra_logs"]}``.

OpenRLHF sends each query as its policy's tokenizer decodes the prompt's and the completion's token ids
together (special tokens kept), and the prompt as the dataset wrote it. The caption is what follows the
prompt: the prompt is matched as written and as the tokenizer decodes it (``decode(encode(prompt))``,
when the service has the policy's tokenizer, ``qace serve --tokenizer``), ignoring whitespace (a
SentencePiece tokenizer drops a prompt's trailing space), and the end markers of the completion (the
tokenizer's special tokens among them) are removed. A query that matches neither form, or comes without a
prompt (null, or no visible character), is rewarded as invalid, never scored whole: scored whole, the
prompt's own words would earn a reward for an empty completion. A request without ``prompts`` is refused
(422); captions alone are scored by ``/v1/reward``.

Labels carry the context: an image id (QACE-Img) or an image path, references as a list, a JSON list
string or a single string, or ``{"references": [...]}`` / ``{"image_id": ...}`` / ``{"image": ...}``. A
label that cannot be read (null, an empty list, an empty reference, a number where references are read,
a string that starts like JSON and does not parse) makes its sample invalid, with the reason; its
neighbours are scored.

``extra_logs`` (the components, one number each) come only when the URL asks for them
(``?extra_logs=1``) and the request has one query: OpenRLHF 0.11 sends one query per request and makes a
tensor of each value; 0.8 ``torch.cat``s every ``extra_logs`` value as a tensor, which JSON cannot carry,
so any ``extra_logs`` crash it (``TypeError``), even for a single query.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from qace.data.records import surrogate_problem
from qace.errors import ConfigError
from qace.reward import DEFAULT_STRIP, RewardResult, completion_text
from qace.serve.batcher import Item
from qace.serve.items import RequestError, json_type, make_item

MISMATCH = "the query does not start with its prompt (as written, nor as the policy's tokenizer decodes it)"
"""The reason of an invalid reward for a query whose prompt was not found."""


class PromptMatcher:
    """Split OpenRLHF queries into prompt and completion (see the module docstring); ``tokenizer`` is the
    policy's (a Hugging Face tokenizer), or None to match prompts as written only."""

    def __init__(self, tokenizer: Any = None) -> None:
        self.tokenizer = tokenizer
        specials = tuple(getattr(tokenizer, "all_special_tokens", ()) or ())
        self.strip = tuple(dict.fromkeys((*DEFAULT_STRIP, *specials)))
        """End markers removed from a completion's end."""
        self._forms: Callable[[str], tuple[str, ...]] = functools.lru_cache(maxsize=8192)(self._prompt_forms)

    def completion(self, query: str, prompt: str) -> str | None:
        """The caption in ``query`` after ``prompt``, end markers removed; None when the query does not
        start with the prompt in any of its forms."""
        forms = self._forms(prompt)
        for form in forms:  # the common cases, without a pattern
            if query.startswith(form):
                return completion_text(query[len(form) :], self.strip)
        visible = "".join(query.split())
        for form in forms:
            end = _end_of_prefix(query, form) if visible.startswith("".join(form.split())) else None
            if end is not None:
                return completion_text(query[end:], self.strip)
        return None

    def _prompt_forms(self, prompt: str) -> tuple[str, ...]:
        """The prompt as written and as the tokenizer decodes its ids, each also without its trailing
        whitespace."""
        forms = [prompt]
        if (
            self.tokenizer is not None and surrogate_problem("prompt", prompt) is None
        ):  # else it can't be encoded
            ids = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
            forms.append(self.tokenizer.decode(ids, skip_special_tokens=False))
        return tuple(dict.fromkeys(f for form in forms for f in (form, form.rstrip())))


@functools.lru_cache(maxsize=1024)
def _pattern(prompt: str) -> re.Pattern[str]:
    """A pattern matching ``prompt``'s non-whitespace characters with any whitespace between them."""
    return re.compile(r"\s*".join(map(re.escape, "".join(prompt.split()))))


def _end_of_prefix(query: str, prompt: str) -> int | None:
    """Where ``query`` continues after ``prompt``, whitespace ignored in both; None if it does not
    start with it, or the prompt is too long to match so (`MAX_PATTERN_CHARS`)."""
    if len(prompt) > MAX_PATTERN_CHARS:
        return None
    match = _pattern(prompt).match(query)
    return None if match is None else match.end()


MAX_PATTERN_CHARS = 100_000
"""Longer prompts match only as written or decoded, whitespace included (a pattern of millions of
characters would hold the service)."""


def load_tokenizer(name: str) -> Any:
    """The policy's tokenizer (``--tokenizer``: a local directory, or a hub id, from the cache first);
    `ConfigError` naming the flag when it cannot be loaded."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(name)
    except (OSError, ValueError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(
            f"--tokenizer {name!r}: cannot load it ({first}); give the policy's tokenizer as a local "
            "directory, or a hub id that is in the Hugging Face cache"
        ) from exc


def parse(
    payload: Any, reads: str | None, matcher: PromptMatcher, *, max_chars: int, max_references: int
) -> tuple[list[Item], list[int]]:
    """The items of an OpenRLHF request, and the samples whose query did not start with its prompt (those
    items carry `MISMATCH` as their problem).

    ``prompts`` must be a list as long as ``query`` (OpenRLHF always sends it): without the prompt there
    is no telling the completion from the query, and the query scored whole earns the prompt's words a
    reward, an empty completion too. A sample whose prompt is not a string with a visible character, or
    whose label cannot be read (`label_context`), is rewarded as invalid with the reason."""
    if not isinstance(payload, dict) or not isinstance(payload.get("query"), list):
        raise RequestError(422, 'expected {"query": [...], "prompts": [...], "labels": [...]}')
    queries = payload["query"]
    prompts = payload.get("prompts")
    labels = payload.get("labels")
    if not isinstance(prompts, list) or len(prompts) != len(queries):
        raise RequestError(
            422, NO_PROMPTS if not isinstance(prompts, list) else "prompts must be as long as query"
        )
    if reads is None and labels is None:
        labels = [{}] * len(queries)
    if not isinstance(labels, list) or len(labels) != len(queries):
        raise RequestError(
            422, "labels must be a list as long as query (they carry the references, image id or image)"
        )
    items, mismatched = [], []
    for n, (query, prompt, label) in enumerate(zip(queries, prompts, labels, strict=True)):
        context, problem = label_context(label, reads)
        caption: Any = completion_text(query, matcher.strip)  # not a string: the reward says why
        if problem is None and (not isinstance(prompt, str) or not prompt.strip()):
            problem = (
                f"{NO_PROMPT} (got {'a blank string' if isinstance(prompt, str) else json_type(prompt)})"
            )
        elif problem is None and isinstance(query, str):
            caption = matcher.completion(query, prompt)
            if caption is None:
                mismatched.append(n)
                problem = MISMATCH
        item = make_item(caption, context, reads, max_chars=max_chars, max_references=max_references)
        items.append(item if problem is None else dataclasses.replace(item, problem=problem))
    return items, mismatched


NO_PROMPTS = (
    "prompts must be a list as long as query: the caption is what follows each query's prompt, and a "
    "query scored whole would reward the prompt's words (OpenRLHF sends prompts; to score captions alone, "
    "use /v1/reward)"
)
NO_PROMPT = "no prompt to cut from the query (the query scored whole would reward the prompt's words)"
"""The reason of an invalid reward for a sample without a prompt."""


def label_context(label: Any, reads: str | None) -> tuple[dict[str, Any], str | None]:
    """Read an OpenRLHF label into ``{"references"}``, ``{"image_id"}`` or ``{"image"}``, and why it cannot
    be read, else None: a string that starts like a JSON list or object (``[``, ``{``) is read as JSON and
    must parse. Whether the context it gives is well formed is `make_item`'s to say."""
    if reads is None:
        return {}, None
    if isinstance(label, str) and label.lstrip().startswith(("[", "{")):
        try:
            label = json.loads(label)
        except (ValueError, RecursionError) as exc:
            kind = "list" if label.lstrip()[0] == "[" else "object"
            why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
            return {}, (
                f"the label starts like a JSON {kind} but is not valid JSON ({why}); send a JSON list or "
                "object that parses, e.g. '[\"a dog runs\"]'"
            )
    if isinstance(label, dict):
        return label, None
    if reads == "references":
        return {"references": [label] if isinstance(label, str) else label}, None
    return {reads: label}, None


def reply(
    payload: dict[str, Any],
    results: Sequence[RewardResult],
    logged: Sequence[str],
    key: str,
    extra_logs: bool,
) -> dict[str, Any]:
    """The answer OpenRLHF reads: ``rewards`` and ``scores``; with ``extra_logs`` and one query, the
    ``logged`` components and ``<key>_valid`` as numbers; the request's ``request_id`` (a string or an
    integer) echoed."""
    rewards = [r.reward for r in results]
    out: dict[str, Any] = {"rewards": rewards, "scores": rewards}
    if extra_logs and len(results) == 1:
        (r,) = results
        logs = {name: float(r.scores.get(name, 0.0)) for name in logged}
        out["extra_logs"] = {**logs, f"{key}_valid": 1.0 if r.valid else 0.0}
    request_id = payload.get("request_id")
    if isinstance(request_id, str) or (isinstance(request_id, int) and not isinstance(request_id, bool)):
        out["request_id"] = request_id
    return out
