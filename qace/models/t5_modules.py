"""T5 and Visual-T5 as the engine runs them in half precision: the weights in Hugging Face's module layout,
built without transformers' modelling code.

Importing transformers' modelling code (``modeling_utils`` pulls in ``torch._dynamo`` and
``torch.distributed.tensor``) costs 2-3.5 s, more than importing torch; every ``qace score`` on a GPU paid
it. The engine's half-precision encoder and decoder (`qace.families.t5`) read weights, the relative
position bias, the layer norms' epsilon and, for gated checkpoints, the feed-forward block from the
model, never its forward; so half precision builds these modules (`build_t5`). fp32 keeps transformers'
classes, whose forward the fp32 encoder runs, so fp32 scores stay the reference implementation's.

The configuration is read from ``config.json`` by `read_settings` (`T5Settings`): transformers'
``T5Config`` module imports its modelling code too (through its docstring decorator).

Attribute paths and weight names are Hugging Face's (``encoder.block.0.layer.0.SelfAttention.q.weight``,
Visual-T5's ``encoder.img_emb``), so checkpoints load without renaming; the embedding is one module
shared by both stacks, and ``lm_head`` is tied to it where the config says so (T5 v1.0).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path

import torch
from torch import nn

from qace.models.visual_inputs import REGION_DIM, image_prefix_ids, visual_embeds


@dataclass(frozen=True)
class T5Settings:
    """The fields of a T5 ``config.json`` these modules and the engine read, with ``T5Config``'s defaults."""

    model_type: str = "t5"
    vocab_size: int = 32128
    d_model: int = 512
    d_kv: int = 64
    d_ff: int = 2048
    num_layers: int = 6
    num_decoder_layers: int | None = None
    num_heads: int = 8
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    layer_norm_epsilon: float = 1e-6
    feed_forward_proj: str = "relu"
    tie_word_embeddings: bool = True
    """T5 v1.0 (the paper's models): the output projection is the embedding, and outputs are scaled."""
    scale_decoder_outputs: bool = True
    """Scale the last hidden state by ``d_model ** -0.5`` before the output projection (T5 v1.0)."""
    pad_token_id: int = 0
    eos_token_id: int = 1
    decoder_start_token_id: int = 0
    image_prefix_ids: tuple[int, ...] | None = None
    """Visual-T5: the ids between question slots and regions (`qace.models.visual_inputs`)."""

    @property
    def is_gated_act(self) -> bool:
        return self.feed_forward_proj.startswith("gated-")

    @property
    def dense_act_fn(self) -> str:
        """``gated-gelu`` means the tanh GELU (``gelu_new``), as transformers reads it."""
        act = self.feed_forward_proj.split("-")[-1]
        return "gelu_new" if self.feed_forward_proj == "gated-gelu" else act


def read_settings(path: Path) -> T5Settings:
    """`T5Settings` of a ``config.json``; keys it does not know are ignored. Configurations written by
    transformers 4 say ``tie_word_embeddings: false`` for T5 v1.1 and nothing about scaling (it followed the
    tie); transformers 5 writes ``scale_decoder_outputs``."""
    raw = json.loads(Path(path).read_text())
    known = {f.name for f in fields(T5Settings)}
    values = {k: v for k, v in raw.items() if k in known and v is not None}
    if "scale_decoder_outputs" not in raw:
        values["scale_decoder_outputs"] = raw.get("tie_word_embeddings", True) is not False
    if "decoder_start_token_id" not in raw:
        values["decoder_start_token_id"] = raw.get("pad_token_id", 0)
    if values.get("image_prefix_ids") is not None:
        values["image_prefix_ids"] = tuple(int(i) for i in values["image_prefix_ids"])
    return T5Settings(**values)


IGNORED_WEIGHTS = frozenset({"decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight"})
"""Weights some T5 checkpoints carry and T5 never uses (transformers drops them on load too)."""


class Embedding(nn.Embedding):
    """``nn.Embedding`` without the random initialisation: its weight comes from the checkpoint, and
    initialising it on the meta device would import ``torch._dynamo``."""

    def reset_parameters(self) -> None:
        pass


