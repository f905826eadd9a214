"""The engine's T5 encoder: Hugging Face's stack in fp32, a fused forward of its weights in half precision.

In half precision, most of Hugging Face's encoder time is not its matrix products but the fp32 copies of
every layer norm, an fp32 attention through the math path, and mask bookkeeping. The fused forward keeps
the weights and the arithmetic of T5 and changes only how it is run:

- on CUDA the attention is one Triton kernel a layer (`qace.families.t5.encoder_attention`) that reads
  q, k and v where their product wrote them, looks the relative position bias up per score and writes
  the heads where the output projection reads them; elsewhere the bias and the padding mask are added
  once per batch, in the model's dtype, and handed, contiguous, to PyTorch's attention (scale 1, as T5
  does not scale; a strided mask had sent ``scaled_dot_product_attention`` to its fp32 math path);
- q, k and v come from one matrix product; residual additions and the feed-forward ReLU happen in the
  matrix products' epilogues (`qace.families.t5.ops.add_linear_`, `FeedForward`);
- layer norms are one fused kernel (`qace.families.t5.ops.rms_norm`);
- masked positions inside rows (Visual-T5's empty question slots, about half its 102 positions) are
  packed away before the first layer (`T5Encoder.__call__`);
- on a GPU the products run on the batch's tokens padded with zero rows to one of a few counts
  (`qace.engine.gemm_rows`), so cuBLAS does not choose a kernel anew for nearly every call.

fp32 keeps Hugging Face's forward, so fp32 scores stay equal to the reference implementation's; half
precision agrees within the tolerance measured by ``benchmarks/throughput.py``.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from qace.engine.gemm_rows import padded_rows, row_counts
from qace.families.t5.encoder_attention import attend_packed, fused_available, relative_bias_table
from qace.families.t5.ops import HALF, FeedForward, add_linear_, clamp_fp16, fused_qkv, rms_norm


class T5Encoder:
    """``encoder(mask, input_ids=... | inputs_embeds=...)`` -> ``(hidden states, their mask)``."""

    def __init__(self, model: Any, *, fused: bool | None = None, few_shapes: bool | None = None) -> None:
        self.stack = model.get_encoder()
        weight = self.stack.embed_tokens.weight
        self.fused = weight.dtype in HALF if fused is None else fused
        """Run the fused forward (default: in half precision only); ``fused=True`` on an fp32 model is
        for tests, which compare it with Hugging Face's forward."""
        self.few_shapes = weight.is_cuda if few_shapes is None else few_shapes
        """The fused forward's products run on rows padded to `padded_rows` (default: on a GPU, where
        cuBLAS's choice of kernel per new shape costs host time; tests set it on the CPU)."""
        blocks = self.stack.block
        self.qkv = [fused_qkv(b.layer[0].SelfAttention) for b in blocks] if self.fused else []
        self.ff = (
            [FeedForward(b.layer[-1].DenseReluDense, b.layer[-1].layer_norm, eager=True) for b in blocks]
            if self.fused
            else []
        )
        self.bias_module = blocks[0].layer[0].SelfAttention
        self.heads = self.bias_module.n_heads
        self.d_kv = self.bias_module.key_value_proj_dim

    @torch.inference_mode()
    def __call__(
        self,
        attention_mask: torch.Tensor,
        *,
        input_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        kept: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Hidden states and the mask the decoder's cross-attention needs with them.

        The fused forward drops masked positions when every row has some (Visual-T5's 64 question slots
        hold a dozen tokens): each row's kept positions move to the front, in order, and keep their
        relative position biases, so the kept outputs are the same and the encoder and every decoding
        step's cross-attention run on about half the positions. T5's cross-attention has no position
        bias, so the decoder takes the packed states as they are. ``kept``, the most unmasked positions
        of any row, sizes the packed batch when the caller knows it on the host (no wait for the device).
        """
        if not self.fused:
            out = self.stack(input_ids=input_ids, inputs_embeds=inputs_embeds, attention_mask=attention_mask)
            return out.last_hidden_state, attention_mask
        h = self.stack.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds
        positions, mask = _packed_positions(attention_mask, kept)
        if positions is not None:
            h = h.gather(1, positions[..., None].expand(-1, -1, h.shape[-1]))
        batch, length, width = h.shape
        tokens = batch * length
        # The layers run on `flat`, the batch's tokens as rows, which they add into in place; with
        # `few_shapes` zero rows follow, up to a count whose products cuBLAS has likely met before
        # (`padded_rows`). Only the attention reads the batch's shape, through views of the first rows.
        rows = padded_rows(tokens) if self.few_shapes else tokens
        flat = h.new_empty(rows, width)
        flat[:tokens].copy_(h.reshape(tokens, width))
        flat[tokens:].zero_()
        attended = flat.new_zeros(rows, self.heads * self.d_kv)
        kernel = fused_available(flat, self.d_kv)
        if kernel:
            table = relative_bias_table(self.bias_module, attention_mask.shape[1], flat.device)
        else:
            bias = self._bias(attention_mask.shape[1], positions, mask, h.dtype)
            heads = attended[:tokens].view(batch, length, self.heads, self.d_kv)
        for block, qkv, ff in zip(self.stack.block, self.qkv, self.ff, strict=True):
            attention, norm = block.layer[0].SelfAttention, block.layer[0].layer_norm
            x = rms_norm(flat, norm, fused=True, eager=True)
            if kernel:
                attend_packed(F.linear(x, qkv), attended, table, mask, positions, self.heads, self.d_kv)
            else:
                split = F.linear(x, qkv)[:tokens].view(batch, length, 3, self.heads, self.d_kv)
                q, k, v = split.permute(2, 0, 3, 1, 4)
                heads.copy_(_attention(q, k, v, bias).transpose(1, 2))
            flat = clamp_fp16(add_linear_(flat, attended, attention.o.weight))
            flat = clamp_fp16(ff.add_(flat))
        out = rms_norm(flat[:tokens], self.stack.final_layer_norm, fused=True, eager=True)
        return out.view(batch, length, width), mask

    @torch.inference_mode()
    def warm_up(self, max_tokens: int) -> int:
        """Run a layer's products once on zeros at every row count the fused forward pads batches of up
        to ``max_tokens`` tokens to (`qace.engine.gemm_rows.row_counts`), so that cuBLAS has chosen a
        kernel for each shape before a call meets it; returns how many row counts ran (0 where batches
        are not padded: fp32, or ``few_shapes`` off). Every layer's products have the first layer's
        shapes. The outputs are thrown away; the weights are only read."""
        if not (self.fused and self.few_shapes):
            return 0
        qkv, ff = self.qkv[0], self.ff[0]
        out = self.stack.block[0].layer[0].SelfAttention.o.weight
        counts = row_counts(max_tokens)
        flat = qkv.new_zeros(counts[-1], qkv.shape[1])
        attended = qkv.new_zeros(counts[-1], out.shape[1])
        for rows in counts:
            F.linear(flat[:rows], qkv)
            add_linear_(flat[:rows], attended[:rows], out)
            ff.add_(flat[:rows])
        return len(counts)

    def _bias(
        self, length: int, positions: torch.Tensor | None, mask: torch.Tensor, dtype: torch.dtype
    ) -> torch.Tensor:
        """``(B, heads, L, L)``: relative position bias (of the original positions of packed rows) plus
        ``min`` on padded keys, in ``dtype``."""
        bias = self.bias_module.compute_bias(length, length, device=mask.device).float()
        if positions is not None:  # (1, H, L, L) -> (B, H, W, W), picked at each row's positions
            bias = bias[0][:, positions[:, :, None], positions[:, None, :]].transpose(0, 1)
        padding = torch.where(mask[:, None, None, :].bool(), 0.0, torch.finfo(dtype).min)
        # the memory-efficient kernel needs the last stride 1 (compute_bias returns a permuted view) and
        # rows that start 16-aligned: lay the bias out contiguously with rows padded to a multiple of 16
        bias = (bias + padding).to(dtype).contiguous()
        keys = bias.shape[-1]
        return F.pad(bias, (0, -keys % 16))[..., :keys]


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """T5 self-attention (scale 1, additive bias). On CUDA, PyTorch's memory-efficient kernel is called
    directly: it is faster than the kernel SDPA picks for these shapes, and the direct call skips SDPA's
    host-side dispatch."""
    if q.is_cuda:
        return torch.ops.aten._scaled_dot_product_efficient_attention(q, k, v, bias, False, scale=1.0)[0]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=1.0)


def _packed_positions(mask: torch.Tensor, kept: int | None) -> tuple[torch.Tensor | None, torch.Tensor]:
    """Each row's unmasked positions first, in order, cut to the longest row (rounded up to 8): the
    gather index ``(B, W)`` and its mask; ``None`` and the mask itself when that saves no column.
    ``kept``: the longest row's unmasked positions, known on the host; None reads it from the device."""
    keep = mask.bool()
    width = int(keep.sum(dim=1).max()) if kept is None else kept
    width = min(mask.shape[1], -(-max(width, 1) // 8) * 8)
    if width == mask.shape[1]:
        return None, mask
    positions = torch.argsort((~keep).to(torch.int8), dim=1, stable=True)[:, :width]
    return positions, mask.gather(1, positions)
