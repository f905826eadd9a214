"""The T5 family (T5 and Visual-T5): what runs them on the PyTorch runner.

- `encoder`: Hugging Face's encoder stack in fp32, a fused forward of its weights in half precision;
- `decoder`: the static-cache greedy decoder, eager or replayed as CUDA graphs (`decode_graphs`), with
  the one-query attention kernel of `decode_attention` (Triton);
- `ops`: the building blocks both share (and the ONNX export graphs, `qace.export.graphs`), with the
  fp16 overflow guard of `fp16_guard` (Triton).

`parts` is this family's row of the family table (`qace.families.FAMILIES`). Visual-T5's model class
and its input layout stay in `qace.models.visual_t5` (loading, tokenizing and the ONNX export use them
without the runner); this package reaches its region embedding only through the model's
``visual_embeds`` and ``encoder.img_emb``.
"""

from __future__ import annotations

from typing import Any

import torch

from qace.engine.seq2seq import Seq2SeqParts
from qace.families.t5.decoder import StaticT5Decoder
from qace.families.t5.encoder import T5Encoder


class T5Encoding:
    """The runner's `qace.engine.seq2seq.Encoder` of a T5 model: a Visual-T5 batch's region features
    are embedded by the model's own ``visual_embeds``, then `T5Encoder` runs on the embeddings."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.encoder = T5Encoder(model)

    @property
    def feature_dtype(self) -> torch.dtype | None:
        """Visual-T5: the dtype of its region projection ``encoder.img_emb``; T5: None."""
        img_emb = getattr(self.model.encoder, "img_emb", None)
        return None if img_emb is None else img_emb.weight.dtype

    def warm_up(self, max_tokens: int) -> int:
        """`T5Encoder.warm_up`: the products at every padded row count up to ``max_tokens``."""
        return self.encoder.warm_up(max_tokens)

    def __call__(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        features: torch.Tensor | None = None,
        *,
        kept: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if features is None:
            return self.encoder(attention_mask, input_ids=input_ids, kept=kept)
        embeds, mask = self.model.visual_embeds(input_ids, attention_mask, features)
        if kept is not None:  # the prefix and region columns visual_embeds appended are all kept
            kept += mask.shape[1] - attention_mask.shape[1]
        return self.encoder(mask, inputs_embeds=embeds, kept=kept)


def parts(model: Any) -> Seq2SeqParts:
    """The encoder and decoder of a loaded T5 or Visual-T5: transformers' classes (fp32) or
    `qace.models.t5_modules` (half precision)."""
    return Seq2SeqParts(T5Encoding(model), StaticT5Decoder(model))