class RMSNorm(nn.Module):
    """T5's layer norm: a scale and an epsilon (no mean, no bias)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(size))
        self.variance_epsilon = eps


class Attention(nn.Module):
    """q, k, v, o projections without bias; the first layer of each stack also holds the relative
    position bias table (`compute_bias`)."""

    def __init__(self, config: T5Settings, *, relative_bias: bool, decoder: bool) -> None:
        super().__init__()
        inner = config.num_heads * config.d_kv
        self.n_heads, self.key_value_proj_dim, self.is_decoder = config.num_heads, config.d_kv, decoder
        self.buckets = config.relative_attention_num_buckets
        self.max_distance = config.relative_attention_max_distance
        self.q = nn.Linear(config.d_model, inner, bias=False)
        self.k = nn.Linear(config.d_model, inner, bias=False)
        self.v = nn.Linear(config.d_model, inner, bias=False)
        self.o = nn.Linear(inner, config.d_model, bias=False)
        if relative_bias:
            self.relative_attention_bias = Embedding(self.buckets, self.n_heads)

    def compute_bias(
        self, query_length: int, key_length: int, device: torch.device | None = None
    ) -> torch.Tensor:
        """``(1, heads, query_length, key_length)`` relative position bias, T5's bucketing: exact buckets
        for near positions, logarithmic ones up to ``max_distance``; the decoder's are one-sided."""
        table = self.relative_attention_bias
        device = table.weight.device if device is None else device
        context = torch.arange(query_length, dtype=torch.long, device=device)[:, None]
        memory = torch.arange(key_length, dtype=torch.long, device=device)[None, :]
        buckets = relative_bucket(memory - context, not self.is_decoder, self.buckets, self.max_distance)
        return table(buckets).permute([2, 0, 1]).unsqueeze(0)


def relative_bucket(
    relative: torch.Tensor, bidirectional: bool, num_buckets: int, max_distance: int
) -> torch.Tensor:
    """T5's relative position -> bucket (Mesh TensorFlow's rule, with transformers' ops in its order;
    out of place, so the ONNX exporter traces it too)."""
    buckets = torch.zeros_like(relative)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative > 0).to(torch.long) * num_buckets
        relative = torch.abs(relative)
    else:
        relative = -torch.min(relative, torch.zeros_like(relative))
    max_exact = num_buckets // 2
    is_small = relative < max_exact
    large = max_exact + (
        torch.log(relative.float() / max_exact)
        / math.log(max_distance / max_exact)
        * (num_buckets - max_exact)
    ).to(torch.long)
    large = torch.min(large, torch.full_like(large, num_buckets - 1))
    return buckets + torch.where(is_small, relative, large)


def _activation(name: str) -> nn.Module:
    """T5's feed-forward activations: ReLU (v1.0, the paper's) or the tanh GELU (v1.1, ``gelu_new``)."""
    if name == "relu":
        return nn.ReLU()
    if name in {"gelu_new", "gelu_pytorch_tanh"}:
        return TanhGELU()
    if name == "gelu":
        return nn.GELU()
    raise ValueError(f"T5 activation {name!r} is not supported (relu, gelu, gelu_new)")


