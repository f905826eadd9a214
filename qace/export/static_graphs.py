"""The static-cache decoder step (``decoder_static``) and the graph that starts it (``static_init``).

`StaticStep` is one greedy decoding step whose shapes do not depend on the step (the design of the
PyTorch runner's CUDA-graph decoding, `qace.families.t5.decode_graphs`), so ONNX Runtime can capture it
once per batch shape as a CUDA graph and replay it:

- the self-attention keys and values live in a cache of ``steps`` positions per layer, (B, H, steps,
  Dk); the step writes its own at position ``step`` (``ScatterElements`` along the positions, its
  indices made from ``step`` by elementwise operations, so no shape or host value depends on the step)
  and returns the cache, which the runner binds to the input's own buffer: the cache is updated in
  place (`qace.onnx_format.static_in_place`);
- its query attends to every position, the later ones masked by T5's decoder position bias computed in
  the graph from the step index (``bidirectional=False`` buckets, the future at the dtype's minimum);
- the greedy rules of the engine's loop (`qace.engine.greedy`) are device operations (`greedy_rules`):
  the forced token replaces the argmax where one is given, a row that has ended emits -1 and is fed EOS;
- every reshape uses constants and the step index feeds only Gather indices and elementwise operations,
  so ONNX Runtime keeps every node on the CUDA provider (a node on the host would need a copy, which
  CUDA graphs refuse).

`StaticInit` (no weights) turns ``decoder_init``'s first step into the state the first ``decoder_static``
reads: the same greedy rules for step 0, the step index 1, and the first position of the caches.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from qace.export.graphs import decoder_step, mask_bias, position_bias
from qace.onnx_format import NOT_FORCED


def greedy_rules(
    chosen: torch.Tensor, forced: torch.Tensor, finished: torch.Tensor, eos_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One step of the greedy loop's bookkeeping on ``(B,)`` tensors: the forced token replaces the
    greedy choice where it is not `NOT_FORCED`; returns what the step emits (-1 for a row that had
    ended), the ended flags after it, and each row's next input (EOS once ended)."""
    token = torch.where(forced == NOT_FORCED, chosen, forced)
    emitted = torch.where(finished, -1, token)
    finished = finished | (token == eos_id)
    return emitted, finished, torch.where(finished, eos_id, token)


class StaticStep(nn.Module):
    """One greedy step over a static self-attention cache of ``steps`` positions (see module docstring)."""

    def __init__(self, model: Any, steps: int) -> None:
        super().__init__()
        self.model, self.steps = model, steps

    def forward(
        self,
        decoder_input_ids: torch.Tensor,
        step: torch.Tensor,
        finished: torch.Tensor,
        forced: torch.Tensor,
        encoder_attention_mask: torch.Tensor,
        *past: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        model = self.model
        dtype = past[0].dtype
        positions = torch.arange(self.steps, dtype=torch.long)
        first = model.decoder.block[0].layer[0].SelfAttention
        bias = position_bias(first, model.config, step, positions, decoder=True).to(dtype)
        self_bias = torch.where(positions > step, torch.finfo(dtype).min, bias)
        where: list[torch.Tensor] = []  # (B, H, 1, Dk): ``step`` everywhere, the position this step writes

        def write(i: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            if not where:  # elementwise from ``k`` (true even where k is NaN) and ``step``: no Shape node
                where.append(torch.where(k == k, step, step))
            return past[4 * i].scatter(2, where[0], k), past[4 * i + 1].scatter(2, where[0], v)

        cross = [(past[4 * i + 2], past[4 * i + 3]) for i in range(len(past) // 4)]
        enc_bias = mask_bias(encoder_attention_mask, dtype)
        logits, caches = decoder_step(model, decoder_input_ids, self_bias, enc_bias, cross, write)
        now = forced.index_select(1, step)[:, 0]
        eos = model.config.eos_token_id
        emitted, finished, token = greedy_rules(logits.argmax(dim=-1), now, finished, eos)
        return (emitted, token[:, None], step + 1, finished, *caches)


class StaticInit(nn.Module):
    """The state after the first step (``decoder_init``'s), laid out for ``decoder_static``: what step 0
    emits, the tokens to feed, the step index 1, the ended flags, the forced tokens and the encoder mask
    (copied where the captured step reads them), and the caches with ``decoder_init``'s keys and values
    at position 0 and zeros after (masked, but finite: a masked NaN would still poison the softmax)."""

    def __init__(self, steps: int, eos_id: int) -> None:
        super().__init__()
        self.steps, self.eos_id = steps, eos_id

    def forward(
        self,
        next_token: torch.Tensor,
        forced: torch.Tensor,
        encoder_attention_mask: torch.Tensor,
        *present: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        started = next_token < 0  # all false: no row has ended before the first step
        emitted, finished, token = greedy_rules(next_token, forced[:, 0], started, self.eos_id)
        step = torch.ones_like(next_token[:1])  # a kernel's output, not a constant the runtime must copy
        empty = [torch.zeros_like(kv).expand(-1, -1, self.steps - 1, -1) for kv in present]
        caches = [torch.cat([kv, zeros], dim=2) for kv, zeros in zip(present, empty, strict=True)]
        return (emitted, token[:, None], step, finished, forced * 1, encoder_attention_mask * 1, *caches)
