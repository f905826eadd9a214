"""An OpenAI-``clip``-layout checkpoint (PAC-S's ``clip_ViT-B-32.pth``) as a Transformers CLIP directory.

    python -m qace.judges.clip_convert clip_ViT-B-32.pth pacs-vit-b32/ [--base openai/clip-vit-base-patch32]

The release's checkpoints are state dicts of OpenAI's ``clip`` model (``{"state_dict": ...}``, keys such
as ``visual.transformer.resblocks.0.attn.in_proj_weight``). `convert` renames them into a
``CLIPModel`` of ``base``'s configuration (the CLIP the checkpoint was fine-tuned from: its shapes must
match), splitting the fused attention projections and transposing the output projections, and saves the
model with ``base``'s tokenizer and image processor, so ``--clip-model pacs-vit-b32/`` loads it.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

import torch

from qace.errors import ConfigError

_LAYER = {
    "attn.out_proj": "self_attn.out_proj", "ln_1": "layer_norm1", "ln_2": "layer_norm2",
    "mlp.c_fc": "mlp.fc1", "mlp.c_proj": "mlp.fc2",
}  # fmt: skip
_TOP = {
    "visual.conv1.weight": "vision_model.embeddings.patch_embedding.weight",
    "visual.class_embedding": "vision_model.embeddings.class_embedding",
    "visual.positional_embedding": "vision_model.embeddings.position_embedding.weight",
    "visual.ln_pre.weight": "vision_model.pre_layrnorm.weight",
    "visual.ln_pre.bias": "vision_model.pre_layrnorm.bias",
    "visual.ln_post.weight": "vision_model.post_layernorm.weight",
    "visual.ln_post.bias": "vision_model.post_layernorm.bias",
    "token_embedding.weight": "text_model.embeddings.token_embedding.weight",
    "positional_embedding": "text_model.embeddings.position_embedding.weight",
    "ln_final.weight": "text_model.final_layer_norm.weight",
    "ln_final.bias": "text_model.final_layer_norm.bias",
    "logit_scale": "logit_scale",
}
_TRANSPOSED = {"visual.proj": "visual_projection.weight", "text_projection": "text_projection.weight"}


def rename(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Transformers ``CLIPModel`` names of an OpenAI-``clip`` state dict (see the module docstring)."""
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        key = key.removeprefix("module.")
        if key in _TOP:
            out[_TOP[key]] = value
        elif key in _TRANSPOSED:
            out[_TRANSPOSED[key]] = value.t().contiguous()
        elif key in ("input_resolution", "context_length", "vocab_size"):
            continue  # ints the JIT archives keep beside the weights
        elif match := re.match(r"^(visual\.)?transformer\.resblocks\.(\d+)\.(.+)$", key):
            tower = "vision_model" if match.group(1) else "text_model"
            prefix = f"{tower}.encoder.layers.{match.group(2)}"
            rest = match.group(3)
            if rest in ("attn.in_proj_weight", "attn.in_proj_bias"):
                kind = rest.rsplit("_", 1)[1]
                for name, part in zip("qkv", value.chunk(3, dim=0), strict=True):
                    out[f"{prefix}.self_attn.{name}_proj.{kind}"] = part.contiguous()
            else:
                module, _, kind = rest.rpartition(".")
                if module not in _LAYER:
                    raise ConfigError(f"unexpected OpenAI CLIP key {key!r}")
                out[f"{prefix}.{_LAYER[module]}.{kind}"] = value
        else:
            raise ConfigError(f"unexpected OpenAI CLIP key {key!r}: not a checkpoint of OpenAI's clip model")
    return out


def load_state(path: str | Path) -> dict[str, torch.Tensor]:
    """The state dict of a ``.pth``/``.pt`` checkpoint: a plain state dict, ``{"state_dict": ...}``, or
    a TorchScript archive of OpenAI's ``clip``."""
    try:
        loaded: Any = torch.load(str(path), map_location="cpu", weights_only=True)
    except RuntimeError:
        loaded = torch.jit.load(str(path), map_location="cpu").state_dict()
    state = loaded.get("state_dict", loaded) if isinstance(loaded, dict) else loaded
    if not isinstance(state, dict) or not state:
        raise ConfigError(f"{path} holds no state dict")
    return {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}


def convert(checkpoint: str | Path, out_dir: str | Path, base: str) -> Path:
    """Write ``out_dir``: ``checkpoint``'s weights in a ``CLIPModel`` of ``base``'s configuration, with
    ``base``'s tokenizer and image processor. `ConfigError` when the shapes do not fit ``base``."""
    from transformers import AutoConfig, AutoTokenizer, CLIPModel, ImageProcessingMixin

    weights = rename(load_state(checkpoint))
    model = CLIPModel(AutoConfig.from_pretrained(base)).eval()
    expected = model.state_dict()
    wrong = [k for k, v in weights.items() if k not in expected or expected[k].shape != v.shape]
    missing = [k for k in expected if k not in weights and not k.endswith("position_ids")]
    if wrong or missing:
        raise ConfigError(
            f"{checkpoint} does not fit {base}'s CLIP (unexpected or misshaped: {wrong[:3]}, missing: "
            f"{missing[:3]}); pass --base, the CLIP it was fine-tuned from"
        )
    model.load_state_dict(weights, strict=False)
    out = Path(out_dir)
    model.save_pretrained(str(out), safe_serialization=True)
    AutoTokenizer.from_pretrained(base).save_pretrained(str(out))
    processor, _ = ImageProcessingMixin.get_image_processor_dict(base)
    (out / "preprocessor_config.json").write_text(json.dumps(processor, indent=2) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m qace.judges.clip_convert", description=__doc__.split("\n")[0])
    p.add_argument("checkpoint", help="OpenAI-clip-layout .pth (PAC-S's clip_ViT-B-32.pth)")
    p.add_argument("out", help="the Transformers CLIP directory to write")
    p.add_argument("--base", default="openai/clip-vit-base-patch32", help="the CLIP it was fine-tuned from")
    args = p.parse_args(argv)
    print(convert(args.checkpoint, args.out, args.base))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
