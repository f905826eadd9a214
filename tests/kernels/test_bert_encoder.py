"""BERTScore's half-precision encoder built without transformers' modelling code
(`qace.kernels.bert_encoder`): transformers' arithmetic, so the same scores."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from transformers import AutoModel, AutoTokenizer, RobertaConfig

from qace.kernels import bert_encoder, bertscore
from qace.kernels.bert_encoder import BertEncoder, BertSettings, build_bert, read_settings
from qace.models.loading import read_checkpoint

WORDS = "a dog runs on the grass two girls play with red ball in park near water".split()


def _sentences(n: int, seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(1, 9)))) for _ in range(n)]


@pytest.mark.parametrize("layers", [6, 3, 0])
def test_minilm_hidden_states_equal_transformers_in_fp32(layers: int) -> None:
    directory = bertscore.default_model_dir()
    config = read_settings(directory / "config.json")
    ours = build_bert(
        config, read_checkpoint(directory), layers, device=torch.device("cpu"), dtype=torch.float32
    )
    theirs = AutoModel.from_pretrained(directory, dtype=torch.float32).eval()
    batch = AutoTokenizer.from_pretrained(directory)(_sentences(7, 0), padding=True, return_tensors="pt")
    with torch.inference_mode():
        want = theirs(**batch, output_hidden_states=True).hidden_states[layers]
        got = ours(batch["input_ids"], batch["attention_mask"])
    real = batch["attention_mask"].bool()
    assert torch.equal(got[real], want[real])


def test_roberta_positions_and_prefixed_weights(tmp_path) -> None:
    """RoBERTa numbers positions after the pad id, and the hub's roberta-large is a masked-LM checkpoint
    whose encoder weights sit under ``roberta.``."""
    from transformers import RobertaForMaskedLM

    config = RobertaConfig(
        vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=4, intermediate_size=32,
        max_position_embeddings=40, pad_token_id=1,
    )  # fmt: skip
    torch.manual_seed(0)
    theirs = RobertaForMaskedLM(config).eval()
    weights = theirs.state_dict()
    assert any(k.startswith("roberta.") for k in weights)
    known = BertSettings.__dataclass_fields__
    settings = BertSettings(**{k: v for k, v in config.to_dict().items() if k in known})
    ours = build_bert(settings, weights, 2, device=torch.device("cpu"), dtype=torch.float32)
    ids = torch.tensor([[0, 5, 9, 7, 2], [0, 4, 2, 1, 1]])
    mask = ids.ne(1).long()
    with torch.inference_mode():
        want = theirs.roberta(input_ids=ids, attention_mask=mask).last_hidden_state
        got = ours(ids, mask)
    assert torch.equal(got[mask.bool()], want[mask.bool()])
    with pytest.raises(KeyError, match="query"):
        build_bert(
            settings,
            {k: v for k, v in weights.items() if "query" not in k},
            2,
            device="cpu",
            dtype=torch.float32,
        )


def test_half_matcher_scores_equal_transformers_half(monkeypatch) -> None:
    native = bertscore.BertScoreMatcher(precision="fp16")
    assert isinstance(native._encoder, BertEncoder)
    monkeypatch.setattr(bert_encoder, "FAMILIES", ())  # the same matcher on transformers' model
    theirs = bertscore.BertScoreMatcher(precision="fp16")
    assert not isinstance(theirs._encoder, BertEncoder)
    cands, refs = _sentences(200, 1), _sentences(200, 2)
    np.testing.assert_array_equal(native.score(cands, refs), theirs.score(cands, refs))
    assert native.signature == theirs.signature


def test_settings_defaults_are_transformers() -> None:
    from transformers import BertConfig

    defaults = BertConfig().to_dict()
    for name in BertSettings.__dataclass_fields__:
        if name in defaults:  # transformers 5 dropped position_embedding_type (always absolute)
            assert getattr(BertSettings(), name) == defaults[name], name


def test_half_matcher_imports_no_modelling_code() -> None:
    """Nor transformers' auto classes and generation code: in some releases (5.17) they import
    torch._dynamo."""
    script = (
        "import sys\n"
        "from qace.kernels.bertscore import BertScoreMatcher\n"
        "m = BertScoreMatcher(precision='fp16')\n"
        "m.score(['a dog'], ['the dog'])\n"
        "heavy = ('transformers.modeling_utils', 'torch._dynamo', 'transformers.models.auto.auto_factory',"
        " 'transformers.generation.utils')\n"
        "print(sorted(x for x in heavy if x in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_batches_padded_to_few_shapes_keep_their_real_rows() -> None:
    """`bertscore._padded_batch` (the half encoder on a GPU): the real rows come first, unchanged, the
    width becomes a multiple of 8 and the tokens a `padded_rows` count; the real tokens' states are
    those of the unpadded batch, to rounding, and the new rows are finite."""
    directory = bertscore.default_model_dir()
    config = read_settings(directory / "config.json")
    ours = build_bert(config, read_checkpoint(directory), 6, device=torch.device("cpu"), dtype=torch.float32)
    batch = AutoTokenizer.from_pretrained(directory)(_sentences(3, 3), padding=True, return_tensors="np")
    ids, mask = batch["input_ids"], batch["attention_mask"]
    padded_ids, padded_mask = bertscore._padded_batch(ids, mask, 0)
    rows, width = ids.shape
    total, wide = padded_ids.shape
    assert padded_mask.shape == (total, wide) and wide == -(-width // 8) * 8
    assert total == -(-bertscore.padded_rows(rows * wide) // wide) and total > rows
    assert (padded_ids[:rows, :width] == ids).all() and (padded_mask[:rows, :width] == mask).all()
    assert not padded_mask[:rows, width:].any() and (padded_mask[rows:, 0] == 1).all()
    with torch.inference_mode():
        want = ours(torch.from_numpy(ids), torch.from_numpy(mask))
        got = ours(torch.from_numpy(padded_ids), torch.from_numpy(padded_mask))
    real = torch.from_numpy(mask).bool()
    torch.testing.assert_close(got[:rows, :width][real], want[real], rtol=1e-5, atol=1e-5)
    assert torch.isfinite(got).all()
