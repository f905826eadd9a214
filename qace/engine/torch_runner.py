"""PyTorch runner: a model family's encoder once per batch, then its greedy decoder (`engine.seq2seq`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Generic, TypeVar

import numpy as np
import torch

from qace.engine import instrument
from qace.engine.batches import Generated, TextBatch, VisualBatch, cut_at_eos
from qace.engine.device_features import DeviceFeatureCache
from qace.engine.device_lock import bound_device, current
from qace.engine.instrument import StageTimer
from qace.engine.pinned_upload import to_device
from qace.engine.seq2seq import Seq2SeqParts

K = TypeVar("K")


class TorchRunner:
    """Runs one encoder-decoder model on batches planned by the scheduler, with the encoder and decoder
    its family built (`qace.families.torch_runner` makes one from a loaded model)."""

    def __init__(self, model: Any, parts: Seq2SeqParts, *, device: str = "cpu") -> None:
        self.model = model
        self.device = bound_device(device)
        self.encoder = parts.encoder
        self.decoder = parts.decoder
        self.features: DeviceFeatureCache | None = None
        """Visual-T5 only: region features of hot images, kept on the device across chunks."""
        self.stats = {"sequences": 0, "encoder_tokens": 0}
        """Rows and padded encoder positions run so far (benchmarks read them; encoder and decoder times
        come through `qace.engine.instrument`'s ``profile``)."""
        self._side: torch.cuda.Stream | None = None
        """CUDA only: the stream `generate_jobs` runs this model's encoders on."""

    def feature_rows(
        self, image_ids: Sequence[str], load: Callable[[str], np.ndarray]
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Device-resident features of ``image_ids`` (see `DeviceFeatureCache.rows`)."""
        if self.features is None:
            dtype = self.encoder.feature_dtype
            if dtype is None:
                raise TypeError(f"{type(self.model).__name__} reads no region features")
            # on the CPU the slab only saves the per-chunk stacking, so it stays small (host RAM)
            capacity = 8192 if self.device.type == "cuda" else 512
            self.features = DeviceFeatureCache(self.device, dtype, capacity)
        return self.features.rows(image_ids, load)

    def _clock(self, profile: StageTimer | None) -> float:
        if profile is not None and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    @torch.inference_mode()
    def encode(self, batch: TextBatch | VisualBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Encoder hidden states and the attention mask the decoder's cross-attention needs."""
        ids = torch.from_numpy(batch.input_ids).to(self.device, non_blocking=True)
        mask = torch.from_numpy(batch.attention_mask).to(self.device, non_blocking=True)
        features = None
        if isinstance(batch, VisualBatch):
            features = torch.as_tensor(batch.features, device=self.device)
        kept = int(batch.attention_mask.sum(axis=1).max(initial=0))
        return self.encoder(ids, mask, features, kept=kept)

    def generate(
        self, batch: TextBatch | VisualBatch, *, max_new_tokens: int, unanswerable_id: int | None = None
    ) -> Generated:
        """Greedy-decode every row of ``batch``, with this runner's device current."""
        with current(self.device):
            start = self._clock(instrument.of(self).profile)
            hidden, mask = self.encode(batch)
            return self._decode(batch, hidden, mask, start, max_new_tokens, unanswerable_id).result()

    def warm_up(
        self,
        shapes: Iterable[tuple[int, int]],
        *,
        max_new_tokens: int,
        unanswerable_id: int | None = None,
        progress: Callable[[int], object] | None = None,
    ) -> int:
        """Prepare now what the encoder and the decoder would prepare on first sight of a batch (the
        encoder's product shapes, `Encoder.warm_up`; the decoder's CUDA graphs, `Decoder.warm_up`) for
        batches of up to ``rows`` rows padded to ``length``, for each ``(rows, length)`` of ``shapes``, so
        that no later call pays for it; returns how many decoder batch shapes were new (0 on the CPU)."""
        shapes = list(shapes)
        with current(self.device):
            self.encoder.warm_up(max((rows * length for rows, length in shapes), default=0))
            return self.decoder.warm_up(
                shapes,
                device=self.device,
                steps=max_new_tokens,
                forcing=instrument.of(self).force_tokens is not None,
                unanswerable_id=unanswerable_id,
                progress=progress,
            )

    @staticmethod
    def generate_jobs(
        jobs: Iterable[tuple[TorchRunner, K, TextBatch | VisualBatch, int | None]], *, max_new_tokens: int
    ) -> Iterator[tuple[K, Generated]]:
        """`generate` of every ``(runner, key, batch, unanswerable_id)`` job, in order, yielding ``(key,
        Generated)``; on CUDA each job's encoder runs on a side stream while the previous job decodes.

        A decoding step is a short graph replay followed by a wait for the host to see whether every
        row has ended; between steps, and while the host fetches the next batch, the GPU idled. The
        next batch's encoder (matrix products) now fills those gaps beside the decoder's memory-bound
        steps, also when the next batch belongs to another model (the engine streams a call's answers
        on the caption and on the image as one stream of jobs). The host's work between batches runs
        while the device has work: a job's result (its outputs turned into lists) is made and yielded
        while the next job's encoder runs, before that job decodes; the job after is fetched and its
        encoder queued (`_Between`) once the current batch's first step is queued. So a job's result
        is yielded before the job two after it is fetched (`qace.engine.engine.Runner`: a stage may be
        built from an earlier stage's outputs). The results are the same: each batch runs the same
        kernels, in the same order on its own data. Profiled runners (``profile``) keep the stages
        apart to time them.
        """
        it = iter(jobs)
        upcoming = next(it, None)
        if upcoming is None:
            return
        first = upcoming[0]
        if first.device.type != "cuda" or instrument.of(first).profile is not None:
            while upcoming is not None:
                runner, key, batch, unanswerable_id = upcoming
                yield (
                    key,
                    runner.generate(batch, max_new_tokens=max_new_tokens, unanswerable_id=unanswerable_id),
                )
                upcoming = next(it, None)
            return
        main = torch.cuda.current_stream(first.device)
        job: _Job[K] | None = upcoming
        encoded = first._encode_aside(upcoming[2], main, max_new_tokens)
        behind: tuple[K, _Outputs] | None = None  # the job before: copied to the host, not yet lists
        while job is not None:
            runner, key, batch, unanswerable_id = job
            hidden, mask, forced, ready = encoded
            main.wait_event(ready)
            if behind is not None:  # while this job's encoder runs
                yield behind[0], behind[1].result()
            between = _Between(it, main, max_new_tokens)
            outputs = runner._decode(
                batch, hidden, mask, 0.0, max_new_tokens, unanswerable_id, between, forced
            )
            between()  # nothing where the decoder called it
            behind = key, outputs
            job, encoded = between.upcoming, between.encoded
        if behind is not None:
            yield behind[0], behind[1].result()

    def _encode_aside(
        self, batch: TextBatch | VisualBatch, main: torch.cuda.Stream, max_new_tokens: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.cuda.Event]:
        """Queue ``batch``'s encoder on this runner's side stream, after what ``main`` has queued so far
        (a visual batch's features are gathered there), and a benchmark's forced outputs (`_forced`)
        with it; its outputs are marked as used on ``main``."""
        if self._side is None:
            self._side = torch.cuda.Stream(self.device)
        self._side.wait_stream(main)
        with torch.cuda.stream(self._side):
            hidden, mask = self.encode(batch)
            forced = self._forced(batch, max_new_tokens)
            ready = self._side.record_event()
        for tensor in (hidden, mask) if forced is None else (hidden, mask, forced):
            tensor.record_stream(main)
        return hidden, mask, forced, ready

    def _forced(self, batch: TextBatch | VisualBatch, max_new_tokens: int) -> torch.Tensor | None:
        """A benchmark's forced outputs of ``batch`` on the device (`qace.engine.instrument`'s
        ``force_tokens``), or None. Streamed jobs make them while the batch before decodes, as they
        build its inputs: a real run chooses its tokens on the device, so they cost its host nothing."""
        force = instrument.of(self).force_tokens
        if force is None:
            return None
        return to_device(np.asarray(force(batch, max_new_tokens), dtype=np.int64), self.device)

    def _decode(
        self,
        batch: TextBatch | VisualBatch,
        hidden: torch.Tensor,
        mask: torch.Tensor,
        start: float,
        max_new_tokens: int,
        unanswerable_id: int | None,
        meanwhile: Callable[[], object] | None = None,
        forced: torch.Tensor | None = None,
    ) -> _Outputs:
        """Decode ``batch`` from its encoder's outputs; ``forced``: its `_forced` outputs, made already
        (else made here)."""
        hooks = instrument.of(self)
        encoded = self._clock(hooks.profile)
        if forced is None:
            forced = self._forced(batch, max_new_tokens)
        tokens, answerability = self.decoder.generate(
            hidden,
            mask,
            max_new_tokens=max_new_tokens,
            unanswerable_id=unanswerable_id,
            forced=forced,
            meanwhile=meanwhile,
        )
        if hooks.profile is not None:
            hooks.profile.seconds["encoder"] += encoded - start
            hooks.profile.seconds["decoder"] += self._clock(hooks.profile) - encoded
        self.stats["sequences"] += mask.shape[0]
        self.stats["encoder_tokens"] += mask.numel()
        return _Outputs(tokens, answerability, self.decoder.eos_id)


_Job = tuple[TorchRunner, K, TextBatch | VisualBatch, int | None]


class _Between(Generic[K]):
    """The host's work between two batches of `TorchRunner.generate_jobs`, done once the current
    batch's first step is queued (the decoder's ``meanwhile``), so the device has work meanwhile: the
    next job fetched (a visual batch's features gathered, a stage built) and its encoder queued on its
    side stream."""

    def __init__(self, jobs: Iterator[_Job[K]], main: torch.cuda.Stream, max_new_tokens: int):
        self.jobs, self.main, self.max_new_tokens = jobs, main, max_new_tokens
        self.upcoming: _Job[K] | None = None
        self.encoded: Any = None
        self.done = False

    def __call__(self) -> None:
        if self.done:
            return
        self.done = True
        self.upcoming = next(self.jobs, None)
        if self.upcoming is not None:
            self.encoded = self.upcoming[0]._encode_aside(self.upcoming[2], self.main, self.max_new_tokens)


class _Outputs:
    """A batch's decoder outputs on their way to the host: the copies are queued on the current stream
    (into pinned memory on CUDA, so they do not hold the host), and `result` waits for them and turns
    them into a `Generated`. `TorchRunner.generate_jobs` calls it while the next batch's encoder runs."""

    def __init__(self, tokens: torch.Tensor, answerability: torch.Tensor | None, eos_id: int) -> None:
        self.eos_id = eos_id
        self.tokens = tokens.to("cpu", non_blocking=True)
        self.answerability = (
            None if answerability is None else answerability.double().to("cpu", non_blocking=True)
        )
        self.copied: torch.cuda.Event | None = None
        if tokens.is_cuda:
            self.copied = torch.cuda.Event()  # on the copy's device, which need not be the current one
            self.copied.record(torch.cuda.current_stream(tokens.device))

    def result(self) -> Generated:
        if self.copied is not None:
            self.copied.synchronize()
        return Generated(
            tokens=cut_at_eos(self.tokens.numpy(), self.eos_id),
            answerability=None if self.answerability is None else self.answerability.numpy(),
        )
