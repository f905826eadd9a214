"""A CLIP model for CLIP-S and PAC-S: loading, image and text embeddings, and the per-image cache.

Any Transformers ``CLIPModel`` checkpoint (a hub id or a local directory holding ``config.json``, the
tokenizer and ``preprocessor_config.json``) loads offline-first like the other judges' models.

- **Images** are decoded, resized and centre-cropped by the checkpoint's image processor (its Pillow
  implementation, the same pixels on every machine) into uint8 arrays, in ``workers`` processes when
  ``workers > 0``; rescaling and normalisation run on the model's device. Each image is embedded once
  per `ClipEncoder`: an LRU cache by file path keeps its unit embedding (or the reason it could not be
  read), and every scorer sharing the encoder (`shared_encoder`) reads it.
- **Texts** are tokenised (truncated to the model's 77 positions; `embed_texts` says which were cut),
  de-duplicated, sorted by length and embedded in batches of ``text_batch`` rows, each padded to its
  longest text.
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

from qace.errors import InputError
from qace.judges.images import load_image
from qace.judges.regen_loading import _load_offline_first, tree_fingerprint
from qace.precision import torch_dtype

log = logging.getLogger(__name__)

FIX = (
    "pass --clip-model with a hub id you have cached or a local CLIPModel directory (config.json, "
    "tokenizer files, preprocessor_config.json), or build the tiny test model with "
    "qace.testing.clip.make_clip_test_model (its scores mean nothing)"
)


def pil_image_processor(source: str, local_only: bool) -> Any:
    """The checkpoint's CLIP image processor, Pillow implementation (transformers 5 names it
    ``CLIPImageProcessorPil``; before, ``CLIPImageProcessor`` was the Pillow one)."""
    import transformers

    cls = getattr(transformers, "CLIPImageProcessorPil", None) or transformers.CLIPImageProcessor
    return cls.from_pretrained(source, local_files_only=local_only)


def decode(processor: Any, path: str) -> np.ndarray | str:
    """The uint8 ``(3, H, W)`` resized, centre-cropped pixels of ``path``, or why it cannot be read."""
    try:
        image = load_image(path)
    except InputError as exc:
        return exc.reason if hasattr(exc, "reason") else str(exc)
    pixels = processor(images=image, do_rescale=False, do_normalize=False, return_tensors="np")
    return np.ascontiguousarray(pixels["pixel_values"][0], dtype=np.uint8)


_WORKER_PROCESSOR: Any = None


def _init_worker(processor: Any) -> None:
    global _WORKER_PROCESSOR
    _WORKER_PROCESSOR = processor
    torch.set_num_threads(1)


def _decode_in_worker(path: str) -> np.ndarray | str:
    return decode(_WORKER_PROCESSOR, path)


class ClipEncoder:
    """A loaded CLIP model with its tokenizer, image processor and image-embedding cache."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        processor: Any,
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
        self.processor = processor
        self.name = name
        self.fingerprint = fingerprint
        self.max_tokens = int(model.config.text_config.max_position_embeddings)
        self.workers = workers
        self.cache_size = cache_size
        self.embedded = 0
        """Images embedded so far (each path at most once while it stays in the cache)."""
        self._images: OrderedDict[str, torch.Tensor | str] = OrderedDict()
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()
        mean = torch.tensor(processor.image_mean, dtype=torch.float32).view(1, -1, 1, 1)
        std = torch.tensor(processor.image_std, dtype=torch.float32).view(1, -1, 1, 1)
        self._mean, self._std = mean.to(self.device), std.to(self.device)
        self._rescale = float(processor.rescale_factor)

    @classmethod
    def load(cls, name_or_path: str, **settings: Any) -> ClipEncoder:
        """Load a ``CLIPModel`` checkpoint (hub id or directory), offline-first."""

        def load(source: str, local_only: bool) -> tuple[Any, Any, Any]:
            from transformers import AutoTokenizer, CLIPModel

            model = CLIPModel.from_pretrained(source, local_files_only=local_only)
            tokenizer = AutoTokenizer.from_pretrained(source, local_files_only=local_only)
            return model, tokenizer, pil_image_processor(source, local_only)

        model, tokenizer, processor = _load_offline_first(
            name_or_path, "CLIP model", "config.json", load, FIX
        )
        fingerprint = tree_fingerprint(name_or_path)
        commit = getattr(model.config, "_commit_hash", None)
        if fingerprint == str(name_or_path) and commit:  # a hub id: name the exact revision
            fingerprint = f"{name_or_path}@{commit[:12]}"
        return cls(model, tokenizer, processor, name=str(name_or_path), fingerprint=fingerprint, **settings)

    # -- images ----------------------------------------------------------------------------------

    def image_embeddings(self, paths: Sequence[str], batch_size: int = 64) -> dict[str, torch.Tensor | str]:
        """Unit float32 embedding (on the device), or the reason it failed, per distinct path; each file
        is decoded and embedded once while it stays in the cache."""
        with self._lock:
            found: dict[str, torch.Tensor | str] = {}
            todo = []
            for path in dict.fromkeys(paths):
                cached = self._images.get(path)
                if cached is None:
                    todo.append(path)
                else:
                    self._images.move_to_end(path)
                    found[path] = cached
            for start in range(0, len(todo), batch_size):
                batch = todo[start : start + batch_size]
                decoded = self._decode(batch)
                good = [(p, a) for p, a in zip(batch, decoded, strict=True) if isinstance(a, np.ndarray)]
                for path, reason in zip(batch, decoded, strict=True):
                    if isinstance(reason, str):
                        found[path] = reason
                        self._remember(path, reason)
                if good:
                    pixels = torch.from_numpy(np.stack([a for _, a in good]))
                    embeddings = self.embed_pixels(pixels)
                    for (path, _), embedding in zip(good, embeddings, strict=True):
                        found[path] = embedding
                        self._remember(path, embedding)
                    self.embedded += len(good)
            return found

    def _decode(self, paths: Sequence[str]) -> list[np.ndarray | str]:
        if self.workers < 1:
            return [decode(self.processor, p) for p in paths]
        if self._pool is None:
            import multiprocessing

            context = multiprocessing.get_context("spawn")  # no fork of a process holding CUDA or threads
            self._pool = ProcessPoolExecutor(
                self.workers, mp_context=context, initializer=_init_worker, initargs=(self.processor,)
            )
        return list(self._pool.map(_decode_in_worker, paths, chunksize=max(1, len(paths) // self.workers)))

    @torch.inference_mode()
    def embed_pixels(self, pixels: torch.Tensor) -> torch.Tensor:
        """Unit float32 embeddings of uint8 ``(N, 3, H, W)`` processed images (rescaled and normalised
        here, on the device)."""
        x = pixels.to(self.device, non_blocking=True).float() * self._rescale
        x = ((x - self._mean) / self._std).to(self.dtype)
        pooled = self.model.vision_model(pixel_values=x).pooler_output
        return F.normalize(self.model.visual_projection(pooled).float(), dim=-1)

    def _remember(self, path: str, value: torch.Tensor | str) -> None:
        self._images[path] = value
        while len(self._images) > self.cache_size:
            self._images.popitem(last=False)

    # -- texts -----------------------------------------------------------------------------------

    def tokenize(self, texts: Sequence[str]) -> tuple[list[list[int]], list[bool]]:
        """Token ids of each text, cut to the model's positions (end token kept), and whether it was cut."""
        ids = self.tokenizer(list(texts), add_special_tokens=True, truncation=False)["input_ids"]
        end = self.tokenizer.eos_token_id
        cut = [len(row) > self.max_tokens for row in ids]
        return [
            row[: self.max_tokens - 1] + [end] if c else row for row, c in zip(ids, cut, strict=True)
        ], cut

    @torch.inference_mode()
    def embed_texts(self, texts: Sequence[str], batch_size: int = 1024) -> tuple[torch.Tensor, list[bool]]:
        """Unit float32 embeddings (on the device) of ``texts`` in order, and whether each was truncated.

        Distinct texts are embedded once, longest first, ``batch_size`` rows a batch padded to its
        longest (CLIP's text encoder is causal and pools at the end token, so padding changes nothing)."""
        unique = list(dict.fromkeys(texts))
        ids, cut = self.tokenize(unique)
        order = sorted(range(len(unique)), key=lambda i: -len(ids[i]))
        pad = int(self.model.config.text_config.pad_token_id or 0)
        out = torch.empty(len(unique), self.model.config.projection_dim, device=self.device)
        for start in range(0, len(order), batch_size):
            rows = order[start : start + batch_size]
            width = len(ids[rows[0]])
            batch = torch.full((len(rows), width), pad, dtype=torch.long)
            mask = torch.zeros((len(rows), width), dtype=torch.long)
            for n, i in enumerate(rows):
                batch[n, : len(ids[i])] = torch.tensor(ids[i])
                mask[n, : len(ids[i])] = 1
            text = self.model.text_model(input_ids=batch.to(self.device), attention_mask=mask.to(self.device))
            features = self.model.text_projection(text.pooler_output).float()
            out[torch.tensor(rows, device=self.device)] = F.normalize(features, dim=-1)
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
