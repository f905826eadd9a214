"""Half-precision models built without transformers' modelling code (`qace.models.t5_modules`) hold
exactly the weights transformers' classes hold, and the engine gets the same outputs from them."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from transformers import T5Config

from qace.errors import ModelNotFoundError
from qace.families import torch_runner
from qace.models import loading
from qace.models.t5_modules import T5Settings, T5Weights, build_t5, read_settings
from tests.engine.test_torch_runner import _text_batches, _visual_batches

HALVES = [torch.bfloat16, torch.float16]
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.fixture(autouse=True)
def _offline(monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _load(test_models_dir, role: str, dtype: torch.dtype, device: str = "cpu"):
    if role == "vqa":
        return loading.load_visual_t5(test_models_dir / "vqa", device=device, dtype=dtype)
    return loading.load_seq2seq(str(test_models_dir / role), role=role, device=device, dtype=dtype)


@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize("role", ["qg", "tqa", "vqa"])
def test_half_models_hold_transformers_weights(test_models_dir, role: str, dtype: torch.dtype) -> None:
    native, _ = _load(test_models_dir, role, dtype)
    reference, _ = _load(test_models_dir, role, torch.float32)  # transformers' class
    assert isinstance(native, T5Weights) and not isinstance(reference, T5Weights)
    want = {k: v.to(dtype) for k, v in reference.state_dict().items()}
    got = native.state_dict()
    assert set(got) == set(want)
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name
    assert native.encoder.embed_tokens is native.shared and native.decoder.embed_tokens is native.shared
    assert native.lm_head.weight is native.shared.weight  # T5 v1.0 ties the output projection
    for stack, want_stack in ((native.encoder, reference.encoder), (native.decoder, reference.decoder)):
        got_bias = stack.block[0].layer[0].SelfAttention.compute_bias(9, 13)
        assert torch.equal(got_bias, want_stack.block[0].layer[0].SelfAttention.compute_bias(9, 13).to(dtype))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("role", ["tqa", "vqa"])
def test_engine_outputs_equal_on_both_classes(test_models_dir, role: str, device: str) -> None:
    """The engine's half-precision encoder and decoder read only weights: the same weights in either
    class give the same tokens and answerability, bit for bit."""
    native, tokenizer = _load(test_models_dir, role, torch.bfloat16, device)
    reference = _load(test_models_dir, role, torch.float32, device)[0].to(torch.bfloat16)
    batches = _visual_batches(tokenizer, device, 2) if role == "vqa" else _text_batches(tokenizer, 2)
    runners = torch_runner(native, device=device), torch_runner(reference, device=device)
    for _, batch in batches:
        got, want = (runner.generate(batch, max_new_tokens=10, unanswerable_id=5) for runner in runners)
        assert got.tokens == want.tokens
        np.testing.assert_array_equal(got.answerability, want.answerability)


def test_gated_feed_forward_matches_transformers(tmp_path, test_models_dir) -> None:
    """T5 v1.1 checkpoints (gated GELU, no output scaling) build too, with transformers' weights and
    arithmetic."""
    from transformers import T5ForConditionalGeneration

    config = T5Config(
        vocab_size=64, d_model=16, d_kv=4, d_ff=24, num_layers=2, num_heads=4,
        feed_forward_proj="gated-gelu", tie_word_embeddings=False,
    )  # fmt: skip
    torch.manual_seed(0)
    reference = T5ForConditionalGeneration(config).eval()
    reference.save_pretrained(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(test_models_dir / "qg" / name, tmp_path / name)
    native, _ = loading.load_seq2seq(str(tmp_path), role="qg", dtype=torch.bfloat16)
    loaded, _ = loading.load_seq2seq(str(tmp_path), role="qg")  # transformers' class, as it loads them
    assert not native.config.scale_decoder_outputs
    want = {k: v.to(torch.bfloat16) for k, v in loaded.state_dict().items()}
    assert all(torch.equal(native.state_dict()[k], v) for k, v in want.items())
    x = torch.randn(3, 5, 16, dtype=torch.bfloat16)
    ff = native.encoder.block[1].layer[-1].DenseReluDense
    want_ff = loaded.encoder.block[1].layer[-1].DenseReluDense.to(torch.bfloat16)
    assert torch.equal(ff(x), want_ff(x))


def test_missing_weights_are_an_error_in_half_precision(tmp_path, test_models_dir) -> None:
    from safetensors.torch import load_file, save_file

    shutil.copytree(test_models_dir / "tqa", tmp_path / "tqa")
    weights = load_file(tmp_path / "tqa" / "model.safetensors")
    dropped = "decoder.block.0.layer.2.DenseReluDense.wo.weight"
    save_file({k: v for k, v in weights.items() if k != dropped}, tmp_path / "tqa" / "model.safetensors")
    with pytest.raises(ModelNotFoundError, match="TQA model.*lacks weights.*DenseReluDense"):
        loading.load_seq2seq(str(tmp_path / "tqa"), role="tqa", dtype=torch.bfloat16)
    with pytest.raises(ModelNotFoundError, match="img_emb"):
        loading.load_visual_t5(test_models_dir / "qg", dtype=torch.bfloat16)


def test_build_reports_what_the_checkpoint_lacks_and_adds(test_models_dir) -> None:
    from safetensors.torch import load_file

    weights = load_file(test_models_dir / "qg" / "model.safetensors")
    config = read_settings(test_models_dir / "qg" / "config.json")
    weights["encoder.extra.weight"] = torch.zeros(1)
    weights["decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight"] = torch.zeros(1)
    _, missing, unexpected = build_t5(config, weights, visual=True, device="cpu", dtype=torch.bfloat16)
    assert missing == ["encoder.img_emb.bias", "encoder.img_emb.weight"]
    assert unexpected == ["encoder.extra.weight"]  # T5's never-used cross-attention bias is not reported


def test_hub_snapshot_in_the_cache_loads_offline(tmp_path, test_models_dir, monkeypatch) -> None:
    """A hub id resolves to its snapshot in the Hugging Face cache, with nothing asked online."""
    import huggingface_hub.constants

    repo = tmp_path / "hub" / "models--someone--t5-qg"
    snapshot = repo / "snapshots" / "0123abcd"
    shutil.copytree(test_models_dir / "qg", snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    native, tokenizer = loading.load_seq2seq("someone/t5-qg", role="qg", dtype=torch.bfloat16)
    local, _ = loading.load_seq2seq(str(test_models_dir / "qg"), role="qg", dtype=torch.bfloat16)
    assert isinstance(native, T5Weights) and tokenizer.eos_token_id == 1
    assert all(
        torch.equal(a, b)
        for a, b in zip(native.state_dict().values(), local.state_dict().values(), strict=True)
    )


def test_half_precision_loading_imports_no_modelling_code(test_models_dir) -> None:
    """The point of these modules: building the scorer's models in half precision leaves transformers'
    modelling code (and torch._dynamo, which it pulls in) unimported, and its auto classes and generation
    code, which import torch._dynamo in some releases (5.17) and which its T5Config imports."""
    script = textwrap.dedent(
        f"""
        import sys, torch
        from qace.models import loading
        from qace.families import torch_runner
        d = {str(test_models_dir)!r}
        for role in ("qg", "tqa"):
            torch_runner(loading.load_seq2seq(d + "/" + role, role=role, dtype=torch.bfloat16)[0])
        torch_runner(loading.load_visual_t5(d + "/vqa", dtype=torch.bfloat16)[0])
        heavy = ("transformers.modeling_utils", "torch._dynamo", "transformers.models.auto.auto_factory",
                 "transformers.generation.utils")
        print(sorted(m for m in heavy if m in sys.modules))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_settings_defaults_are_t5configs() -> None:
    defaults, ours = T5Config(), T5Settings()
    assert ours.num_decoder_layers is None and defaults.num_decoder_layers == ours.num_layers  # None: as many
    for name in T5Settings.__dataclass_fields__:
        if hasattr(defaults, name) and name not in {"image_prefix_ids", "num_decoder_layers"}:
            assert getattr(ours, name) == getattr(defaults, name), name


