"""`benchmarks.gemm_floor`: its products are the models' own (a CPU check against the throughput
benchmark's FLOP count), and on a GPU every product is timed against its references."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import T5Config, T5ForConditionalGeneration

from benchmarks import gemm_floor
from benchmarks.throughput import _linear_params


@pytest.mark.parametrize("model", list(gemm_floor.MODELS))
def test_the_products_are_every_linear_layer_the_flop_count_charges(model: str) -> None:
    """A decoding step's products are the decoder's linear layers less the cross keys and values (run
    once a batch) plus the LM head, and an encoder layer's are the encoder's: as `_model_flops` counts."""
    d, ff, layers = gemm_floor.MODELS[model]
    config = T5Config(
        d_model=d, d_ff=ff, num_layers=layers, num_heads=d // 64, d_kv=64, vocab_size=gemm_floor.VOCAB
    )
    with torch.device("meta"):
        t5 = T5ForConditionalGeneration(config)
    cross_kv = sum(
        b.layer[1].EncDecAttention.k.weight.numel() + b.layer[1].EncDecAttention.v.weight.numel()
        for b in t5.decoder.block
    )
    step = _linear_params(t5.decoder) - cross_kv + t5.lm_head.weight.numel()
    decoder = gemm_floor.products(model, encoder=False)
    assert sum(n * k * (1 if name == "lm_head" else layers) for name, n, k in decoder) == step
    encoder = gemm_floor.products(model, encoder=True)
    assert layers * sum(n * k for _, n, k in encoder) == _linear_params(t5.encoder)


def test_every_tile_fits_shared_memory() -> None:
    assert gemm_floor.TILE_GRID and all(
        (bm + bn) * bk * 2 * stages <= 200 * 1024 for bm, bn, bk, stages, _ in gemm_floor.TILE_GRID
    )


@pytest.mark.gpu
def test_gemm_floor_smoke(tmp_path: Path) -> None:
    out = tmp_path / "gemm_floor.json"
    argv = ["--models", "t5-small", "--decoder-rows", "64", "--encoder-rows", "512", "--tiles", "3"]
    assert gemm_floor.main([*argv, "--calls", "2", "--replays", "2", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["commit"] and result["gpu"] and result["bounds"]["read_gbps"] > 0
    step = result["t5-small"]["decoder"][0]
    assert set(step["products"]) == {name for name, _, _ in gemm_floor.products("t5-small", encoder=False)}
    for name, entry in step["products"].items():
        assert entry["cublas_us"] > 0 and entry["roofline_us"] > 0
        assert ("triton_best_us" in entry) == (name != "lm_head")
    whole = step["whole"]
    assert whole["best_us"] <= whole["cublas_us"] and whole["kernels"] == 6 * 6 + 1
    assert result["t5-small"]["encoder"][0]["whole"]["kernels"] == 6 * 4
