"""`PosRules` against spaCy's own `AttributeRuler` as the oracle: random patterns on random docs, and the
real pipeline's rules on captions."""

from __future__ import annotations

import random

import pytest
import spacy
from spacy.pipeline import AttributeRuler
from spacy.tokens import Doc

from qace.metric.candidates import load_spacy
from qace.metric.pos_rules import PosRules, unsupported
from tests.helpers import flickr_records

WORDS = ["a", "A", "do", "have", "the", "dog", "'s", "nothing", " ", "him"]
TAGS = ["NN", "VB", "DT", "PRP", "TO", "_SP", "VBZ"]
FIELDS = ["ORTH", "LOWER", "TAG", "DEP", "IS_SPACE"]
DEPS = ["ROOT", "nsubj", "det", "dobj", "conj", "aux"]
SETS = {
    "POS": ["NOUN", "VERB", "PRON", "AUX", "X"],
    "TAG": TAGS,
    "DEP": DEPS,
    "LEMMA": ["x", "be"],
    "MORPH": ["Number=Sing", "VerbForm=Inf"],
}


def _condition(rng: random.Random, key: str) -> object:
    values = {"ORTH": WORDS, "LOWER": [w.lower() for w in WORDS], "TAG": TAGS, "DEP": DEPS}.get(key)
    if values is None:  # IS_SPACE
        return rng.random() < 0.5
    roll = rng.random()
    if roll < 0.5:
        return rng.choice(values)
    return {"IN" if roll < 0.8 else "NOT_IN": rng.sample(values, rng.randint(1, 3))}


def _patterns(rng: random.Random) -> list[dict]:
    entries = []
    for _ in range(rng.randint(1, 25)):
        length = 1 if rng.random() < 0.7 else 2
        pattern = [
            {key: _condition(rng, key) for key in rng.sample(FIELDS, rng.randint(1, 2))}
            for _ in range(length)
        ]
        attrs = {key: rng.choice(SETS[key]) for key in rng.sample(list(SETS), rng.randint(1, 3))}
        entries.append({"patterns": [pattern], "attrs": attrs, "index": rng.choice(range(-length, length))})
    return entries


def _doc(vocab, rng: random.Random) -> Doc:
    n = rng.randint(0, 9)
    words = [rng.choice(WORDS) for _ in range(n)]
    return Doc(
        vocab,
        words=words,
        spaces=[w != " " for w in words],
        tags=[rng.choice(TAGS) for _ in words],
        deps=[rng.choice(DEPS) for _ in words],
        heads=list(range(n)),
    )


def _read(doc: Doc) -> list[tuple[int, int, int]]:
    return [(t.pos, t.tag, t.dep) for t in doc]


def test_random_rules_set_what_spacys_attribute_ruler_sets():
    nlp = spacy.blank("en")
    rng = random.Random(0)
    compared = changed = 0
    for _ in range(300):
        patterns = _patterns(rng)
        ruler = AttributeRuler(nlp.vocab)
        ruler.add_patterns(patterns)
        rules = PosRules(nlp, "rules", patterns)
        for _ in range(10):
            doc = _doc(nlp.vocab, rng)
            before = _read(doc)
            expected = _read(ruler(doc.copy()))
            assert _read(rules(doc.copy())) == expected, (patterns, [t.text for t in doc])
            compared += 1
            changed += expected != before
    assert compared == 3000 and changed > 1000  # the rules did fire, often


def test_the_pipelines_rules_give_spacys_tags_on_captions():
    odd = ["", " ", "  a dog  runs ", "A man\n\nin a hat .", "I did it , he had one", "ol' man river"]
    odd += ["Nothing here but everyone 's dog", "he 'd have done it", "Don't you?", "caf\u00e9 na\u00efve"]
    captions = odd + [r.caption for r in flickr_records(300)]
    fast, stock = load_spacy(), load_spacy(pos_rules=False)
    assert isinstance(fast.get_pipe("attribute_ruler"), PosRules)
    assert isinstance(stock.get_pipe("attribute_ruler"), AttributeRuler)
    assert [_read(d) for d in fast.pipe(captions)] == [_read(d) for d in stock.pipe(captions)]


@pytest.mark.parametrize(
    ("entry", "reason"),
    [
        ({"patterns": [[{"LOWER": "a", "OP": "+"}]], "attrs": {"POS": "X"}}, "token field 'OP'"),
        ({"patterns": [[{"LOWER": {"REGEX": "^a"}}]], "attrs": {"POS": "X"}}, "operator ['REGEX']"),
        ({"patterns": [[{"LOWER": "a"}]], "attrs": {"POS": "X", "NORM": "b"}}, "attributes ['NORM', 'POS']"),
        ({"patterns": [[{"LOWER": "a"}]], "attrs": {"POS": "X"}, "index": 1}, "index 1 outside"),
    ],
)
def test_patterns_it_cannot_evaluate_are_refused_with_the_reason(entry, reason):
    assert reason in (unsupported([entry]) or "")
    with pytest.raises(ValueError, match="cannot evaluate"):
        PosRules(spacy.blank("en"), "rules", [entry])
    lemma_only = {"patterns": [[{"LOWER": "a", "OP": "+"}]], "attrs": {"LEMMA": "x"}}
    assert unsupported([lemma_only]) is None  # ignored: it sets nothing PosRules sets
