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
  named ``kept.<input>``, so finished rows are dropped where the K/V live;
- ``decoder_static`` and ``static_init``: the step over a static cache, for CUDA graphs
  (`qace.export.static_graphs`, built on `decoder_step` here).

The decoding loop needs only ``next_token`` (and ``answerability``) on the host; ``logits`` stay
outputs for the export validation, which compares them with PyTorch's.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from qace.families.t5.ops import rms_norm
from qace.models.t5_modules import relative_bucket
from qace.onnx_format import compact_input_names, compact_output_names

OPSET = 17
IR_VERSION = 8
"""The ONNX IR version of the graphs qace builds itself: the lowest that opset 17 needs, so that any
ONNX Runtime that runs opset 17 loads them (a newer onnx package would stamp its own, newer version)."""


def position_bias(
    attn: Any, config: Any, query: torch.Tensor, key: torch.Tensor, decoder: bool
) -> torch.Tensor:
    """(1, H, Q, K) bias for query positions ``query`` and key positions ``key`` (1-D long tensors)."""
    relative = key[None, :] - query[:, None]
    bucket = relative_bucket(
        relative, not decoder, config.relative_attention_num_buckets, config.relative_attention_max_distance
    )
    return attn.relative_attention_bias(bucket).permute(2, 0, 1).unsqueeze(0)


def _heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    return x.view(x.shape[0], x.shape[1], heads, -1).transpose(1, 2)


def _one_position_heads(x: torch.Tensor, config: Any) -> torch.Tensor:
    """(B, 1, H * Dk) -> (B, H, 1, Dk), reshaped by constants only (`_heads` reads the shape in the graph)."""
    return x.reshape(-1, 1, config.num_heads, config.d_kv).transpose(1, 2)


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """Unscaled dot-product attention (T5), softmax in the activation dtype like HF's eager path:
    ``(B, Q, H, Dk)``, heads not merged yet."""
    scores = torch.matmul(q, k.transpose(2, 3)) + bias
    weights = torch.softmax(scores, dim=-1)
    return torch.matmul(weights, v).transpose(1, 2)


def _clamp(h: torch.Tensor) -> torch.Tensor:
    """T5's fp16 overflow guard (`qace.families.t5.ops.clamp_fp16`'s formula; a no-op in other dtypes),
    clamped with Max and Min instead of Clip: ONNX Runtime's CUDA Clip reads its bounds on the host, so a
    Clip bounded by this computed limit copied it to the host at every residual (a synchronisation, and
    a copy node that rules out CUDA graphs). "Any infinity" is the maximum of a 0/1 half-precision map
    (Equal, Cast, ReduceMax): ``isinf(h).any()`` exported as casts to double and an int64 ReduceSum,
    which ONNX Runtime's CUDA provider runs in a generic kernel that took 92% of a T5-base batch's GPU
    time (docs/onnx.md)."""
    if h.dtype != torch.float16:
        return h
    top = torch.finfo(h.dtype).max
    overflowed = (h.abs() == float("inf")).to(h.dtype).amax() > 0
    limit = torch.where(overflowed, top - 1000, top)
    return torch.minimum(torch.maximum(h, -limit), limit)