class TanhGELU(nn.Module):
    """transformers' ``gelu_new`` formula, term for term."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class DenseActDense(nn.Module):
    """ReLU (or other) feed-forward: ``wo(act(wi(x)))``."""

    def __init__(self, config: T5Settings) -> None:
        super().__init__()
        self.wi = nn.Linear(config.d_model, config.d_ff, bias=False)
        self.wo = nn.Linear(config.d_ff, config.d_model, bias=False)
        self.act = _activation(config.dense_act_fn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.wo(self.act(self.wi(x)))


class DenseGatedActDense(nn.Module):
    """Gated feed-forward (T5 v1.1): ``wo(act(wi_0(x)) * wi_1(x))``."""

    def __init__(self, config: T5Settings) -> None:
        super().__init__()
        self.wi_0 = nn.Linear(config.d_model, config.d_ff, bias=False)
        self.wi_1 = nn.Linear(config.d_model, config.d_ff, bias=False)
        self.wo = nn.Linear(config.d_ff, config.d_model, bias=False)
        self.act = _activation(config.dense_act_fn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.wo(self.act(self.wi_0(x)) * self.wi_1(x))


class _SelfAttentionLayer(nn.Module):
    def __init__(self, config: T5Settings, *, relative_bias: bool, decoder: bool) -> None:
        super().__init__()
        self.SelfAttention = Attention(config, relative_bias=relative_bias, decoder=decoder)
        self.layer_norm = RMSNorm(config.d_model, config.layer_norm_epsilon)


class _CrossAttentionLayer(nn.Module):
    def __init__(self, config: T5Settings) -> None:
        super().__init__()
        self.EncDecAttention = Attention(config, relative_bias=False, decoder=True)
        self.layer_norm = RMSNorm(config.d_model, config.layer_norm_epsilon)


class _FeedForwardLayer(nn.Module):
    def __init__(self, config: T5Settings) -> None:
        super().__init__()
        gated = bool(getattr(config, "is_gated_act", False))
        self.DenseReluDense = DenseGatedActDense(config) if gated else DenseActDense(config)
        self.layer_norm = RMSNorm(config.d_model, config.layer_norm_epsilon)


class Block(nn.Module):
    """``layer``: self-attention, (decoder only) cross-attention, feed-forward."""

    def __init__(self, config: T5Settings, *, first: bool, decoder: bool) -> None:
        super().__init__()
        layers: list[nn.Module] = [_SelfAttentionLayer(config, relative_bias=first, decoder=decoder)]
        if decoder:
            layers.append(_CrossAttentionLayer(config))
        layers.append(_FeedForwardLayer(config))
        self.layer = nn.ModuleList(layers)


class Stack(nn.Module):
    """An encoder or decoder stack: shared embedding, blocks, final layer norm."""

    def __init__(self, config: T5Settings, embed_tokens: nn.Embedding, *, decoder: bool, layers: int) -> None:
        super().__init__()
        self.embed_tokens = embed_tokens
        self.is_decoder = decoder
        self.block = nn.ModuleList([Block(config, first=i == 0, decoder=decoder) for i in range(layers)])
        self.final_layer_norm = RMSNorm(config.d_model, config.layer_norm_epsilon)


class T5Weights(nn.Module):
    """A T5 or Visual-T5 checkpoint's weights in Hugging Face's layout (module docstring)."""

    def __init__(self, config: T5Settings, *, visual: bool = False) -> None:
        super().__init__()
        self.config = config
        self.shared = Embedding(config.vocab_size, config.d_model)
        self.encoder = Stack(config, self.shared, decoder=False, layers=config.num_layers)
        layers = config.num_decoder_layers if config.num_decoder_layers is not None else config.num_layers
        self.decoder = Stack(config, self.shared, decoder=True, layers=layers)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if visual:
            self.encoder.img_emb = nn.Linear(REGION_DIM, config.d_model)

    def get_encoder(self) -> Stack:
        return self.encoder

    def get_decoder(self) -> Stack:
        return self.decoder

    def get_input_embeddings(self) -> nn.Embedding:
        return self.shared

    @property
    def prefix_ids(self) -> tuple[int, ...]:
        """Visual-T5: the token ids placed between question slots and regions."""
        return image_prefix_ids(self.config)

    def visual_embeds(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, features: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Visual-T5's encoder input embeddings and mask (`qace.models.visual_inputs.visual_embeds`)."""
        return visual_embeds(self, input_ids, attention_mask, features)


def build_t5(
    config: T5Settings,
    weights: Mapping[str, torch.Tensor],
    *,
    visual: bool,
    device: str | torch.device,
    dtype: torch.dtype,
) -> tuple[T5Weights, list[str], list[str]]:
    """``(model, missing, unexpected)``: the modules of ``config`` holding ``weights`` (cast to ``dtype``
    on ``device``), built on the meta device so nothing is initialised twice. Tied weights (the stacks'
    embeddings, and ``lm_head`` where ``config.tie_word_embeddings``) come from ``shared.weight`` when the
    checkpoint leaves them out. ``missing`` lists weights the model needs and the checkpoint lacks (the
    model is then unusable), ``unexpected`` those it has and the model does not use."""
    with torch.device("meta"):
        model = T5Weights(config, visual=visual)
    tied = ["shared.weight", "encoder.embed_tokens.weight", "decoder.embed_tokens.weight"]
    if config.tie_word_embeddings:
        tied.append("lm_head.weight")
    source = next((name for name in tied if name in weights), None)
    expected = set(model.state_dict())
    missing = sorted(k for k in expected - set(weights) if k not in tied or source is None)
    unexpected = sorted(set(weights) - expected - IGNORED_WEIGHTS)
    if missing:
        return model, missing, unexpected
    cast = {name: weights[name].to(device=device, dtype=dtype) for name in sorted(expected & set(weights))}
    for name in tied:
        cast.setdefault(name, cast[str(source)])
    model.load_state_dict(cast, assign=True)
    # assign=True gives each module its own tensor: share the embedding (and a tied head) as transformers does
    model.encoder.embed_tokens = model.decoder.embed_tokens = model.shared
    if "lm_head.weight" in tied:  # T5 v1.0
        model.lm_head.weight = model.shared.weight
    return model.eval().requires_grad_(False), missing, unexpected