def test_settings_of_both_transformers_releases(tmp_path) -> None:
    """transformers 4 wrote ``tie_word_embeddings: false`` for T5 v1.1 (its outputs are not scaled and its
    output projection is its own); transformers 5 writes ``scale_decoder_outputs``."""
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps({"model_type": "t5", "feed_forward_proj": "gated-gelu", "tie_word_embeddings": False})
    )
    v11 = read_settings(config)
    assert not v11.tie_word_embeddings and not v11.scale_decoder_outputs
    assert v11.is_gated_act and v11.dense_act_fn == "gelu_new" and v11.decoder_start_token_id == 0
    config.write_text(
        json.dumps({"model_type": "t5", "tie_word_embeddings": True, "scale_decoder_outputs": False})
    )
    assert not read_settings(config).scale_decoder_outputs
    config.write_text(json.dumps({"model_type": "t5", "image_prefix_ids": [5, 6]}))
    assert read_settings(config).image_prefix_ids == (5, 6) and read_settings(config).scale_decoder_outputs


def test_an_untied_head_is_the_checkpoints_own(test_models_dir) -> None:
    import dataclasses

    from safetensors.torch import load_file

    weights = load_file(test_models_dir / "qg" / "model.safetensors")
    settings = dataclasses.replace(
        read_settings(test_models_dir / "qg" / "config.json"), tie_word_embeddings=False
    )
    _, missing, _ = build_t5(settings, weights, visual=False, device="cpu", dtype=torch.bfloat16)
    if "lm_head.weight" not in weights:
        assert missing == ["lm_head.weight"]
    weights["lm_head.weight"] = torch.randn_like(weights["shared.weight"])
    model, missing, _ = build_t5(settings, weights, visual=False, device="cpu", dtype=torch.bfloat16)
    assert not missing and model.lm_head.weight is not model.shared.weight
    assert torch.equal(model.lm_head.weight, weights["lm_head.weight"].to(torch.bfloat16))
