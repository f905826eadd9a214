"""BERT and RoBERTa encoders for BERTScore in half precision, built without transformers' modelling code.

Importing transformers' modelling code costs 2-3.5 s a run (`qace.models.t5_modules` says why); on a GPU
BERTScore runs its encoder in fp16, where the documented tolerance to fp32 (about 1e-4) leaves room for
this plain forward: embeddings (word, absolute position, token type 0) and layer norm, then per layer
self-attention (``scaled_dot_product_attention`` with the padding masked), output projection, residual
layer norm, GELU feed-forward, residual layer norm. RoBERTa numbers positions from ``pad_token_id + 1``
and gives padding the pad position. Other architectures, and fp32 (bert-score's own arithmetic,
bit for bit), load transformers' ``AutoModel`` (`qace.kernels.bertscore`).

``__call__(input_ids, attention_mask)`` returns the hidden states after ``layers`` layers, the ones
BERTScore matches; layers above are never built.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

FAMILIES = ("bert", "roberta")
"""``config.model_type`` values this module builds."""
_PREFIXES = ("bert.", "roberta.")
"""Checkpoints of task heads (``RobertaForMaskedLM``, the hub's roberta-large) keep the encoder here."""


@dataclass(frozen=True)
class BertSettings:
    """The fields of a BERT or RoBERTa ``config.json`` the encoder reads (transformers' ``BertConfig``
    defaults); read by `read_settings`, since transformers' config classes import its modelling code."""

    model_type: str = "bert"
    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    position_embedding_type: str = "absolute"


def read_settings(path: Path) -> BertSettings:
    """`BertSettings` of a ``config.json``; keys it does not know are ignored."""
    raw = json.loads(Path(path).read_text())
    known = {f.name for f in fields(BertSettings)}
    return BertSettings(**{k: v for k, v in raw.items() if k in known and v is not None})


def supports(config: BertSettings) -> bool:
    """True where `BertEncoder` builds this configuration (else transformers' ``AutoModel`` runs it)."""
    return (
        config.model_type in FAMILIES
        and config.position_embedding_type == "absolute"
        and config.hidden_act == "gelu"
    )


class _Layer(nn.Module):
    def __init__(self, hidden: int, inner: int, heads: int, eps: float) -> None:
        super().__init__()
        self.heads = heads
        self.query, self.key, self.value = (nn.Linear(hidden, hidden) for _ in range(3))
        self.attention_out = nn.Linear(hidden, hidden)
        self.attention_norm = nn.LayerNorm(hidden, eps=eps)
        self.intermediate = nn.Linear(hidden, inner)
        self.out = nn.Linear(inner, hidden)
        self.out_norm = nn.LayerNorm(hidden, eps=eps)

    def forward(self, h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """One layer; ``mask`` is ``(B, 1, 1, L)``, True where a key is a real token."""
        batch, length, _ = h.shape
        q, k, v = (
            proj(h).view(batch, length, self.heads, -1).transpose(1, 2)
            for proj in (self.query, self.key, self.value)
        )
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).reshape(batch, length, -1)
        h = self.attention_norm(self.attention_out(a) + h)
        return self.out_norm(self.out(F.gelu(self.intermediate(h))) + h)


_LAYER_NAMES = {
    "attention.self.query": "query",
    "attention.self.key": "key",
    "attention.self.value": "value",
    "attention.output.dense": "attention_out",
    "attention.output.LayerNorm": "attention_norm",
    "intermediate.dense": "intermediate",
    "output.dense": "out",
    "output.LayerNorm": "out_norm",
}
"""transformers' weight names inside ``encoder.layer.<i>.`` -> this module's."""


class BertEncoder(nn.Module):
    """The first ``layers`` layers of a BERT or RoBERTa checkpoint (module docstring)."""

    def __init__(self, config: BertSettings, layers: int) -> None:
        super().__init__()
        if not supports(config):
            raise ValueError(f"BertEncoder does not build {config} (see `supports`)")
        self.config = config
        hidden, eps = config.hidden_size, config.layer_norm_eps
        # tables, not nn.Embedding: its random initialisation on the meta device imports torch._dynamo
        self.word_embeddings = nn.Parameter(torch.empty(config.vocab_size, hidden))
        self.position_embeddings = nn.Parameter(torch.empty(config.max_position_embeddings, hidden))
        self.token_type_embeddings = nn.Parameter(torch.empty(config.type_vocab_size, hidden))
        self.embeddings_norm = nn.LayerNorm(hidden, eps=eps)
        self.layer = nn.ModuleList(
            _Layer(hidden, config.intermediate_size, config.num_attention_heads, eps) for _ in range(layers)
        )
        self.roberta = config.model_type == "roberta"
        self.pad_id = int(config.pad_token_id)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """``(B, L, hidden)`` states after the built layers; padded positions are computed and ignored."""
        if self.roberta:
            kept = input_ids.ne(self.pad_id).int()
            positions = (torch.cumsum(kept, dim=1) * kept).long() + self.pad_id
        else:
            positions = torch.arange(input_ids.shape[1], device=input_ids.device)[None, :]
        h = F.embedding(input_ids, self.word_embeddings) + self.token_type_embeddings[0]
        h = self.embeddings_norm(h + F.embedding(positions, self.position_embeddings))
        mask = attention_mask.bool()[:, None, None, :]
        for layer in self.layer:
            h = layer(h, mask)
        return h


def build_bert(
    config: BertSettings,
    weights: Mapping[str, torch.Tensor],
    layers: int,
    *,
    device: torch.device,
    dtype: torch.dtype,
) -> BertEncoder:
    """The encoder of ``config`` with the first ``layers`` layers of ``weights`` (transformers' names,
    with or without a ``bert.``/``roberta.`` prefix), in ``dtype`` on ``device``; a weight it needs and
    the checkpoint lacks is a ``KeyError`` naming it."""
    with torch.device("meta"):
        model = BertEncoder(config, layers)
    names = {_ours(name): name for name in weights if _ours(name) is not None}
    state = {}
    for name in model.state_dict():
        if name not in names:
            raise KeyError(f"BERTScore encoder checkpoint lacks weight {name!r}")
        state[name] = weights[names[name]].to(device=device, dtype=dtype)
    model.load_state_dict(state, assign=True)
    return model.eval().requires_grad_(False)


def _ours(name: str) -> str | None:
    """transformers' weight name -> this module's (None: not used here, e.g. the pooler or a head)."""
    for prefix in _PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix) :]
    if name.startswith("embeddings."):
        rest = name[len("embeddings.") :]
        if rest.startswith("LayerNorm."):
            return "embeddings_norm." + rest[len("LayerNorm.") :]
        return rest.removesuffix(".weight")  # the tables
    if not name.startswith("encoder.layer."):
        return None
    index, _, rest = name[len("encoder.layer.") :].partition(".")
    module, _, param = rest.rpartition(".")
    return f"layer.{index}.{_LAYER_NAMES[module]}.{param}" if module in _LAYER_NAMES else None
