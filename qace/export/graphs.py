"""Export-friendly T5 forward passes that reuse a loaded model's weights, one ``nn.Module`` per graph.

Why not export the Hugging Face modules directly: their decoder takes a ``Cache`` object and builds
masks through transformers' masking utilities, which change between releases and trace into
data-dependent branches. These wrappers are the same arithmetic (RMS norm, unscaled attention with
relative position buckets, ReLU or gated FF, the fp16 clamps, the ``d_model ** -0.5`` output scale)
written on plain tensors, so every graph has fixed named inputs and outputs and the past key/values
are ordinary tensors. The export validation (``qace.export.validate``) proves they still equal the
PyTorch model.

Graphs (their names, inputs and outputs are the export format, `qace.onnx_format`, which the runtime
``qace.engine.onnx_runner`` reads too):

- ``encoder``: ``input_ids``, ``attention_mask`` (B, S) -> ``encoder_hidden_states`` (B, S, D),
  ``encoder_attention_mask`` (B, S); the Visual-T5 encoder also takes ``features`` (B, 36, 2054) and
  returns the (B, 102) mask of its fixed layout.
- ``decoder_init`` (first step): ``decoder_input_ids`` (B, 1), ``encoder_hidden_states``,
  ``encoder_attention_mask``, ``unanswerable_id`` (1,) -> ``logits`` (B, V) fp32, ``next_token`` (B,)
  (greedy argmax, first maximum on ties), ``answerability`` (B,) fp32 (``1 - softmax(logits)`` at
  ``unanswerable_id``), then per layer ``present.{i}.self_key``, ``present.{i}.self_value``
  (B, H, 1, Dk) and ``present.{i}.cross_key``, ``present.{i}.cross_value`` (B, H, S, Dk): the
  cross-attention K/V are computed once here and fed back unchanged.
- ``decoder`` (with past): ``decoder_input_ids``, ``encoder_attention_mask``, then per layer
  ``past.{i}.self_key``, ``past.{i}.self_value`` (B, H, T, Dk), ``past.{i}.cross_key``,
  ``past.{i}.cross_value`` -> ``logits``, ``next_token``, ``present.{i}.self_key``,
  ``present.{i}.self_value`` (T + 1).
- ``compact`` (built with ``onnx.helper``, no weights): ``index`` (K,) and ``encoder_attention_mask``
  plus every ``past.*`` input of ``decoder`` -> the same tensors with only the rows in ``index``,
  named ``kept.<input>``, so finished rows are dropped where the K/V live.

The decoding loop needs only ``next_token`` (and ``answerability``) on the host; ``logits`` stay
outputs for the export validation, which compares them with PyTorch's.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch import nn

from qace.families.t5.ops import clamp_fp16, rms_norm
from qace.onnx_format import compact_input_names, compact_output_names

OPSET = 17
IR_VERSION = 8
"""The ONNX IR version of the graphs qace builds itself: the lowest that opset 17 needs, so that any
ONNX Runtime that runs opset 17 loads them (a newer onnx package would stamp its own, newer version)."""


def _bucket(relative: torch.Tensor, bidirectional: bool, num_buckets: int, max_distance: int) -> torch.Tensor:
    """T5's relative-position bucket (same ops, in the same order, as transformers)."""
    buckets = torch.zeros_like(relative)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative > 0).to(torch.long) * num_buckets
        relative = torch.abs(relative)
    else:
        relative = -torch.min(relative, torch.zeros_like(relative))
    max_exact = num_buckets // 2
    is_small = relative < max_exact
    large = max_exact + (
        torch.log(relative.float() / max_exact)
        / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).to(torch.long)
    large = torch.min(large, torch.full_like(large, num_buckets - 1))
    return buckets + torch.where(is_small, relative, large)


def _position_bias(
    attn: Any, config: Any, query: torch.Tensor, key: torch.Tensor, decoder: bool
) -> torch.Tensor:
    """(1, H, Q, K) bias for query positions ``query`` and key positions ``key`` (1-D long tensors)."""
    relative = key[None, :] - query[:, None]
    bucket = _bucket(
        relative, not decoder, config.relative_attention_num_buckets, config.relative_attention_max_distance
    )
    return attn.relative_attention_bias(bucket).permute(2, 0, 1).unsqueeze(0)


