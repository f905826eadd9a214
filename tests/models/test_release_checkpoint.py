"""The authors' Visual-T5 checkpoint layout: their ``VisualT5`` class (transformers 4.4.1) saved with
``save_pretrained`` gives ``config.json`` + ``pytorch_model.bin``. Its parameter names and shapes are
written out here from that class's structure (a T5 whose encoder stack holds ``img_emb``), not taken
from our model, so a renamed or reshaped parameter on our side fails these tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import T5Config

from qace.cli import main
from qace.models import loading
from qace.models.loading import is_visual_t5_checkpoint, load_visual_t5
from qace.models.visual_t5 import VisualT5ForConditionalGeneration


@pytest.fixture(autouse=True)
def _offline(monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def release_shapes(config: T5Config) -> dict[str, tuple[int, ...]]:
    """Parameter names and shapes of the release's ``VisualT5`` for ``config`` (its ``state_dict()``:
    the shared embedding appears under both stacks and the LM head; the cross-attention has no relative
    position bias in transformers 4.4.1)."""
    d, inner, ff, v = config.d_model, config.num_heads * config.d_kv, config.d_ff, config.vocab_size
    bias = (config.relative_attention_num_buckets, config.num_heads)
    shapes: dict[str, tuple[int, ...]] = {"shared.weight": (v, d), "lm_head.weight": (v, d)}

    def attention(prefix: str) -> None:
        shapes.update({f"{prefix}.{m}.weight": (inner, d) for m in "qkv"})
        shapes[f"{prefix}.o.weight"] = (d, inner)

    for stack, layers in (("encoder", config.num_layers), ("decoder", config.num_decoder_layers)):
        shapes[f"{stack}.embed_tokens.weight"] = (v, d)
        shapes[f"{stack}.final_layer_norm.weight"] = (d,)
        sublayers = ["SelfAttention"] + (["EncDecAttention"] if stack == "decoder" else []) + ["FF"]
        for i in range(layers):
            for j, kind in enumerate(sublayers):
                prefix = f"{stack}.block.{i}.layer.{j}"
                shapes[f"{prefix}.layer_norm.weight"] = (d,)
                if kind == "FF":
                    shapes[f"{prefix}.DenseReluDense.wi.weight"] = (ff, d)
                    shapes[f"{prefix}.DenseReluDense.wo.weight"] = (d, ff)
                else:
                    attention(f"{prefix}.{kind}")
        shapes[f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"] = bias
    shapes["encoder.img_emb.weight"] = (d, 2054)
    shapes["encoder.img_emb.bias"] = (d,)
    return shapes


@pytest.fixture(autouse=True)
def _t5_small_tokenizer(monkeypatch, test_models_dir) -> None:
    """The release's ckpt/ has no tokenizer (its demo loads t5-small's): the test model's stands in for
    t5-small here, offline."""
    monkeypatch.setattr(loading, "VQA_BASE", str(test_models_dir / "vqa"))


def write_release_checkpoint(out: Path, config: T5Config, state: dict[str, torch.Tensor]) -> Path:
    """``out`` laid out as the release's ``ckpt/``: config.json naming ``VisualT5``, pytorch_model.bin,
    no tokenizer files."""
    out.mkdir(parents=True)
    content = config.to_dict() | {"architectures": ["VisualT5"], "model_type": "t5"}
    (out / "config.json").write_text(json.dumps(content))
    torch.save(state, out / "pytorch_model.bin")
    return out


def test_release_names_and_shapes_load_with_nothing_missing_or_unexpected(tmp_path, test_models_dir) -> None:
    config = T5Config()  # T5Config's defaults are t5-small, the release's base
    shapes = release_shapes(config)
    generator = torch.Generator().manual_seed(0)
    state = {name: torch.randn(shape, generator=generator) * 0.05 for name, shape in shapes.items()}
    state["lm_head.weight"] = state["decoder.embed_tokens.weight"] = state["encoder.embed_tokens.weight"] = (
        state["shared.weight"]
    )
    ckpt = write_release_checkpoint(tmp_path / "ckpt", config, state)

    model, info = VisualT5ForConditionalGeneration.from_pretrained(ckpt, output_loading_info=True)
    assert info["missing_keys"] == set() or info["missing_keys"] == []
    assert not info["unexpected_keys"] and not info["mismatched_keys"]
    ours = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    assert ours == shapes

    loaded, tokenizer = load_visual_t5(ckpt)  # the loader users reach: a pytorch_model.bin directory
    assert tokenizer.name_or_path == loading.VQA_BASE  # no tokenizer files: t5-small's, as the release
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, state[name]), name
    assert is_visual_t5_checkpoint(ckpt)


def test_release_checkpoint_round_trips_through_qace_export(tmp_path, test_models_dir, capsys) -> None:
    """A pytorch_model.bin release directory is exported as Visual-T5 (auto-detected), validated against
    PyTorch, and the ONNX export names the checkpoint's content hash."""
    pytest.importorskip("onnxruntime")
    source = VisualT5ForConditionalGeneration.from_pretrained(test_models_dir / "vqa")
    config = source.config
    state = source.state_dict()
    assert {name: tuple(t.shape) for name, t in state.items()} == release_shapes(config)
    ckpt = write_release_checkpoint(tmp_path / "ckpt", config, dict(state.items()))

    assert main(["export", str(ckpt), str(tmp_path / "onnx")]) == 0
    manifest = json.loads((tmp_path / "onnx" / "fp32" / "manifest.json").read_text())
    assert manifest["visual"] is True
    assert manifest["validation"]["token_agreement"] == 1.0
    assert "identical greedy outputs 100%" in capsys.readouterr().out
