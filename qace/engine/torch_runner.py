"""PyTorch runner: encoder once per input, then a greedy loop over the decoder with a KV cache.

The loop drops rows as soon as they emit EOS (CTranslate2's trick), so a batch costs what its longest
*unfinished* output costs, and it stops when every row has ended. Answerability is read from the first
step's logits of this same pass (spec section 5), never from a second forward pass.
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import torch

from qace.engine.batches import Generated, TextBatch, VisualBatch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def _cache_kwarg(model: torch.nn.Module) -> str:
    """Transformers renamed ``past_key_values`` to ``cache``; accept whichever this version takes."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


class TorchRunner:
    """Runs one seq2seq model (T5 or Visual-T5) on batches planned by the scheduler."""

    def __init__(self, model: Any, *, device: str = "cpu") -> None:
        self.model = model
        self.device = torch.device(device)
        self.config = model.config
        self._cache_kw = _cache_kwarg(model)
        self._start_id = int(self.config.decoder_start_token_id)
        self._eos_id = int(self.config.eos_token_id)

    @torch.inference_mode()
    def generate(
        self, batch: TextBatch | VisualBatch, *, max_new_tokens: int, unanswerable_id: int | None = None
    ) -> Generated:
        """Greedy-decode every row of ``batch``."""
        ids = torch.from_numpy(batch.input_ids).to(self.device)
        mask = torch.from_numpy(batch.attention_mask).to(self.device)
        if isinstance(batch, VisualBatch):
            dtype = next(self.model.parameters()).dtype
            feats = torch.from_numpy(batch.features).to(self.device, dtype)
            encoder_outputs, mask = self.model.encode_visual(ids, mask, feats)
        else:
            encoder_outputs = self.model.get_encoder()(input_ids=ids, attention_mask=mask)
        return self._greedy(encoder_outputs, mask, max_new_tokens, unanswerable_id)

    def _greedy(
        self, encoder_outputs: Any, mask: torch.Tensor, max_new_tokens: int, unanswerable_id: int | None
    ) -> Generated:
        rows = mask.shape[0]
        hidden = encoder_outputs.last_hidden_state
        alive = torch.arange(rows, device=self.device)
        token = torch.full((rows, 1), self._start_id, dtype=torch.long, device=self.device)
        out = torch.full((rows, max_new_tokens), -1, dtype=torch.long, device=self.device)
        answerability = None
        cache = None
        for step in range(max_new_tokens):
            result = self.model(
                encoder_outputs=(hidden,), attention_mask=mask, decoder_input_ids=token,
                use_cache=True, **{self._cache_kw: cache},
            )
            cache = getattr(result, self._cache_kw)
            logits = result.logits[:, -1, :].float()
            if step == 0 and unanswerable_id is not None:
                answerability = (1.0 - torch.softmax(logits, dim=-1)[:, unanswerable_id]).cpu().numpy()
            token = logits.argmax(dim=-1, keepdim=True)
            out[alive, step] = token[:, 0]
            keep = token[:, 0] != self._eos_id
            if not bool(keep.all()):
                if not bool(keep.any()):
                    break
                index = keep.nonzero()[:, 0]
                alive, token, hidden, mask = alive[index], token[index], hidden[index], mask[index]
                cache.batch_select_indices(index)
        return Generated(tokens=_cut(out.cpu().numpy(), self._eos_id), answerability=answerability)


def _cut(out: np.ndarray, eos_id: int) -> list[list[int]]:
    """Generated ids per row up to (excluding) EOS; ``-1`` marks steps a finished row never ran."""
    tokens = []
    for row in out:
        ids = row[row >= 0].tolist()
        tokens.append(ids[: ids.index(eos_id)] if eos_id in ids else ids)
    return tokens
