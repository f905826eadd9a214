"""The family table: a loaded model's type picks the encoder and decoder its runner gets."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from qace.errors import ConfigError
from qace.families import FAMILIES, parts_for, torch_runner
from qace.families.t5 import T5Encoding
from qace.families.t5.decoder import StaticT5Decoder
from qace.models.loading import load_seq2seq, load_visual_t5


def test_t5_and_visual_t5_run_on_the_t5_family(test_models_dir) -> None:
    text, _ = load_seq2seq(str(test_models_dir / "qg"), role="QG")
    visual, _ = load_visual_t5(test_models_dir / "vqa")
    for model in (text, visual):
        runner = torch_runner(model)
        assert isinstance(runner.encoder, T5Encoding) and isinstance(runner.decoder, StaticT5Decoder)
    assert torch_runner(text).encoder.feature_dtype is None
    assert torch_runner(visual).encoder.feature_dtype == visual.encoder.img_emb.weight.dtype


def test_a_model_type_without_a_family_is_an_error_naming_the_known_ones() -> None:
    model = SimpleNamespace(config=SimpleNamespace(model_type="bart"))
    with pytest.raises(ConfigError, match="'bart'") as info:
        parts_for(model)
    assert all(name in str(info.value) for name in FAMILIES)
