"""Visual-T5's input layout (spec section 4): the 64 question slots, the "image :" prefix and the 36
regions, the question ids for a batch, and the encoder's input embeddings built from them. No model
code: host processes and scripts that only build inputs import this without transformers' modelling
code (`qace.models.visual_t5` and `qace.models.t5_modules` hold the model classes).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np
import torch

from qace.engine.prompt_ids import prompt_ids
from qace.engine.scheduler import pad_batch
from qace.engine.tokenize import token_ids
from qace.errors import FeatureError, InputError

logger = logging.getLogger(__name__)

NUM_REGIONS = 36
"""Region boxes per image in the bottom-up-attention features the release was trained on."""
REGION_DIM = 2054
"""2048 pooled CNN features plus 6 box numbers per region."""
QUESTION_SLOTS = 64
"""Fixed number of question-token positions; shorter questions are right-padded with id 0."""
IMAGE_PREFIX_TEXT = "image :"
"""The text of the prefix between the question and the regions."""
DEFAULT_IMAGE_PREFIX_IDS: tuple[int, ...] = (1023, 10)
"""``"image :"`` in the t5-small vocabulary, placed between the question and the regions."""
VISUAL_QUESTION_PREFIX = "visual answer: "
"""Task prefix the release puts before every visual question."""
PAD_ID = 0
"""T5's pad id, used for the empty question slots (release)."""


def encoder_length(config: Any) -> int:
    """Number of encoder positions (102 for the release layout)."""
    return QUESTION_SLOTS + len(image_prefix_ids(config)) + NUM_REGIONS


def image_prefix_ids(config: Any) -> tuple[int, ...]:
    """The prefix token ids for this checkpoint: ``config.image_prefix_ids`` or the release default."""
    ids = getattr(config, "image_prefix_ids", None)
    return DEFAULT_IMAGE_PREFIX_IDS if ids is None else tuple(int(i) for i in ids)


@lru_cache(maxsize=8)
def _prefix_tensor(ids: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """The prefix ids on ``device``, made once: a tensor made from a list on a GPU waits for the GPU to
    finish its queue (a pageable copy), which kept the host from preparing the next batch. Made outside
    inference mode, whichever mode its first caller runs in, so that training can use it too."""
    with torch.inference_mode(False):
        return torch.tensor(ids, dtype=torch.long, device=device)


def visual_question_inputs(
    tokenizer: object, questions: Sequence[str], *, compose: bool = False
) -> tuple[torch.Tensor, torch.Tensor, list[bool]]:
    """Tokenize ``"visual answer: " + q`` without EOS into 64 right-padded slots (release layout).

    Returns ``(input_ids, attention_mask, truncated)``; both tensors are (B, 64) int64. Questions
    longer than 64 tokens are cut to 64 and flagged, where the release crashed (spec, ours).
    ``compose=True`` (the engine) gives the same ids, each question's reused across calls
    (`qace.engine.prompt_ids`); the reference implementation tokenises each prompt whole.
    """
    if isinstance(questions, str):
        raise InputError("visual_question_inputs expects a sequence of questions, not a single string")
    if compose:
        encode = prompt_ids(tokenizer, VISUAL_QUESTION_PREFIX + "{question}", special_tokens=False)
        encoded = encode([(q,) for q in questions])
    else:
        encoded = token_ids(tokenizer, [VISUAL_QUESTION_PREFIX + q for q in questions], special_tokens=False)
    lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
    cut = lengths > QUESTION_SLOTS
    for row in np.flatnonzero(cut):
        logger.warning("visual question %d truncated to %d tokens", row, QUESTION_SLOTS)
    # one scatter for the whole batch (a Visual-T5 chunk asks thousands of questions), widened to the slots
    ids, mask = pad_batch([x[:QUESTION_SLOTS] for x in encoded] if cut.any() else encoded, PAD_ID)
    wider = ((0, 0), (0, QUESTION_SLOTS - ids.shape[1]))
    ids, mask = np.pad(ids, wider, constant_values=PAD_ID), np.pad(mask, wider)
    return torch.from_numpy(ids), torch.from_numpy(mask), cut.tolist()


def visual_embeds(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, features: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """A Visual-T5 ``model``'s encoder input embeddings ``(B, 102, d_model)`` and mask ``(B, 102)``:
    question slots, prefix, regions projected by ``model.encoder.img_emb``.

    ``input_ids``/``attention_mask`` are ``(B, 64)`` from `visual_question_inputs`; ``features`` is
    ``(B, 36, 2054)``. The mask is needed again by the decoder's cross-attention.
    """
    _check_shapes(input_ids, attention_mask, features)
    batch = input_ids.shape[0]
    shared = model.get_input_embeddings()
    device = shared.weight.device
    input_ids = input_ids.to(device)
    attention_mask = attention_mask.to(device)
    prefix = _prefix_tensor(image_prefix_ids(model.config), device).expand(batch, -1)
    img_emb = model.encoder.img_emb
    regions = img_emb(features.to(device=device, dtype=img_emb.weight.dtype))
    embeds = torch.cat([shared(input_ids), shared(prefix), regions.to(shared.weight.dtype)], dim=1)
    ones = attention_mask.new_ones((batch, prefix.shape[1] + NUM_REGIONS))
    return embeds, torch.cat([attention_mask, ones], dim=1)


def _check_shapes(input_ids: torch.Tensor, attention_mask: torch.Tensor, features: torch.Tensor) -> None:
    """Reject wrongly shaped inputs with a message, instead of a matmul error deep inside T5."""
    if input_ids.ndim != 2 or input_ids.shape[1] != QUESTION_SLOTS:
        raise InputError(
            f"visual question ids must have shape (B, {QUESTION_SLOTS}), got {tuple(input_ids.shape)}"
        )
    if tuple(attention_mask.shape) != tuple(input_ids.shape):
        raise InputError(
            f"attention mask shape {tuple(attention_mask.shape)} differs from ids {tuple(input_ids.shape)}"
        )
    expected = (input_ids.shape[0], NUM_REGIONS, REGION_DIM)
    if tuple(features.shape) != expected:
        raise FeatureError(f"region features must have shape {expected}, got {tuple(features.shape)}")
