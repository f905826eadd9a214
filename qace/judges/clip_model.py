"""A CLIP model for CLIP-S and PAC-S: loading, image and text embeddings, and the per-image cache.

Any Transformers ``CLIPModel`` checkpoint (a hub id or a local directory holding ``config.json``, the
tokenizer and ``preprocessor_config.json``) loads offline-first like the other judges' models.

- **Images** are decoded, resized and centre-cropped as the checkpoint's image processor says
  (`qace.judges.clip_images`: Pillow, as Transformers' Pillow processor does, the same pixels on every
  machine) into uint8 arrays, in ``workers`` processes when ``workers > 0``; rescaling and
  normalisation run on the model's device. Each image is embedded once
  per `ClipEncoder` and image batch size: an LRU cache by file path and batch size keeps its unit
  embedding (or the reason it could not be read), and every scorer sharing the encoder
  (`shared_encoder`) with that batch size reads it. The batch size is part of the key because it changes
  an embedding's last bits where the matrix kernels depend on the batch's rows (MKL on an AVX-512 AMD
  host did): a scorer's scores must not depend on what another one embedded first.
- **Texts** are tokenised (truncated to the model's 77 positions; `embed_texts` says which were cut),
  de-duplicated, grouped by length and embedded in batches of ``text_batch`` rows.
- **Fixed shapes**: every batch has a shape that depends only on its members' own lengths, so an
  embedding is the same bits whatever else shares its batch (resumed runs and ``--gpus`` shards write
  what one run writes).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from qace.judges.clip_images import ClipPixels
from qace.judges.regen_loading import _load_offline_first, tree_fingerprint
from qace.precision import torch_dtype

log = logging.getLogger(__name__)

WIDTH_STEP = 8
"""Text batches are padded to a multiple of this many tokens (see `ClipEncoder.embed_texts`)."""

FIX = (
    "pass --clip-model with a hub id you have cached or a local CLIPModel directory (config.json, "
    "tokenizer files, preprocessor_config.json), or build the tiny test model with "
    "qace.testing.clip.make_clip_test_model (its scores mean nothing)"
)


class ClipEncoder:
    """A loaded CLIP model with its tokenizer, image processor and image-embedding cache."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        pixels: ClipPixels,
        *,
        name: str,
        fingerprint: str,
        device: str = "cpu",
        precision: str = "fp32",
        workers: int = 0,
        cache_size: int = 200_000,
    ) -> None:
        self.dtype = torch_dtype(precision, what="CLIP precision")
        self.device = torch.device(device)
        self.model = model.to(device=self.device, dtype=self.dtype).eval()
        self.tokenizer = tokenizer
        tokenizer.model_max_length = 1 << 30  # `tokenize` cuts to the model's positions itself (no warning)
        self.pixels = pixels
        self.name = name
        self.fingerprint = fingerprint
        self.max_tokens = int(model.config.text_config.max_position_embeddings)
        self.workers = workers
        self.cache_size = cache_size
        self.embedded = 0
        """Images embedded so far (each path at most once while it stays in the cache)."""
        self._images: OrderedDict[tuple[str, int], torch.Tensor | str] = OrderedDict()
        """``(path, image batch size)`` -> unit embedding, or why the file could not be read."""
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()
        mean = torch.tensor(pixels.mean, dtype=torch.float32).view(1, -1, 1, 1)
        std = torch.tensor(pixels.std, dtype=torch.float32).view(1, -1, 1, 1)
        self._mean, self._std = mean.to(self.device), std.to(self.device)

    @classmethod
    def load(cls, name_or_path: str, **settings: Any) -> ClipEncoder:
        """Load a ``CLIPModel`` checkpoint (hub id or directory), offline-first."""

        def load(source: str, local_only: bool) -> tuple[Any, Any, ClipPixels]:
            from transformers import AutoTokenizer, CLIPModel, ImageProcessingMixin

            model = CLIPModel.from_pretrained(source, local_files_only=local_only)
            tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=local_only)
            config, _ = ImageProcessingMixin.get_image_processor_dict(source, local_files_only=local_only)
            return model, tokenizer, ClipPixels.from_config(config)

        model, tokenizer, pixels = _load_offline_first(name_or_path, "CLIP model", "config.json", load, FIX)
        fingerprint = tree_fingerprint(name_or_path)
        commit = getattr(model.config, "_commit_hash", None)
        if fingerprint == str(name_or_path) and commit:  # a hub id: name the exact revision
            fingerprint = f"{name_or_path}@{commit[:12]}"
        return cls(model, tokenizer, pixels, name=str(name_or_path), fingerprint=fingerprint, **settings)

    # -- images ----------------------------------------------------------------------------------

    def image_embeddings(self, paths: Sequence[str], batch_size: int = 64) -> dict[str, torch.Tensor | str]:
        """Unit float32 embedding (on the device), or the reason it failed, per distinct path; each file
        is decoded and embedded once per ``batch_size`` while it stays in the cache, in a batch of always
        ``batch_size`` images (filled up with black ones), so its embedding does not depend on its
        companions."""
        with self._lock:
            found: dict[str, torch.Tensor | str] = {}
            todo = []
            for path in dict.fromkeys(paths):
                cached = self._images.get((path, batch_size))
                if cached is None:
                    todo.append(path)
                else:
                    self._images.move_to_end((path, batch_size))
                    found[path] = cached
            for start in range(0, len(todo), batch_size):
                batch = todo[start : start + batch_size]
                decoded = self._decode(batch)
                good = [(p, a) for p, a in zip(batch, decoded, strict=True) if isinstance(a, np.ndarray)]
                for path, reason in zip(batch, decoded, strict=True):
                    if isinstance(reason, str):
                        found[path] = reason
                        self._remember((path, batch_size), reason)
                if good:
                    pixels = np.zeros((batch_size, *good[0][1].shape), dtype=np.uint8)  # fixed shape
                    pixels[: len(good)] = np.stack([a for _, a in good])
                    embeddings = self.embed_pixels(torch.from_numpy(pixels))[: len(good)]
                    for (path, _), embedding in zip(good, embeddings, strict=True):
                        found[path] = embedding
                        self._remember((path, batch_size), embedding)
                    self.embedded += len(good)
            return found

    def forget_images(self) -> None:
        """Empty the image-embedding cache (benchmarks time the embedding pass cold)."""
        with self._lock:
            self._images.clear()

    def _decode(self, paths: Sequence[str]) -> list[np.ndarray | str]:
        if self.workers < 1:
            return [self.pixels(p) for p in paths]
        if self._pool is None:
            import multiprocessing

            context = multiprocessing.get_context("spawn")  # no fork of a process holding CUDA or threads
            self._pool = ProcessPoolExecutor(self.workers, mp_context=context)
        return list(self._pool.map(self.pixels, paths, chunksize=max(1, len(paths) // self.workers)))

    @torch.inference_mode()
    def embed_pixels(self, pixels: torch.Tensor) -> torch.Tensor:
        """Unit float32 embeddings of uint8 ``(N, 3, H, W)`` processed images (rescaled and normalised
        here, on the device)."""
        x = pixels.to(self.device, non_blocking=True).float() * self.pixels.rescale
        x = ((x - self._mean) / self._std).to(self.dtype)
        pooled = self.model.vision_model(pixel_values=x).pooler_output
        return F.normalize(self.model.visual_projection(pooled).float(), dim=-1)

    def _remember(self, key: tuple[str, int], value: torch.Tensor | str) -> None:
        self._images[key] = value
        while len(self._images) > self.cache_size:
            self._images.popitem(last=False)

    # -- texts -----------------------------------------------------------------------------------

    def tokenize(self, texts: Sequence[str]) -> tuple[list[list[int]], list[bool]]:
        """Token ids of each text, cut to the model's positions (end token kept), and whether it was cut."""
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is not None:  # the Rust tokenizer directly: a third of the cost of the wrapper's call
            backend.no_truncation()
            backend.no_padding()
            ids = [e.ids for e in backend.encode_batch_fast(list(texts), add_special_tokens=True)]
        else:
            ids = self.tokenizer(list(texts), add_special_tokens=True, truncation=False)["input_ids"]
        end = self.tokenizer.eos_token_id
        cut = [len(row) > self.max_tokens for row in ids]
        return [
            row[: self.max_tokens - 1] + [end] if c else row for row, c in zip(ids, cut, strict=True)
        ], cut

    @torch.inference_mode()
    def embed_texts(self, texts: Sequence[str], batch_size: int = 256) -> tuple[torch.Tensor, list[bool]]:
        """Unit float32 embeddings (on the device) of ``texts`` in order, and whether each was truncated.

        Distinct texts are embedded once. A text's batch has a shape that depends on the text alone: its
        length rounded up to a multiple of `WIDTH_STEP` tokens (at most the model's positions), and
        always ``batch_size`` rows (filled up with padding rows), so its embedding is the same bits
        whichever texts share the batch: a resumed run or a ``--gpus`` shard writes what one run
        writes. CLIP's text encoder is causal and pools at the end token, so the padding changes
        nothing but the float rounding."""
        unique = list(dict.fromkeys(texts))
        ids, cut = self.tokenize(unique)
        pad = int(self.model.config.text_config.pad_token_id or 0)
        out = torch.empty(len(unique), self.model.config.projection_dim, device=self.device)
        buckets: dict[int, list[int]] = {}
        for i, row in enumerate(ids):
            buckets.setdefault(min(-(-len(row) // WIDTH_STEP) * WIDTH_STEP, self.max_tokens), []).append(i)
        for width, members in sorted(buckets.items()):
            for start in range(0, len(members), batch_size):
                rows = members[start : start + batch_size]
                batch = np.full((batch_size, width), pad, dtype=np.int64)
                mask = np.zeros((batch_size, width), dtype=np.int64)
                mask[:, 0] = 1  # padding rows attend to one token
                for n, i in enumerate(rows):
                    batch[n, : len(ids[i])] = ids[i]
                    mask[n, : len(ids[i])] = 1
                text = self.model.text_model(
                    input_ids=torch.from_numpy(batch).to(self.device, non_blocking=True),
                    attention_mask=torch.from_numpy(mask).to(self.device, non_blocking=True),
                )
                features = F.normalize(self.model.text_projection(text.pooler_output).float(), dim=-1)
                out[torch.tensor(rows, device=self.device)] = features[: len(rows)]
        where = {text: n for n, text in enumerate(unique)}
        index = torch.tensor([where[t] for t in texts], dtype=torch.long, device=self.device)
        return out[index], [cut[where[t]] for t in texts]

    def close(self) -> None:
        """Stop the decoding workers (if any)."""
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None


_SHARED: dict[tuple[str, str, str, int], ClipEncoder] = {}
_SHARED_LOCK = threading.Lock()


def shared_encoder(name_or_path: str, *, device: str, precision: str, workers: int) -> ClipEncoder:
    """The process's `ClipEncoder` for this checkpoint, device and precision, loaded on first use: the
    scorers of one run (``--metric clip-s,refclip-s``) share its model and image embeddings."""
    key = (str(name_or_path), device, precision, workers)
    with _SHARED_LOCK:
        encoder = _SHARED.get(key)
        if encoder is None:
            encoder = _SHARED[key] = ClipEncoder.load(
                name_or_path, device=device, precision=precision, workers=workers
            )
        return encoder