def mask_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, S) 1/0 mask -> (B, 1, 1, S) additive bias (0 or the dtype's minimum), as transformers does."""
    return ((1 - mask[:, None, None, :].to(dtype)) * torch.finfo(dtype).min).to(dtype)


def _ff(block: Any, x: torch.Tensor) -> torch.Tensor:
    ff = block.layer[-1]
    return x + ff.DenseReluDense(rms_norm(x, ff.layer_norm, fused=False))


def _encoder_stack(stack: Any, config: Any, embeds: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    heads = config.num_heads
    positions = torch.arange(embeds.shape[1], dtype=torch.long, device=embeds.device)
    first = stack.block[0].layer[0].SelfAttention
    bias = position_bias(first, config, positions, positions, decoder=False).to(embeds.dtype)
    bias = bias + mask_bias(mask, embeds.dtype)
    x = embeds
    for block in stack.block:
        layer = block.layer[0]
        attn = layer.SelfAttention
        h = rms_norm(x, layer.layer_norm, fused=False)
        out = _attention(_heads(attn.q(h), heads), _heads(attn.k(h), heads), _heads(attn.v(h), heads), bias)
        x = _clamp(x + attn.o(out.reshape(out.shape[0], out.shape[1], -1)))
        x = _clamp(_ff(block, x))
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


SelfCache = Callable[[int, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
"""How a decoder step keeps its self-attention keys and values: layer ``i``'s new key and value
``(B, H, 1, Dk)`` -> the keys and values the step's query attends to, which the step also returns for
that layer (appended to the past, written into a static cache, or alone at the first step)."""


def decoder_step(
    model: Any,
    token: torch.Tensor,
    self_bias: torch.Tensor,
    enc_bias: torch.Tensor,
    cross_kv: list[tuple[torch.Tensor, torch.Tensor]],
    self_cache: SelfCache,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One greedy step for every row (one query position): fp32 logits (B, V) and, per layer, the
    self-attention keys and values ``self_cache`` gave. ``self_bias`` is the position bias (future
    masked) over those keys; ``enc_bias`` the encoder padding's. Reshapes use constants only."""
    config, stack = model.config, model.decoder
    width = config.num_heads * config.d_kv
    x = stack.embed_tokens(token)
    presents: list[torch.Tensor] = []
    for i, block in enumerate(stack.block):
        layer = block.layer[0]
        attn = layer.SelfAttention
        h = rms_norm(x, layer.layer_norm, fused=False)
        k, v = self_cache(i, _one_position_heads(attn.k(h), config), _one_position_heads(attn.v(h), config))
        presents += [k, v]
        out = _attention(_one_position_heads(attn.q(h), config), k, v, self_bias)
        x = _clamp(x + attn.o(out.reshape(-1, 1, width)))
        layer = block.layer[1]
        attn = layer.EncDecAttention
        h = rms_norm(x, layer.layer_norm, fused=False)
        out = _attention(_one_position_heads(attn.q(h), config), cross_kv[i][0], cross_kv[i][1], enc_bias)
        x = _clamp(x + attn.o(out.reshape(-1, 1, width)))
        x = _clamp(_ff(block, x))
    x = rms_norm(x, stack.final_layer_norm, fused=False)
    if getattr(config, "scale_decoder_outputs", config.tie_word_embeddings):
        x = x * (config.d_model**-0.5)
    return model.lm_head(x)[:, 0, :].float(), presents


def _causal_bias(model: Any, past: Any) -> torch.Tensor:
    """``(1, H, 1, past + 1)`` position bias of a query at position ``past`` over the keys up to it."""
    keys = torch.arange(past + 1, dtype=torch.long)
    first = model.decoder.block[0].layer[0].SelfAttention
    bias = position_bias(first, model.config, keys[-1:], keys, decoder=True)
    return bias.to(model.decoder.embed_tokens.weight.dtype)


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
        enc_bias = mask_bias(encoder_attention_mask, encoder_hidden_states.dtype)
        self_bias = _causal_bias(self.model, 0)
        logits, presents = decoder_step(
            self.model, decoder_input_ids, self_bias, enc_bias, cross, lambda i, k, v: (k, v)
        )
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
        cross_kv = [(past[4 * i + 2], past[4 * i + 3]) for i in range(len(past) // 4)]

        def grow(i: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return torch.cat([past[4 * i], k], dim=2), torch.cat([past[4 * i + 1], v], dim=2)

        enc_bias = mask_bias(encoder_attention_mask, past[0].dtype)
        self_bias = _causal_bias(self.model, past[0].shape[2])
        logits, presents = decoder_step(self.model, decoder_input_ids, self_bias, enc_bias, cross_kv, grow)
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
