"""Any Hugging Face image-text-to-text model as a batched, greedy generator of text about an image.

Two parts, each small (batches are planned by the engine's `qace.engine.scheduler.plan_batches`):
offline-first loading (hub id or local directory) with errors that say what to do, and the runner, which
encodes one row at a time with the model's own processor, left-pads a batch, runs ``generate`` greedily,
and optionally records the probabilities of the number tokens at every step (for the expected rating).
Nothing here knows about VisCE²'s prompts.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from qace.engine import instrument
from qace.engine.batches import eos_lengths
from qace.errors import ModelNotFoundError
from qace.judges.rating import NumberTokens
from qace.precision import torch_dtype

if TYPE_CHECKING:
    import torch
    from PIL.Image import Image as PILImage

log = logging.getLogger(__name__)

PROCESSOR_FILES = (
    "chat_template.jinja",
    "chat_template.json",
    "processor_config.json",
    "preprocessor_config.json",
)
"""Files that change the prompt or the pixels, and so the scores, as much as weights do."""
FALLBACK_TEMPLATE = "USER: {image}\n{text} ASSISTANT:"
"""LLaVA-1.5's conversation format, used when a processor has no chat template."""
_SEQUENCE_KEYS = ("input_ids", "attention_mask", "token_type_ids", "mm_token_type_ids")


