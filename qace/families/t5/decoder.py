"""Greedy T5 decoding with static caches: the T5 family's decoder, eager or replayed as CUDA graphs.

Hugging Face's per-step forward rebuilds masks and position biases, grows its caches by concatenation and
recomputes nothing it could keep. Here, per batch:

- cross-attention keys/values of every layer are computed once from the encoder output;
- self-attention keys/values go into a cache preallocated for the longest possible answer; every step
  attends over the whole cache, with the future masked, so a step has the same shapes at every position;
- the decoder's relative position bias (future masked) is computed once for all steps, and a step picks
  its row with the position held in a tensor;
- the loop stops when every row has ended; on the CPU, rows that have ended are dropped once they are half
  the batch (CTranslate2's trick): the engine's greedy loop (`qace.engine.greedy`);
- on CUDA, because a step's shapes never change, the step is captured once per batch shape as a CUDA
  graph (`qace.families.t5.decode_graphs`) and replayed: one launch instead of hundreds of kernels a step;
- answerability is read from the first step's logits of the same pass.

It reads the weights of a loaded T5 or Visual-T5 (transformers' classes or `qace.models.t5_modules`), so
it works for any T5 checkpoint, ReLU or gated-GELU, in fp32 (identical tokens to ``generate``), bf16 or
fp16.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from qace.engine.gemm_rows import padded_rows, row_counts
from qace.engine.greedy import TorchArrays, greedy_decode
from qace.families.t5.decode_attention import attend, attend_step
from qace.families.t5.decode_graphs import GraphedDecoding
from qace.families.t5.ops import HALF, FeedForward, add_linear_, clamp_fp16, fused_qkv, rms_norm


@dataclass
class _Layer:
    self_attn: Any
    self_norm: Any
    cross_attn: Any
    cross_norm: Any
    ff: Any
    ff_norm: Any


class StaticT5Decoder:
    """Decoder-side greedy generation for one T5 model (see module docstring)."""

    def __init__(self, model: Any, *, cuda_graphs: bool = True) -> None:
        decoder = model.get_decoder() if hasattr(model, "get_decoder") else model.decoder
        self.model = model
        self.embed = decoder.embed_tokens
        self.layers = [
            _Layer(
                b.layer[0].SelfAttention,
                b.layer[0].layer_norm,
                b.layer[1].EncDecAttention,
                b.layer[1].layer_norm,
                b.layer[2].DenseReluDense,
                b.layer[2].layer_norm,
            )
            for b in decoder.block
        ]
        self.qkv = [fused_qkv(lay.self_attn) for lay in self.layers]
        self.fused_norm = self.embed.weight.dtype in HALF
        """Half precision: fused layer norms (`qace.families.t5.ops.rms_norm`) and residual additions in the
        products' epilogues (`add_linear_`, `FeedForward`); fp32: Hugging Face's operations."""
        self.ff = [FeedForward(lay.ff, lay.ff_norm) for lay in self.layers] if self.fused_norm else []
        self.cross_weight = (
            torch.cat(
                [lay.cross_attn.k.weight for lay in self.layers]
                + [lay.cross_attn.v.weight for lay in self.layers]
            )
            if self.fused_norm
            else None
        )
        """Half precision: all layers' cross-attention key and value weights stacked (`cross_cache`)."""
        self.final_norm = decoder.final_layer_norm
        head = model.lm_head.weight
        self.head_out_fp32 = head.is_cuda and head.dtype in HALF
        self.lm_head = head if self.head_out_fp32 else head.float()
        """The output projection gives fp32 logits whatever the model's precision: greedy choices between
        near-tied tokens are where half-precision answers drift from fp32. On CUDA a half model keeps its
        half weight and multiplies on tensor cores straight into fp32 (the half operands are exact in
        fp32, so only the summation order differs from an fp32 product); the fp32 product runs on CUDA
        cores, slower."""
        self.bias_module = decoder.block[0].layer[0].SelfAttention
        config = model.config
        self.heads, self.d_kv = config.num_heads, config.d_kv
        scale = getattr(config, "scale_decoder_outputs", None)
        self.output_scale = (
            config.d_model**-0.5 if (config.tie_word_embeddings if scale is None else scale) else None
        )
        self.start_id = int(config.decoder_start_token_id)
        self.eos_id = int(config.eos_token_id)
        self._bias_cache: dict[tuple[int, torch.device, torch.dtype], torch.Tensor] = {}
        self.row_steps = 0
        """Decoder positions computed so far (rows x steps), for FLOP accounting in benchmarks."""
        self.cuda_graphs = cuda_graphs
        self._graphs: GraphedDecoding | None = None

    def _residual(self, h: torch.Tensor, x: torch.Tensor, out: Any) -> torch.Tensor:
        """``h + out(x)``: in half precision added in the product's epilogue (`add_linear_`), in fp32
        Hugging Face's two operations."""
        if self.fused_norm:
            return clamp_fp16(add_linear_(h, x, out.weight))
        return h + out(x)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        """(B, L, n*H*D) -> (B, n*H, L, D)."""
        return x.view(x.shape[0], x.shape[1], -1, self.d_kv).transpose(1, 2)

    def self_bias(self, steps: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """``(1, heads, steps, steps)`` position bias; row ``t`` is for step ``t``, later positions masked."""
        key = (steps, device, dtype)
        if key not in self._bias_cache:
            bias = self.bias_module.compute_bias(steps, steps, device=device).float()
            future = torch.ones(steps, steps, dtype=torch.bool, device=device).triu(1)
            self._bias_cache[key] = bias.masked_fill(future, torch.finfo(dtype).min).to(dtype)
        return self._bias_cache[key]

    def cross_cache(
        self, hidden: torch.Tensor, out: torch.Tensor | None = None
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Every layer's cross-attention keys and values, ``(B, heads, S, d_kv)`` views of one
        ``(B, S, 2 * layers * heads * d_kv)`` buffer: the first ``B`` rows of ``out`` when given (graph
        decoding passes its static storage, of a bucket's rows), else a new one.

        In half precision all layers' keys and values are one matrix product with the weights stacked,
        written straight into the buffer instead of a product and a strided copy per layer; on a GPU the
        product runs on the batch's positions plus zero states, up to a row count cuBLAS has likely met
        before (`qace.engine.gemm_rows.padded_rows`, at most ``out``'s positions; `warm_products` meets
        them all ahead), the rows past ``B`` filled with their keys and values. fp32 keeps Hugging
        Face's product per layer and copies it in, so its keys and values are the reference's.
        """
        rows, length, _ = hidden.shape
        width = 2 * len(self.layers) * self.heads * self.d_kv
        if out is None:
            out = hidden.new_empty(rows, length, width)
        views = self.cross_views(out[:rows])
        if self.cross_weight is not None:
            positions = products = rows * length
            if hidden.is_cuda:
                products = min(out.shape[0] * length, padded_rows(positions))
            flat = hidden.reshape(positions, -1)
            if products > positions:
                flat = F.pad(flat, (0, 0, 0, products - positions))
            torch.mm(flat, self.cross_weight.t(), out=out.view(-1, width)[:products])
            return views
        for layer, (k_buf, v_buf) in zip(self.layers, views, strict=True):
            k_buf.copy_(self._split(layer.cross_attn.k(hidden)))
            v_buf.copy_(self._split(layer.cross_attn.v(hidden)))
        return views

    @torch.inference_mode()
    def warm_products(self, out: torch.Tensor) -> int:
        """Run the stacked cross-attention product of `cross_cache` once on zeros at every row count it
        pads a batch's positions to (`qace.engine.gemm_rows.row_counts`), up to the rows of ``out`` (a
        ``(positions, 2 * layers * heads * d_kv)`` buffer it overwrites), so that cuBLAS has chosen a
        kernel for each before a batch needs it; returns how many counts ran (0 where the product is
        not stacked or not on a GPU: fp32, the CPU)."""
        if self.cross_weight is None or not out.is_cuda:
            return 0
        counts = [c for c in row_counts(out.shape[0]) if c <= out.shape[0]]
        zeros = out.new_zeros(counts[-1], self.cross_weight.shape[1])
        for rows in counts:
            torch.mm(zeros[:rows], self.cross_weight.t(), out=out[:rows])
        return len(counts)

    def cross_views(self, buffer: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer, ``(keys, values)`` as ``(B, heads, S, d_kv)`` views of a ``(B, S, 2 * layers *
        heads * d_kv)`` buffer: every layer's keys, then every layer's values (the stacked weights' order)."""
        rows, length, _ = buffer.shape
        split = buffer.view(rows, length, 2, len(self.layers), self.heads, self.d_kv).transpose(1, 4)
        # (B, H, 2, layers, S, D)
        return [(split[:, :, 0, i], split[:, :, 1, i]) for i in range(len(self.layers))]

    @staticmethod
    def cross_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``(B, 1, 1, S)`` additive mask of the encoder's padding."""
        return torch.where(mask[:, None, None, :].bool(), 0.0, torch.finfo(dtype).min).to(dtype)

    def warm_up(
        self,
        shapes: Iterable[tuple[int, int]],
        *,
        device: torch.device,
        steps: int,
        forcing: bool = False,
        unanswerable_id: int | None = None,
        progress: Callable[[int], object] | None = None,
    ) -> int:
        """Capture now the CUDA graphs of every batch shape up to each ``(rows, length)`` of ``shapes``
        (`GraphedDecoding.prepare`); returns how many batch shapes were new. Nothing to do on the CPU or
        without graph decoding: returns 0."""
        if device.type != "cuda" or not self.cuda_graphs:
            return 0
        like = torch.empty(0, device=device, dtype=self.embed.weight.dtype)
        return self.graphed().prepare(
            shapes,
            steps=steps,
            like=like,
            forcing=forcing,
            unanswerable_id=unanswerable_id,
            progress=progress,
        )

    def graphed(self) -> GraphedDecoding:
        """This decoder's CUDA-graph decoding (`qace.families.t5.decode_graphs`), made on first use."""
        if self._graphs is None:
            self._graphs = GraphedDecoding(self)
        return self._graphs

    @torch.inference_mode()
    def generate(
        self,
        hidden: torch.Tensor,
        mask: torch.Tensor,
        *,
        max_new_tokens: int,
        unanswerable_id: int | None = None,
        forced: torch.Tensor | None = None,
        meanwhile: Callable[[], object] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Greedy tokens ``(B, max_new_tokens)`` (``-1`` after a row ended) and first-step answerability.
        ``meanwhile``: see `qace.engine.seq2seq.Decoder.generate`.

        ``forced`` (benchmarks only, ``(B, max_new_tokens)``) replaces each step's argmax, so random-weight
        models can be timed on realistic outputs (varied, EOS-terminated) with all the work still done.
        Eager decoding runs the engine's greedy loop (`qace.engine.greedy.greedy_decode`) on `_EagerSteps`;
        CUDA-graph decoding (`graphed`) keeps the loop's rules inside its captured step.
        """
        if self.cuda_graphs and hidden.is_cuda:
            return self.graphed().generate(
                hidden,
                mask,
                max_new_tokens=max_new_tokens,
                unanswerable_id=unanswerable_id,
                forced=forced,
                meanwhile=meanwhile,
            )
        return greedy_decode(
            _EagerSteps(self, hidden, mask, max_new_tokens),
            hidden.shape[0],
            start_id=self.start_id,
            eos_id=self.eos_id,
            max_new_tokens=max_new_tokens,
            unanswerable_id=unanswerable_id,
            forced=forced,
            meanwhile=meanwhile,
        )

    @staticmethod
    def answerability(logits: torch.Tensor, unanswerable_id: int) -> torch.Tensor:
        """``1 - P(unanswerable)`` from the first step's logits (spec section 5)."""
        return 1.0 - torch.softmax(logits.float(), dim=-1)[:, unanswerable_id]

    def step(
        self,
        token: torch.Tensor,
        pos: torch.Tensor,
        keys: list[torch.Tensor],
        values: list[torch.Tensor],
        cross: list[tuple[torch.Tensor, torch.Tensor]],
        cross_bias: torch.Tensor,
        self_bias: torch.Tensor,
        ended: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """fp32 logits ``(B, vocab)`` of one step at position ``pos`` (a one-element tensor).

        Writes the step's self-attention keys/values into ``keys``/``values`` at ``pos``. No host
        synchronisation and no shape depends on ``pos``, so the step can be captured as a CUDA graph.
        ``ended`` (bool ``(B,)``): rows whose logits are not used; the fused attention skips them
        (`qace.families.t5.decode_attention.attend`), so their logits are not meaningful.
        """
        h = self.embed(token)[:, None, :]
        bias = self_bias.index_select(2, pos)
        for i, layer in enumerate(self.layers):
            x = rms_norm(h, layer.self_norm, self.fused_norm)
            q, k, v = self._split(F.linear(x, self.qkv[i])).chunk(3, dim=1)
            h = self._residual(
                h, attend_step(q, k, v, keys[i], values[i], pos, bias, ended), layer.self_attn.o
            )
            x = rms_norm(h, layer.cross_norm, self.fused_norm)
            q = self._split(layer.cross_attn.q(x))
            k, v = cross[i]
            h = self._residual(h, attend(q, k, v, cross_bias, ended), layer.cross_attn.o)
            if self.fused_norm:
                h = clamp_fp16(self.ff[i].add_(h))
            else:
                h = h + layer.ff(rms_norm(h, layer.ff_norm, fused=False))
        h = rms_norm(h, self.final_norm, self.fused_norm)[:, 0, :]
        if self.head_out_fp32:
            return half_logits(h, self.lm_head, self.output_scale)
        h = h.float()
        if self.output_scale is not None:
            h = h * self.output_scale
        return F.linear(h, self.lm_head)


def half_logits(h: torch.Tensor, head: torch.Tensor, scale: float | None) -> torch.Tensor:
    """fp32 logits ``scale * (h @ head.T)`` of half ``h`` and ``head`` on CUDA, the scale applied in the
    product's epilogue (its ``alpha``): the same single fp32 multiplication of the same fp32 sums as
    scaling the product afterwards, so bit for bit the same logits (tested on the GPU), without a
    second pass over them (2 x 263 MB a step at 2,048 rows of T5's 32,128-token vocabulary)."""
    if scale is None:
        return torch.mm(h, head.t(), out_dtype=torch.float32)
    unused = h.new_empty((), dtype=torch.float32)  # beta = 0: the third term is ignored, NaN or not
    return torch.addmm(unused, h, head.t(), beta=0, alpha=scale, out_dtype=torch.float32)


class _EagerSteps:
    """One batch's eager decoding steps for `greedy_decode`: self-attention caches preallocated for every
    step, cross-attention keys and values computed once; dropped rows leave every cache."""

    def __init__(self, dec: StaticT5Decoder, hidden: torch.Tensor, mask: torch.Tensor, steps: int) -> None:
        rows, device, dtype = hidden.shape[0], hidden.device, hidden.dtype
        self.dec, self.device = dec, device
        self.cross_bias = dec.cross_bias(mask, dtype)
        self.cross = dec.cross_cache(hidden)
        shape = (rows, dec.heads, steps, dec.d_kv)
        self.keys = [torch.zeros(shape, device=device, dtype=dtype) for _ in dec.layers]
        self.values = [torch.zeros(shape, device=device, dtype=dtype) for _ in dec.layers]
        self.self_bias = dec.self_bias(steps, device, dtype)
        self.arrays = TorchArrays(device)

    def step(self, step: int, token: torch.Tensor) -> torch.Tensor:
        """fp32 logits of step ``step`` (`StaticT5Decoder.step`)."""
        dec, pos = self.dec, torch.tensor([step], device=self.device)
        logits = dec.step(token, pos, self.keys, self.values, self.cross, self.cross_bias, self.self_bias)
        dec.row_steps += len(token)
        return logits

    def choose(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.argmax(dim=-1)

    def answerability(self, logits: torch.Tensor, unanswerable_id: int) -> torch.Tensor:
        return self.dec.answerability(logits, unanswerable_id)

    def keep(self, rows: torch.Tensor) -> None:
        self.cross_bias = self.cross_bias[rows]
        self.keys, self.values = [k[rows] for k in self.keys], [v[rows] for v in self.values]
        self.cross = [(k[rows], v[rows]) for k, v in self.cross]