def _heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    return x.view(x.shape[0], x.shape[1], heads, -1).transpose(1, 2)


def _attend(attn: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Unscaled dot-product attention (T5), softmax in the activation dtype like HF's eager path."""
    scores = torch.matmul(q, k.transpose(2, 3)) + bias
    weights = torch.softmax(scores, dim=-1)
    out = torch.matmul(weights, v).transpose(1, 2)
    return attn.o(out.reshape(out.shape[0], out.shape[1], -1))


def _mask_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, S) 1/0 mask -> (B, 1, 1, S) additive bias (0 or the dtype's minimum), as transformers does."""
    return ((1 - mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min).to(dtype)


def _ff(block: Any, x: torch.Tensor) -> torch.Tensor:
    ff = block.layer[-1]
    return x + ff.DenseReluDense(rms_norm(x, ff.layer_norm, fused=False))


def _encoder_stack(stack: Any, config: Any, embeds: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    heads = config.num_heads
    positions = torch.arange(embeds.shape[1], dtype=torch.long, device=embeds.device)
    first = stack.block[0].layer[0].SelfAttention
    bias = _position_bias(first, config, positions, positions, decoder=False).to(embeds.dtype)
    bias = bias + _mask_bias(mask, embeds.dtype)
    x = embeds
    for block in stack.block:
        layer = block.layer[0]
        attn = layer.SelfAttention
        h = rms_norm(x, layer.layer_norm, fused=False)
        x = clamp_fp16(
            x
            + _attend(
                attn, _heads(attn.q(h), heads), _heads(attn.k(h), heads), _heads(attn.v(h), heads), bias
            )
        )
        x = clamp_fp16(_ff(block, x))
    return rms_norm(x, stack.final_layer_norm, fused=False)


class TextEncoder(nn.Module):
    """T5 encoder on token ids."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        stack = self.model.encoder
        hidden = _encoder_stack(stack, self.model.config, stack.embed_tokens(input_ids), attention_mask)
        return hidden, attention_mask * 1


class VisualEncoder(nn.Module):
    """Visual-T5 encoder: 64 question slots + prefix ids + 36 projected regions (spec section 4)."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model
        self.register_buffer("prefix", torch.tensor(model.prefix_ids, dtype=torch.long), persistent=False)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, features: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        shared = self.model.get_input_embeddings()
        batch = input_ids.shape[0]
        prefix = self.prefix[None, :].expand(batch, -1)  # type: ignore[index]
        img_emb: Any = self.model.encoder.img_emb
        regions = img_emb(features.to(img_emb.weight.dtype)).to(shared.weight.dtype)
        embeds = torch.cat([shared(input_ids), shared(prefix), regions], dim=1)
        ones = torch.ones_like(attention_mask[:, :1]).expand(batch, prefix.shape[1] + features.shape[1])
        mask = torch.cat([attention_mask, ones], dim=1)
        return _encoder_stack(self.model.encoder, self.model.config, embeds, mask), mask


def _decoder_step(
    model: Any,
    token: torch.Tensor,
    enc_bias: torch.Tensor,
    self_kv: list[tuple[torch.Tensor, torch.Tensor]] | None,
    cross_kv: list[tuple[torch.Tensor, torch.Tensor]],
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One greedy step for every row: fp32 logits (B, V) and the new self-attention K/V per layer."""
    config, stack = model.config, model.decoder
    heads = config.num_heads
    x = stack.embed_tokens(token)
    past = 0 if self_kv is None else self_kv[0][0].shape[2]
    keys = torch.arange(past + 1, dtype=torch.long, device=token.device)
    first = stack.block[0].layer[0].SelfAttention
    self_bias = _position_bias(first, config, keys[-1:], keys, decoder=True).to(x.dtype)
    presents: list[torch.Tensor] = []
    for i, block in enumerate(stack.block):
        layer = block.layer[0]
        attn = layer.SelfAttention
        h = rms_norm(x, layer.layer_norm, fused=False)
        k, v = _heads(attn.k(h), heads), _heads(attn.v(h), heads)
        if self_kv is not None:
            k, v = torch.cat([self_kv[i][0], k], dim=2), torch.cat([self_kv[i][1], v], dim=2)
        presents += [k, v]
        x = clamp_fp16(x + _attend(attn, _heads(attn.q(h), heads), k, v, self_bias))
        layer = block.layer[1]
        attn = layer.EncDecAttention
        h = rms_norm(x, layer.layer_norm, fused=False)
        x = clamp_fp16(x + _attend(attn, _heads(attn.q(h), heads), cross_kv[i][0], cross_kv[i][1], enc_bias))
        x = clamp_fp16(_ff(block, x))
    x = rms_norm(x, stack.final_layer_norm, fused=False)
    if getattr(config, "scale_decoder_outputs", config.tie_word_embeddings):
        x = x * (config.d_model**-0.5)
    return model.lm_head(x)[:, 0, :].float(), presents


class DecoderInit(nn.Module):
    """First decoder step: also computes the cross-attention K/V that every later step reuses."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        decoder_input_ids: torch.Tensor,
        encoder_hidden_states: torch.Tensor,
        encoder_attention_mask: torch.Tensor,
        unanswerable_id: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        heads = self.model.config.num_heads
        cross = []
        for block in self.model.decoder.block:
            attn = block.layer[1].EncDecAttention
            cross.append(
                (_heads(attn.k(encoder_hidden_states), heads), _heads(attn.v(encoder_hidden_states), heads))
            )
        enc_bias = _mask_bias(encoder_attention_mask, encoder_hidden_states.dtype)
        logits, presents = _decoder_step(self.model, decoder_input_ids, enc_bias, None, cross)
        unanswerable = torch.index_select(torch.softmax(logits, dim=-1), 1, unanswerable_id)[:, 0]
        out: list[torch.Tensor] = [logits, logits.argmax(dim=-1), 1.0 - unanswerable]
        for i, (k, v) in enumerate(cross):
            out += [presents[2 * i], presents[2 * i + 1], k, v]
        return tuple(out)


class DecoderWithPast(nn.Module):
    """Later decoder steps: one new token per row, self K/V grow by one, cross K/V are inputs only."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, decoder_input_ids: torch.Tensor, encoder_attention_mask: torch.Tensor, *past: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        self_kv = [(past[4 * i], past[4 * i + 1]) for i in range(len(past) // 4)]
        cross_kv = [(past[4 * i + 2], past[4 * i + 3]) for i in range(len(past) // 4)]
        enc_bias = _mask_bias(encoder_attention_mask, past[0].dtype)
        logits, presents = _decoder_step(self.model, decoder_input_ids, enc_bias, self_kv, cross_kv)
        return (logits, logits.argmax(dim=-1), *presents)


def write_compact_graph(path: Path, layers: int, float_type: int) -> None:
    """Write the ``compact`` graph: one ``Gather`` on axis 0 per tensor that lives across steps.

    ``float_type`` is the ONNX element type of the K/V (``onnx.TensorProto.FLOAT`` or ``FLOAT16``).
    """
    import onnx
    from onnx import TensorProto, helper

    index, mask, *kv = compact_input_names(layers)
    names, kept = [mask, *kv], compact_output_names(layers)
    inputs = [helper.make_tensor_value_info(index, TensorProto.INT64, ["kept"])]
    inputs.append(helper.make_tensor_value_info(mask, TensorProto.INT64, ["batch", "encoder_length"]))
    inputs += [
        helper.make_tensor_value_info(n, float_type, ["batch", "heads", f"len_{n}", "d_kv"]) for n in kv
    ]
    outputs = [
        helper.make_tensor_value_info(k, i.type.tensor_type.elem_type, None)
        for k, i in zip(kept, inputs[1:], strict=True)
    ]
    nodes = [helper.make_node("Gather", [n, index], [k], axis=0) for n, k in zip(names, kept, strict=True)]
    graph = helper.make_graph(nodes, "compact", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=IR_VERSION)
    onnx.save(model, str(path))
