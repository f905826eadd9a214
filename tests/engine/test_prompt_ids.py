"""Prompt ids composed from their parts' ids equal the prompts tokenised whole, on every tokenizer kind."""

from __future__ import annotations

import io

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from qace.engine import prompt_ids as pid
from qace.engine.prompt_ids import PromptIds, composable, prompt_ids
from qace.engine.tokenize import token_ids
from qace.metric.prompts import QG_TEMPLATE, TQA_TEMPLATE, qg_input, tqa_input
from qace.models.visual_inputs import VISUAL_QUESTION_PREFIX

CAPTIONS = [
    "A young child is wearing blue goggles and sitting in a float in a pool.",
    "Two dogs, one black and one brown, run on the grass (at 12:30)!",
    "a man's red-and-white shirt",
    "What is the girl wearing?",
]
TRICKY = [
    "naïve café",  # not ASCII: tokenised whole
    "dog </s> cat",  # an added token inside
    " leading",
    "trailing ",
    "",
    "a  b",
    "tab\there",
    "ＡＢＣ ﬁne",  # changed by NFKC
    "Capital",  # changed by a lowercasing normalizer
    "<extra_id_0>",
]
TEMPLATES = [  # template, special tokens, the prompt text as the reference implementation writes it
    (QG_TEMPLATE, True, lambda r: qg_input(*r)),
    (TQA_TEMPLATE, True, lambda r: tqa_input(*r)),
    (VISUAL_QUESTION_PREFIX + "{question}", False, lambda r: VISUAL_QUESTION_PREFIX + r[0]),
    ("{text}", True, lambda r: r[0]),
]


def _t5_style(*, whitespace_split: bool, replace: bool) -> PreTrainedTokenizerFast:
    """A T5-style tokenizer: sentencepiece unigram with T5's ids and its nmt_nfkc charsmap (the
    ``Precompiled`` normalizer of real T5 tokenizer files), in two pre-tokenizer layouts seen in them."""
    spm = pytest.importorskip("sentencepiece")
    from sentencepiece import sentencepiece_model_pb2
    from tokenizers import AddedToken, Regex, Tokenizer, models, normalizers, pre_tokenizers, processors

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CAPTIONS * 20 + TRICKY),
        model_writer=model,
        vocab_size=120,
        model_type="unigram",
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        normalization_rule_name="nmt_nfkc",
        hard_vocab_limit=False,
        minloglevel=2,
    )
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model.getvalue())
    backend = Tokenizer(models.Unigram([(p.piece, p.score) for p in proto.pieces], unk_id=2))
    steps = [normalizers.Precompiled(proto.normalizer_spec.precompiled_charsmap)]
    if replace:
        steps.append(normalizers.Replace(Regex(" {2,}"), " "))
    backend.normalizer = normalizers.Sequence(steps)
    meta = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    backend.pre_tokenizer = (
        pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), meta]) if whitespace_split else meta
    )
    specials = ["<pad>", "</s>", "<unk>", "<extra_id_0>"]
    backend.add_special_tokens([AddedToken(t, special=True) for t in specials])
    backend.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    )


def _tokenizers(test_models_dir):
    yield "test models", AutoTokenizer.from_pretrained(test_models_dir / "tqa")
    yield "t5 whitespace-split", _t5_style(whitespace_split=True, replace=False)
    yield "t5 metaspace", _t5_style(whitespace_split=False, replace=True)
    minilm = pytest.importorskip("qace.kernels.bertscore").default_model_dir()
    if minilm.is_dir():
        yield "wordpiece", AutoTokenizer.from_pretrained(minilm)


def _rows(fields: int) -> list[tuple[str, ...]]:
    parts = CAPTIONS + TRICKY
    if fields == 1:
        return [(p,) for p in parts]
    words = [w for c in CAPTIONS for w in c.split()[:3]]
    return [(a, c) for a in words + TRICKY for c in parts]


