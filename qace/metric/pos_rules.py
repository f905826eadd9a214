"""The attribute ruler's coarse tags as table lookups: a spaCy pipe that sets what an `AttributeRuler`
would set for the attributes candidates read.

spaCy's English pipelines take their coarse tags (``POS``, which noun chunks read) from an attribute
ruler: 179 token patterns in ``en_core_web_sm`` 3.8.0, run through spaCy's `Matcher`. `PosRules`
evaluates the same patterns, for the attributes ``POS``, ``TAG`` and ``DEP`` only, as dictionary
lookups: a single-token pattern's outcome depends only on the token's values of the fields the patterns
test, so each distinct combination is resolved once and remembered (docs/performance.md: what it saves).

Contract: on any parsed doc, ``POS``, ``TAG`` and ``DEP`` of every token equal what the ruler's patterns
would give, with the ruler's precedence (all matches found on the doc as it comes, then applied in
pattern order, so the last pattern that matches a token wins). ``LEMMA`` and ``MORPH``, which the ruler
also sets, are left unset: candidates never read them. Patterns this class cannot evaluate exactly
(`unsupported`) keep the ruler (`qace.metric.candidates.load_spacy`).
"""

from __future__ import annotations

from typing import Any

from spacy.attrs import IDS as ATTR_IDS
from spacy.language import Language
from spacy.parts_of_speech import IDS as POS_IDS
from spacy.strings import get_string_id

SET = ("POS", "TAG", "DEP")
"""The attributes applied; the ruler's others (``LEMMA``, ``MORPH``) are dropped."""

TESTED = ("ORTH", "LOWER", "TAG", "DEP", "IS_SPACE")
"""Token fields a pattern may test, with a literal value or an ``IN`` / ``NOT_IN`` list."""

FACTORY = "qace_pos_rules"

_OTHER = -1
"""A tested field's value that no pattern names (hashes are non-negative)."""


def unsupported(patterns: list[dict[str, Any]]) -> str | None:
    """Why `PosRules` cannot stand for an attribute ruler with these patterns, or None when it can."""
    for entry in patterns:
        if set(entry) - {"patterns", "attrs", "index"}:
            return f"pattern entry keys {sorted(entry)}"
        if not set(entry["attrs"]) & set(SET):
            continue
        if set(entry["attrs"]) - {*SET, "LEMMA", "MORPH"}:
            return f"attributes {sorted(entry['attrs'])}"
        for pattern in entry["patterns"]:
            for token in pattern:
                for key, value in token.items():
                    if key not in TESTED:
                        return f"token field {key!r}"
                    if isinstance(value, dict) and (len(value) != 1 or set(value) - {"IN", "NOT_IN"}):
                        return f"operator {sorted(value)}"
            if not -len(pattern) <= entry.get("index", 0) < len(pattern):
                return f"index {entry.get('index', 0)} outside a pattern of {len(pattern)} tokens"
    return None


def _value(value: Any) -> int:
    return get_string_id(value) if isinstance(value, str) else int(value)


class _Test:
    """One token's condition: per tested field, the accepted values (or, negated, the refused ones)."""

    def __init__(self, token: dict[str, Any], fields: tuple[str, ...]) -> None:
        self.checks: list[tuple[int, frozenset[int], bool]] = []
        for key, value in token.items():
            if isinstance(value, dict):
                ((op, values),) = value.items()
                self.checks.append((fields.index(key), frozenset(map(_value, values)), op == "IN"))
            else:
                self.checks.append((fields.index(key), frozenset([_value(value)]), True))

    def __call__(self, row: tuple[int, ...]) -> bool:
        return all((row[field] in values) is wanted for field, values, wanted in self.checks)


class PosRules:
    """A pipe standing for an attribute ruler with ``patterns`` (its ``.patterns``), for `SET` only."""

    def __init__(self, nlp: Language, name: str, patterns: list[dict[str, Any]]) -> None:
        reason = unsupported(patterns)
        if reason is not None:
            raise ValueError(f"PosRules cannot evaluate these attribute-ruler patterns: {reason}")
        self.name = name
        kept = [(order, e) for order, e in enumerate(patterns) if set(e["attrs"]) & set(SET)]
        tokens = [token for _, entry in kept for pattern in entry["patterns"] for token in pattern]
        self.fields = tuple(field for field in TESTED if any(field in token for token in tokens))
        self._attr_ids = [ATTR_IDS[f] for f in self.fields]
        named: list[set[int]] = [set() for _ in self.fields]
        self._single: list[tuple[int, _Test, dict[str, int]]] = []
        self._multi: list[tuple[int, list[_Test], int, dict[str, int]]] = []
        for order, entry in kept:
            attrs = {
                key: POS_IDS[value] if key == "POS" else nlp.vocab.strings.add(value)
                for key, value in entry["attrs"].items()
                if key in SET
            }
            for pattern in entry["patterns"]:
                tests = [_Test(token, self.fields) for token in pattern]
                for test in tests:
                    for field, values, _ in test.checks:
                        named[field] |= values
                index = entry.get("index", 0) % len(pattern)
                if len(pattern) == 1:
                    self._single.append((order, tests[0], attrs))
                else:
                    self._multi.append((order, tests, index, attrs))
        self._named = [frozenset(values) for values in named]
        self._resolved: dict[tuple[int, ...], dict[str, tuple[int, int]]] = {}
        """Per distinct row of named values: attribute -> (pattern order, value) of the last match."""

    def _resolve(self, row: tuple[int, ...]) -> dict[str, tuple[int, int]]:
        found: dict[str, tuple[int, int]] = {}
        for order, test, attrs in self._single:
            if test(row):
                found.update((key, (order, value)) for key, value in attrs.items())
        return found

    def __call__(self, doc: Any) -> Any:
        if not len(doc):
            return doc
        values = (
            doc.to_array(self._attr_ids).reshape(len(doc), -1).tolist() if self.fields else [[]] * len(doc)
        )
        rows = [
            tuple(v if v in known else _OTHER for v, known in zip(row, self._named, strict=True))
            for row in values
        ]
        targets: list[dict[str, tuple[int, int]]] = []
        for row in rows:
            found = self._resolved.get(row)
            if found is None:
                found = self._resolved[row] = self._resolve(row)
            targets.append(found)
        for order, tests, index, attrs in self._multi:
            for start in range(len(rows) - len(tests) + 1):
                if all(test(rows[start + k]) for k, test in enumerate(tests)):
                    target = targets[start + index] = dict(targets[start + index])
                    for key, value in attrs.items():
                        if key not in target or target[key][0] <= order:
                            target[key] = (order, value)
        for token, found in zip(doc, targets, strict=True):
            for key, (_, value) in found.items():
                setattr(token, key.lower(), value)
        return doc


@Language.factory(FACTORY, default_config={"patterns": []})
def make_pos_rules(nlp: Language, name: str, patterns: list[dict[str, Any]]) -> PosRules:
    """spaCy's factory for `PosRules` (``nlp.replace_pipe("attribute_ruler", FACTORY, config=...)``)."""
    return PosRules(nlp, name, patterns)