def load_vlm(name_or_path: str, *, device: str = "cpu", precision: str = "fp32") -> tuple[Any, Any]:
    """Load ``(model, processor)`` from a local directory, the HF cache, or (unless offline) the hub."""
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from qace.models.loading import _hub_attempts
    from qace.models.sources import hub_offline, looks_like_hub_id

    dtype = torch_dtype(precision)
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        attempts, source = [True], str(path)
    elif path.exists() or not looks_like_hub_id(name_or_path):
        raise ModelNotFoundError(f"VLM {name_or_path!r}: no such model directory. {_fix_hint()}")
    else:
        attempts, source = _hub_attempts(name_or_path), name_or_path
    errors = []
    for local_only in attempts:
        try:
            processor = AutoProcessor.from_pretrained(source, local_files_only=local_only)
            model = AutoModelForImageTextToText.from_pretrained(
                source, dtype=dtype, local_files_only=local_only
            )
            return model.to(device).eval(), processor
        except (OSError, ValueError, KeyError) as exc:
            where = "local files" if local_only else "the Hugging Face hub"
            errors.append(f"{where}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            log.debug("loading VLM %s from %s failed", source, where, exc_info=True)
    offline = " (HF_HUB_OFFLINE=1, so the hub was not asked)" if hub_offline() and not path.exists() else ""
    raise ModelNotFoundError(
        f"VLM {source!r}: could not load it{offline}; {'; '.join(errors)}. {_fix_hint()}"
    )


def _fix_hint() -> str:
    return (
        "Fix: pass --vlm with a local directory in Hugging Face layout or a cached hub id "
        "(`hf download llava-hf/llava-1.5-7b-hf` while online); "
        "`qace demo --metric visce2` builds a tiny test VLM instead (its scores mean nothing)."
    )


def vlm_fingerprint(name_or_path: str) -> str:
    """Hub id for hub models; for directories a hash of weights, tokenizer, processor and chat template."""
    from qace.models.loading import checkpoint_fingerprint

    path = Path(name_or_path).expanduser()
    if not path.is_dir():
        return str(name_or_path)
    digest = hashlib.sha256(checkpoint_fingerprint(path).encode())
    for name in PROCESSOR_FILES:
        if (path / name).is_file():
            digest.update(name.encode() + b"\0" + (path / name).read_bytes())
    return f"sha256-{digest.hexdigest()[:12]}"


@dataclass(frozen=True)
class Generation:
    """One generated answer: its token ids (up to EOS), text, whether it hit the length cap, and,
    when asked for, ``number_probs[k, j]``: the probability of number token ``j`` at step ``k``."""

    token_ids: tuple[int, ...]
    text: str
    truncated: bool
    number_probs: np.ndarray | None = None


class _NumberRecorder:
    """A logits processor that leaves the scores alone and keeps the number tokens' probabilities."""

    def __init__(self, ids: torch.Tensor) -> None:
        self.ids = ids
        self.steps: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        probs = scores.float().softmax(dim=-1)
        self.steps.append(probs.index_select(1, self.ids.to(scores.device)))
        return scores


class VLMRunner:
    """Greedy, batched generation with one image per row; see the module docstring."""

    def __init__(self, model: Any, processor: Any, *, device: str = "cpu") -> None:
        import torch

        self.model = model
        self.processor = processor
        self.tokenizer = getattr(processor, "tokenizer", processor)
        self.device = device
        eos = model.generation_config.eos_token_id
        if eos is None:
            eos = self.tokenizer.eos_token_id
        self.eos_ids = {int(e) for e in (eos if isinstance(eos, list | tuple) else [eos]) if e is not None}
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else min(self.eos_ids, default=0))
        vocab = min(len(self.tokenizer), int(model.get_output_embeddings().weight.shape[0]))
        self.numbers = NumberTokens.from_token_strings(
            self.tokenizer.convert_ids_to_tokens(list(range(vocab)))
        )
        self._number_ids = torch.as_tensor(self.numbers.ids, dtype=torch.long)

    def prompt(self, text: str) -> str:
        """The chat-formatted prompt: the image first, then ``text`` (the model's own chat template)."""
        conversation = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}]
        if getattr(self.processor, "chat_template", None):
            return str(self.processor.apply_chat_template(conversation, add_generation_prompt=True))
        image_token = getattr(self.processor, "image_token", "<image>")
        return FALLBACK_TEMPLATE.format(image=image_token, text=text)

    def encode(self, image: PILImage, text: str) -> dict[str, torch.Tensor]:
        """One row's model inputs (the processor expands the image placeholder as the model needs)."""
        encoded = self.processor(images=[image], text=[self.prompt(text)], return_tensors="pt")
        return {k: v for k, v in encoded.items() if hasattr(v, "shape")}

    def generate(
        self, rows: Sequence[dict[str, torch.Tensor]], max_new_tokens: int, *, numbers: bool = False
    ) -> list[Generation]:
        """Greedy answers for ``rows`` (one batch, left-padded), in order."""
        import torch
        from transformers import LogitsProcessorList

        batch = self._collate(rows)
        recorder = _NumberRecorder(self._number_ids) if numbers else None
        extra: dict[str, Any] = {}
        if instrument.of(self).full_length:  # benchmarks only: scores then mean nothing
            extra["min_new_tokens"] = max_new_tokens
        with torch.inference_mode():
            out = self.model.generate(
                **batch,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                num_beams=1,
                pad_token_id=self.pad_id,
                logits_processor=LogitsProcessorList([recorder]) if recorder else None,
                **extra,
            )
        new = out[:, batch["input_ids"].shape[1] :].cpu().numpy()
        probs = torch.stack(recorder.steps, dim=1).cpu().numpy() if recorder and recorder.steps else None
        lengths, ended = eos_lengths(new, self.eos_ids)
        results = []
        for i, ids in enumerate(new.tolist()):
            kept = ids[: lengths[i]]
            text = self.tokenizer.decode(kept, skip_special_tokens=True).strip()
            row_probs = probs[i, : len(kept)] if probs is not None else None
            results.append(Generation(tuple(kept), text, not ended[i], row_probs))
        return results

    def pieces(self, token_ids: Sequence[int], start: int, end: int) -> tuple[list[int], list[str]]:
        """Steps and token strings of the generated tokens that wrote ``text[start:end]`` (text as
        ``generate`` returns it: decoded and stripped)."""
        steps: list[int] = []
        previous = 0
        lead: int | None = None
        for k in range(len(token_ids)):
            decoded = self.tokenizer.decode(list(token_ids[: k + 1]), skip_special_tokens=True)
            stripped = decoded.lstrip()
            if not stripped:
                continue
            if lead is None:
                lead = len(decoded) - len(stripped)
            length = len(decoded) - lead
            if length > previous and previous < end and length > start:
                steps.append(k)
            previous = max(previous, length)
            if previous >= end:
                break
        tokens = self.tokenizer.convert_ids_to_tokens([token_ids[k] for k in steps])
        return steps, [str(t) for t in tokens]

    def _collate(self, rows: Sequence[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """Left-pad the token-aligned inputs; concatenate everything else (pixels) along dim 0."""
        import torch

        width = max(int(r["input_ids"].shape[1]) for r in rows)
        batch: dict[str, torch.Tensor] = {}
        for key in rows[0]:
            values = [r[key] for r in rows]
            if key in _SEQUENCE_KEYS:
                fill = self.pad_id if key == "input_ids" else 0
                values = [torch.nn.functional.pad(v, (width - v.shape[1], 0), value=fill) for v in values]
            batch[key] = torch.cat(values, dim=0).to(self.device)
        if "pixel_values" in batch:
            batch["pixel_values"] = batch["pixel_values"].to(self.model.dtype)
        return batch