def test_composed_ids_equal_whole_prompts(test_models_dir) -> None:
    composed = []
    for name, tokenizer in _tokenizers(test_models_dir):
        for template, special, text in TEMPLATES:
            encode = PromptIds(tokenizer, template, special_tokens=special)
            rows = _rows(encode.fields)
            want = token_ids(tokenizer, [text(r) for r in rows], special_tokens=special)
            assert encode(rows) == want, (name, template)
            assert encode(rows) == want, (name, template)  # again, from the parts' cache
            composed.append((name, template, encode.composed))
            assert encode.by_words == encode.composed, (name, template)  # parts from their words
    # the fast path is what ran (where it may: a lowercasing WordPiece can't take QG's literal </s>)
    assert all(ok for name, template, ok in composed if name != "wordpiece")
    assert sum(ok for name, _, ok in composed if name == "wordpiece") >= 2


def test_a_lone_metaspace_token_before_eos_is_kept(test_models_dir) -> None:
    """Without a whitespace split, T5's "caption </s>" gives a lone "▁" before </s>; composing keeps it."""
    tokenizer = _t5_style(whitespace_split=False, replace=True)
    (ids,) = token_ids(tokenizer, ["dog </s>"], special_tokens=False)
    assert ids[-2] == tokenizer.convert_tokens_to_ids("▁")
    encode = PromptIds(tokenizer, QG_TEMPLATE)
    assert encode.composed and encode([("dog", "a dog")]) == tokenizer([qg_input("dog", "a dog")]).input_ids


def test_words_are_tokenised_once_and_odd_parts_whole(test_models_dir, monkeypatch) -> None:
    """New parts cost the tokenizer only their new words; a part with a double space is tokenised alone,
    a part that cannot be composed goes whole with its prompt; parts and words met before cost nothing."""
    tokenizer = AutoTokenizer.from_pretrained(test_models_dir / "tqa")
    encode = PromptIds(tokenizer, TQA_TEMPLATE)
    assert encode.by_words
    calls: list[list[str]] = []
    real = pid.token_ids

    def counting(tok, texts, **kwargs):
        calls.append(list(texts))
        return real(tok, texts, **kwargs)

    monkeypatch.setattr(pid, "token_ids", counting)
    rows = [("who runs ?", "a dog runs"), ("who runs ?", "a cat"), ("what ?", "naïve café")]
    assert encode(rows) == real(tokenizer, [tqa_input(*r) for r in rows])
    assert calls == [
        ["?", "a", "cat", "dog", "runs", "what", "who"],
        [tqa_input("what ?", "naïve café")],
    ]
    calls.clear()
    rows = [("what ?", "a dog runs"), ("who ?", "a cat runs"), ("who ?", "a  cat")]
    assert encode(rows) == real(tokenizer, [tqa_input(*r) for r in rows])
    assert calls == [["a  cat"]]  # "who ?" and "a cat runs" are new parts of known words


def test_the_parts_cache_starts_over_when_full(test_models_dir, monkeypatch) -> None:
    tokenizer = AutoTokenizer.from_pretrained(test_models_dir / "tqa")
    monkeypatch.setattr(pid, "CACHE_PARTS", 10)
    encode = PromptIds(tokenizer, "{a} and {b}")
    first = [(f"dog {i}", f"cat {i}") for i in range(4)]
    second = [(f"bird {i}", f"fish {i}") for i in range(2)]
    for rows in (first, second):
        assert encode(rows) == token_ids(tokenizer, [f"{a} and {b}" for a, b in rows])
    assert set(encode._parts) == {part for row in second for part in row}  # 8 + 4 parts > 10


def test_the_words_cache_starts_over_when_full(test_models_dir, monkeypatch) -> None:
    tokenizer = AutoTokenizer.from_pretrained(test_models_dir / "tqa")
    monkeypatch.setattr(pid, "CACHE_WORDS", 5)
    encode = PromptIds(tokenizer, "{a} and {b}")
    first = [("a dog runs", "on the grass")]  # 6 words
    second = [("two cats", "sit")]
    for rows in (first, second):
        assert encode(rows) == token_ids(tokenizer, [f"{a} and {b}" for a, b in rows])
    assert set(encode._words) == {"two", "cats", "sit"}


