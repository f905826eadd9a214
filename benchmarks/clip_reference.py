"""Plain CLIP-S and RefCLIP-S (Hessel et al., 2021), one caption at a time, importing nothing from qace.

The definitions, written out the simplest way to check the engine against (`tests/judges/test_clip.py`):

- CLIP-S(c, v) = w * max(cos(E_text(prompt + " " + c), E_image(v)), 0), w = 2.5 (PAC-S: 2.0);
- RefCLIP-S(c, R, v) = harmonic mean of CLIP-S(c, v) and max(max_r cos(E_text(c'), E_text(r')), 0),
  where c' and r' carry the prompt too, as the release encodes references; 0 when both are 0.

Images go through the checkpoint's own image processor (Pillow implementation) in full (resize, crop,
rescale, normalise); texts through its tokenizer, cut to 77 tokens. fp32 on the CPU.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from PIL import Image

PROMPT = "A photo depicts"


def load(model_dir: str) -> tuple[Any, Any, Any]:
    """(model, tokenizer, image processor) of a Transformers CLIP checkpoint."""
    import transformers

    model = transformers.CLIPModel.from_pretrained(model_dir).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    cls = getattr(transformers, "CLIPImageProcessorPil", None) or transformers.CLIPImageProcessor
    return model, tokenizer, cls.from_pretrained(model_dir)


def _tensor(out: Any) -> torch.Tensor:
    """``get_*_features`` returns a tensor (transformers 4) or an output with ``pooler_output`` (5)."""
    return out if isinstance(out, torch.Tensor) else out.pooler_output


@torch.no_grad()
def text_embedding(model: Any, tokenizer: Any, text: str, prompt: str = PROMPT) -> torch.Tensor:
    full = f"{prompt} {text}" if prompt else text
    tokens = tokenizer([full], truncation=True, max_length=77, return_tensors="pt")
    return F.normalize(_tensor(model.get_text_features(**tokens))[0], dim=-1)


@torch.no_grad()
def image_embedding(model: Any, processor: Any, path: str) -> torch.Tensor:
    with Image.open(path) as image:
        pixels = processor(images=image.convert("RGB"), return_tensors="pt")["pixel_values"]
    return F.normalize(_tensor(model.get_image_features(pixel_values=pixels))[0], dim=-1)


def clip_s(model: Any, tokenizer: Any, processor: Any, caption: str, image: str, *, w: float = 2.5,
           prompt: str = PROMPT) -> float:  # fmt: skip
    """CLIP-S of one caption."""
    cos = float(text_embedding(model, tokenizer, caption, prompt) @ image_embedding(model, processor, image))
    return w * max(cos, 0.0)


def refclip_s(model: Any, tokenizer: Any, processor: Any, caption: str, image: str, references: list[str],
              *, w: float = 2.5, prompt: str = PROMPT) -> float:  # fmt: skip
    """RefCLIP-S of one caption."""
    score = clip_s(model, tokenizer, processor, caption, image, w=w, prompt=prompt)
    text = text_embedding(model, tokenizer, caption, prompt)
    ref = max(max(float(text @ text_embedding(model, tokenizer, r, prompt)) for r in references), 0.0)
    return 2 * score * ref / (score + ref) if score + ref > 0 else 0.0


def tensor_features(model: Any) -> Any:
    """``model`` with ``get_text_features`` / ``get_image_features`` returning tensors on every transformers
    version (torchmetrics' CLIPScore expects tensors; transformers 5 returns an output object)."""
    for name in ("get_text_features", "get_image_features"):
        original = getattr(model, name)
        setattr(model, name, lambda *args, _f=original, **kwargs: _tensor(_f(*args, **kwargs)))
    return model
