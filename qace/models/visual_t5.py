"""Visual-T5: T5 whose encoder also reads 36 projected region features (spec section 4).

The release extends T5-small with one ``nn.Linear(2054, d_model)`` stored as ``encoder.img_emb``;
keeping that exact attribute path keeps our state-dict keys identical to the release checkpoint, so
it loads without renaming. The encoder input has a fixed layout of 102 positions (64 question slots,
two "image :" prefix tokens, 36 regions): relative position bias spans all of them, so the padding
is part of the model's input and must never be squeezed out.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import T5Config, T5ForConditionalGeneration
from transformers.modeling_outputs import BaseModelOutput

from qace.models.visual_inputs import REGION_DIM, image_prefix_ids, visual_embeds


class VisualT5ForConditionalGeneration(T5ForConditionalGeneration):
    """T5 with a region-feature projection at ``encoder.img_emb`` (release layout).

    Answering is two calls: :meth:`encode_visual` builds the 102-position encoder output, then the
    ordinary ``generate(encoder_outputs=..., attention_mask=...)`` decodes; this keeps Hugging Face's
    decoding untouched, and the engine's own decoding loop can reuse the same encoder output.
    """

    def __init__(self, config: T5Config) -> None:
        super().__init__(config)
        # Attached to the encoder stack (not the top model) so the keys read encoder.img_emb.*.
        self.encoder.img_emb = nn.Linear(REGION_DIM, config.d_model)

    @property
    def prefix_ids(self) -> tuple[int, ...]:
        """Token ids placed between question slots and regions."""
        return image_prefix_ids(self.config)

    def encode_visual(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        features: torch.Tensor,
    ) -> tuple[BaseModelOutput, torch.Tensor]:
        """Encode question slots + prefix + regions; return the encoder output and its (B, 102) mask.

        ``input_ids``/``attention_mask`` are (B, 64) from :func:`visual_question_inputs`;
        ``features`` is (B, 36, 2054). The mask is needed again by the decoder's cross-attention.
        """
        embeds, full_mask = self.visual_embeds(input_ids, attention_mask, features)
        encoder_outputs = self.encoder(inputs_embeds=embeds, attention_mask=full_mask, return_dict=True)
        return BaseModelOutput(last_hidden_state=encoder_outputs.last_hidden_state), full_mask

    def visual_embeds(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, features: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The encoder's input embeddings and mask (`qace.models.visual_inputs.visual_embeds`)."""
        return visual_embeds(self, input_ids, attention_mask, features)