def test_tokenizers_that_cannot_compose_tokenise_whole(test_models_dir) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # spaces belong to the next word
    backend.train_from_iterator(CAPTIONS, trainers.BpeTrainer(vocab_size=300, show_progress=False))
    byte_level = PreTrainedTokenizerFast(tokenizer_object=backend)
    assert not composable(byte_level)
    test_tokenizer = AutoTokenizer.from_pretrained(test_models_dir / "tqa")
    assert composable(test_tokenizer)
    for tokenizer, template, text in [
        (byte_level, TQA_TEMPLATE, lambda r: tqa_input(*r)),
        (test_tokenizer, "answer:{a} context", lambda r: f"answer:{r[0]} context"),
    ]:
        encode = PromptIds(tokenizer, template)
        rows = _rows(encode.fields)
        assert not encode.composed
        assert encode(rows) == token_ids(tokenizer, [text(r) for r in rows])


def test_one_encoder_per_tokenizer_and_template(test_models_dir) -> None:
    tokenizer = AutoTokenizer.from_pretrained(test_models_dir / "tqa")
    assert prompt_ids(tokenizer, QG_TEMPLATE) is prompt_ids(tokenizer, QG_TEMPLATE)
    assert prompt_ids(tokenizer, QG_TEMPLATE) is not prompt_ids(tokenizer, TQA_TEMPLATE)
    assert prompt_ids(tokenizer, QG_TEMPLATE) is not prompt_ids(tokenizer, QG_TEMPLATE, special_tokens=False)


def test_encoders_do_not_keep_their_tokenizer_alive(test_models_dir) -> None:
    import gc
    import weakref

    tokenizer = AutoTokenizer.from_pretrained(test_models_dir / "tqa")
    assert prompt_ids(tokenizer, QG_TEMPLATE)([("a dog", "a dog runs")])
    assert tokenizer in pid._ENCODERS
    alive = weakref.ref(tokenizer)
    del tokenizer
    gc.collect()  # other tests' tokenizers may go too: only this one's fate is checked
    assert alive() is None


def test_the_normalizers_check_reads_the_characters_it_changes(test_models_dir) -> None:
    """With a per-character normalizer (lowercasing WordPiece, T5's charsmap with its space collapsing)
    every printable-ASCII part without repeated spaces is composed, capitals included (as the normalizer
    makes it), with the ids of the part tokenised whole; a normalizer that joins characters is found
    out."""
    import random

    rng = random.Random(5)
    alphabet = "abcXYZ019 .,'-!?()"
    values = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12))) for _ in range(3000)]
    values += [v for c in CAPTIONS for v in (c, c.lower(), c.replace(" ", "  "))] + TRICKY
    values = list(dict.fromkeys(values))
    checked = 0
    for name, tokenizer in _tokenizers(test_models_dir):
        encode = PromptIds(tokenizer, "{text}")
        if encode._normalize is None:
            continue
        assert encode._per_character and encode.by_words, name
        assert encode([(v,) for v in values]) == token_ids(tokenizer, values), name
        simple = [
            v for v in values
            if v.isascii() and v.isprintable() and v.strip() == v and v and "  " not in v
            and not (encode._added is not None and encode._added.search(v))
        ]  # fmt: skip
        assert all(encode._plain(v) for v in simple), name
        checked += 1
    assert checked >= 2  # the T5-style charsmaps, and WordPiece where MiniLM is installed
    joining = {"ab": "x"}

    def normalize(text: str) -> str:
        for old, new in joining.items():
            text = text.replace(old, new)
        return text

    assert pid._changing_characters(normalize) == (False, None, None)
    per_character, changing, folding = pid._changing_characters(str.lower)
    assert per_character and changing is not None
    assert folding == {ord(c): c.lower() for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ"}
