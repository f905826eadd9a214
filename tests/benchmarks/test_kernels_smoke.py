"""``benchmarks/kernels.py``: ``--tiny`` profiles both stages of every role on the CPU into tables that add
up, the work it gives kernels is the models' arithmetic (the encoder's products, the decoder's eager twin
of its CUDA graphs), and its pieces (operator work, graph keys, twin matching, bounds, names) hold their
contracts. Timings are not checked."""

from __future__ import annotations

import ast
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from benchmarks import kernels
from benchmarks.kernels import GraphKey, Kernel, Peaks
from tests.helpers import SHARED_DATA

TOP = 5


@pytest.fixture(scope="module")
def report(tiny_models: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if not (SHARED_DATA / "pascal50s").is_dir():
        pytest.skip("PASCAL-50S not in the shared data")
    out = tmp_path_factory.mktemp("kernels") / "kernels.json"
    argv = ["--tiny", "--out", str(out), "--models-dir", str(tiny_models), "--captions", "4"]
    assert kernels.main([*argv, "--chunk-size", "4", "--top", str(TOP)]) == 0
    return json.loads(out.read_text())


def test_every_stage_has_a_table_that_adds_up(report: dict[str, Any]) -> None:
    assert report["command"].startswith("python -m benchmarks.kernels --tiny")
    assert report["workload"]["captions"] == report["workload"]["distinct_captions"] == 4
    assert report["peak"] == {"flops": None, "hbm_bytes_per_s": None}  # no roofs on the CPU
    assert set(report["roles"]) == {"qg", "tqa", "vqa"}
    for entry in report["roles"].values():
        assert entry["rows"] >= entry["batches"] >= 1 and entry["encoder_tokens_padded"] >= entry["rows"]
        assert entry["graph_kernels_reported"] is None and entry["decoder"]["cuda_graphs"] is False
        for stage in ("encoder", "decoder"):
            table = entry[stage]
            top, other = table["top"], table["other"]
            assert table["kernels"] > 0 and table["kernel_ms"] > 0 and table["wall_ms"] > 0
            assert len(top) == min(TOP, table["distinct_kernels"])
            assert other["kernels"] == table["distinct_kernels"] - len(top)
            assert sum(r["share"] for r in top) + other["share"] == pytest.approx(1.0)
            assert sum(r["calls"] for r in top) + other["calls"] == table["kernels"]
            assert sum(r["total_ms"] for r in top) + other["total_ms"] == pytest.approx(table["kernel_ms"])
            assert [r["total_ms"] for r in top] == sorted((r["total_ms"] for r in top), reverse=True)
            assert all(r["calls"] > 0 and r["bound"] in {"compute", "memory", "launch"} for r in top)
            assert table["bound"] in {"compute", "memory", "launch"}
            assert 0 < table["work_known_share"] <= 1 and table["flops"] > 0


def test_encoder_flops_are_the_models_products(report: dict[str, Any], tiny_models: Path) -> None:
    """Every linear layer over every padded position, plus attention (at most half as much again)."""
    for role in ("qg", "tqa"):
        config = json.loads((tiny_models / role / "config.json").read_text())
        inner = config["num_heads"] * config["d_kv"]
        per_token = config["num_layers"] * (
            4 * config["d_model"] * inner + 2 * config["d_model"] * config["d_ff"]
        )
        entry = report["roles"][role]
        linear = 2 * per_token * entry["encoder_tokens_padded"]
        assert linear < entry["encoder"]["flops"] <= 1.5 * linear


def test_the_twin_does_the_graphs_arithmetic(tiny_models: Path) -> None:
    """The eager twin of the captured steps counts exactly the step's products: its linear layers (not
    the cross-attention keys and values, computed once a batch) and both attentions at the graph's window
    and bucket length."""
    import torch
    from transformers import T5ForConditionalGeneration

    from qace.families import torch_runner

    model = T5ForConditionalGeneration.from_pretrained(tiny_models / "qg").eval()
    decoder = torch_runner(model).decoder
    replays = Counter({GraphKey(8, 16, 31, 8, False): 2, GraphKey(8, 16, 31, 16, True): 1})
    twin = kernels.twin_kernels(decoder, replays, torch.empty(0), 5, on_gpu=False)
    c = model.config
    inner = c.num_heads * c.d_kv
    per_row = c.num_layers * (4 * inner * c.d_model + 2 * inner * c.d_model + 2 * c.d_model * c.d_ff)
    linear = 2 * 8 * (per_row + c.d_model * c.vocab_size) * 3
    attention = sum(4 * 8 * inner * (window + 16) * c.num_layers * n for window, n in ((8, 2), (16, 1)))
    assert sum(k.flops for k in twin if k.flops) == linear + attention
    assert {k.op for k in twin if k.flops} == {"aten::mm", "aten::bmm"}


def test_operator_work() -> None:
    bf16, f32 = "c10::BFloat16", "float"
    assert kernels.op_work("aten::mm", [[64, 32], [32, 16]], [bf16, bf16]) == (
        2 * 64 * 32 * 16, 2 * (64 * 32 + 32 * 16 + 64 * 16)
    )  # fmt: skip
    flops, nbytes = kernels.op_work(
        "aten::addmm_", [[64, 16], [64, 32], [32, 16], [], []], [f32] * 3 + ["Scalar"] * 2
    )
    assert (flops, nbytes) == (2 * 64 * 32 * 16, 4 * (2 * 64 * 16 + 64 * 32 + 32 * 16))
    assert (
        kernels.op_work("aten::_addmm_activation", [[16], [64, 32], [32, 16]], [f32] * 3)[0]
        == 2 * 64 * 32 * 16
    )
    q, k = [2, 10, 4, 8], [2, 12, 4, 8]  # (batch, positions, heads, head size)
    flops, _ = kernels.op_work("aten::_efficient_attention_forward", [q, k, k], [bf16] * 3)
    assert flops == 4 * 2 * 10 * 4 * 8 * 12
    assert kernels.op_work("aten::fill_", [[10, 10], []], [bf16, "Scalar"]) == (None, 200)
    assert kernels.op_work("aten::copy_", [[10], [10], []], [bf16, f32, "Scalar"]) == (None, 20 + 40)
    assert kernels.op_work("aten::add_", [[10], [10], []], [f32, f32, "Scalar"]) == (None, 120)
    assert kernels.op_work("aten::mul", [[10, 4], [10, 1]], [f32, f32]) == (None, 160 + 40 + 160)
    assert kernels.op_work("aten::index_select", [[100, 8], [], [4]], [f32, "Scalar", "long int"]) == (
        None,
        None,
    )
    assert kernels.op_work("aten::mm", [[], []], ["", ""]) == (None, None)  # shapes not recorded


def test_replay_keys_follow_the_graphs_loop() -> None:
    """A 100-row batch of 40 positions: bucket 128 x 48; windows 8, 16, 31; a QA model's step 0 apart."""
    keys = kernels.replay_keys(100, 40, 31, 20, first=True)
    assert {(k.rows, k.length, k.steps) for k in keys} == {(128, 48, 31)}
    assert [k.window for k in keys] == [8] * 8 + [16] * 8 + [31] * 4
    assert [k.first for k in keys] == [True] + [False] * 19
    assert not any(k.first for k in kernels.replay_keys(100, 40, 31, 3, first=False))


def test_replayed_kernels_take_the_twins_work_only_where_it_launched_them_as_often() -> None:
    graph = [
        Kernel("gemm", 10), Kernel("gemm", 10), Kernel("pick", 1), Kernel("pick", 1), Kernel("triton", 5),
        Kernel("fill", 2, "aten::fill_", None, 8.0),
    ]  # fmt: skip
    twin = [
        Kernel("gemm", 9, "aten::mm", 100.0, 40.0), Kernel("gemm", 9, "aten::mm", 300.0, 60.0),
        Kernel("pick", 1, "aten::index_select"), Kernel("triton", 5),
    ]  # fmt: skip
    out = kernels.with_twin_work(graph, twin)
    assert out[:2] == [Kernel("gemm", 10, "aten::mm", 200.0, 50.0)] * 2  # the twin's work per call
    assert out[2:5] == graph[2:5]  # launched once for two replays; launched outside any operator
    assert out[5] is graph[5]  # an eager kernel keeps its own operator's work


def test_bounds() -> None:
    peaks = Peaks(flops=1000.0, bytes=100.0)
    assert kernels.bound_of("gemm", 2.0, 900.0, 1.0, peaks) == ("launch", 0.9)
    assert kernels.bound_of("gemm", 50.0, 600.0, 30.0, peaks) == ("compute", 0.6)
    assert kernels.bound_of("gemm", 50.0, 100.0, 30.0, peaks) == ("memory", 0.3)
    assert kernels.bound_of("other", 50.0, None, 80.0, peaks) == ("memory", 0.8)
    assert kernels.bound_of("gemm", 50.0, None, None, peaks) == ("compute", None)  # by kind
    assert kernels.bound_of("attention", 50.0, 5.0, 5.0, Peaks(None, None)) == ("memory", None)


def test_short_names() -> None:
    fill = (
        "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<long>, "
        "std::array<char*, 1ul> >(int, at::native::FillFunctor<long>, std::array<char*, 1ul>)"
    )
    assert kernels.short_name(fill, {}) == "vectorized_elementwise_kernel<FillFunctor>"
    norm = "void (anonymous namespace)::rms_norm_kernel<c10::BFloat16>(int, float const*)"
    assert kernels.short_name(norm, {}) == "rms_norm_kernel"
    assert (
        kernels.short_name("nvjet_tst_192x192_64x4_1x2_h_bz_coopB_NTN", {})
        == "nvjet_tst_192x192_64x4_1x2_h_bz_coopB_NTN"
    )
    assert (
        kernels.short_name("_kernel", {"_kernel": "decode_attention._kernel"}) == "decode_attention._kernel"
    )
    assert kernels.kind_of(None, "decode_attention._kernel") == "attention"
    assert (
        kernels.kind_of("aten::addmm_", "nvjet_tst") == kernels.kind_of(None, "sm90_xmma_gemm_bf16") == "gemm"
    )


def test_triton_modules_name_every_kernel_once() -> None:
    """The profiler shows a Triton kernel by its function's name alone: every qace module with a
    ``@triton.jit`` function is in `kernels.TRITON_MODULES`, and no two such functions share a name."""
    root = Path(kernels.__file__).resolve().parent.parent
    found: dict[str, list[str]] = {}
    for path in sorted((root / "qace").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and any(
                ast.unparse(d).startswith("triton.jit") for d in node.decorator_list
            ):
                module = ".".join(path.relative_to(root).with_suffix("").parts)
                found.setdefault(module, []).append(node.name)
    assert set(found) == set(kernels.TRITON_MODULES)
    names = Counter(name for functions in found.values() for name in functions)
    assert [name for name, count in names.items() if count > 1] == []
