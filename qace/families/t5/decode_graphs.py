"""CUDA-graph decoding: each decoder step is one graph replay instead of hundreds of kernel launches.

At the batch sizes the scheduler builds, a T5 decoder step is a few milliseconds of kernel launches and
far less of GPU work: the loop is bound by the CPU. `StaticT5Decoder.step` has shapes that do not depend
on the position, so it is captured once per batch shape and replayed at every step (vLLM and
CTranslate2 do the same for their decode steps). What that takes:

- batch shapes are bucketed (rows to a power of two or 3/4 of one, encoder length to a multiple of
  16) so a run needs a handful of graphs; the extra rows start as ended and their outputs are dropped,
  the extra encoder positions are masked;
- all buffers the graphs read and write live in flat storage allocated once for the most rows and the
  most encoder tokens (rows x length) of any bucket seen, viewed contiguously at each bucket's shape,
  so a batch of many short inputs and one of few long ones share it (the scheduler's token budget
  bounds both); the graphs share one memory pool and one capture stream, so a graph reuses the
  intermediates of those captured before it (they never run at once);
- rows are not dropped as they end (a graph's shapes are fixed), but the step's attention reads no
  cache for a row that has ended or pads the bucket (the ended flags are passed to it): the caches are
  most of a step's memory traffic; the loop stops as soon as every row has ended;
- self-attention reads only a window of the cache that covers the positions written so far (8, then
  16, then all): a bucket has one graph per window, so the first steps, and all of a three-token
  answer, do not read the empty rest of a 31-position cache (2.3 GB a step for 2,048 T5-base rows);
- the step's position, the tokens fed back, the ended flags and the outputs are device tensors the
  graph updates itself, so the host only replays and reads once a step how many rows have not ended;
- that read need not hold the next step back: the count is copied to pinned memory behind each step,
  and while rows end slowly (`queue_ahead`) the next step is queued before the current one's count
  arrives, the host waiting on the step before, so the GPU has a step queued. Near the end the host
  waits for each step's count. A step queued after every row has ended changes nothing (ended rows
  write ``-1``, which the outputs already hold), so the outputs never depend on this; it costs a step
  only when the rows left all end at once;
- a QA model's first step has a graph of its own that also writes the answerability of its logits to a
  static buffer, so no graph keeps its logits (a 2,048-row bucket's are 263 MB) and any number of
  buckets can be captured;
- captures skip `torch.cuda.graph`'s emptying of the allocator's cache: inside a reward call that
  emptying sent the call's next allocations back to `cudaMalloc`;
- `GraphedDecoding.prepare` captures every bucket up to given sizes at once (a server's warm-up), so
  calls never capture, and replays each new graph once with every row ended: a graph's first replay
  cost the host about 0.25 ms (its upload to the device) against about 0.02 ms later
  (`benchmarks.step_replay`'s ``first_replays``), which a call would otherwise pay for each graph it
  is the first to replay.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from qace.families.t5.decode_attention import fused_available


class StepDecoder(Protocol):
    """What graphed decoding needs of a decoder: its shapes, caches, biases and one position-free step.
    `qace.families.t5.decoder.StaticT5Decoder` is one; this module never imports it (the decoder
    imports this one), so the two do not import each other."""

    layers: list[Any]
    heads: int
    d_kv: int
    start_id: int
    eos_id: int
    row_steps: int

    def cross_views(self, buffer: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]: ...

    def warm_products(self, out: torch.Tensor) -> int: ...

    def cross_cache(
        self, hidden: torch.Tensor, out: torch.Tensor | None = None
    ) -> list[tuple[torch.Tensor, torch.Tensor]]: ...

    @staticmethod
    def cross_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor: ...

    def self_bias(self, steps: int, device: torch.device, dtype: torch.dtype) -> torch.Tensor: ...

    @staticmethod
    def answerability(logits: torch.Tensor, unanswerable_id: int) -> torch.Tensor: ...

    def step(
        self,
        token: torch.Tensor,
        pos: torch.Tensor,
        keys: list[torch.Tensor],
        values: list[torch.Tensor],
        cross: list[tuple[torch.Tensor, torch.Tensor]],
        cross_bias: torch.Tensor,
        self_bias: torch.Tensor,
        ended: torch.Tensor | None = None,
    ) -> torch.Tensor: ...


AHEAD_ROWS = 8
"""The next step is queued ahead only while more rows than this are left (`queue_ahead`)."""


def queue_ahead(before: int | None, left: int) -> bool:
    """Whether to queue the next step before the current step's count of rows left is read, given the
    rows left after the step before it (``left``) and a step earlier (``before``; None: not known).
    Yes while more than `AHEAD_ROWS` are left and more than twice as many as the step before ended:
    at the rate rows end, the current step is unlikely to end them all, and a step queued after every
    row ended costs a whole step."""
    return before is not None and left > AHEAD_ROWS and left > 2 * (before - left)


def _ended_after(ended: torch.Tensor, bucket: int, live: int, read: int) -> int:
    """How many steps ran until every row had ended, given each step's count of ended rows (``ended``,
    up to step ``read``, whose count is the bucket's) and the last step read with rows left (``live``):
    the first step after ``live`` whose count is the bucket's, plus one."""
    return next(j for j in range(live + 1, read + 1) if int(ended[j]) == bucket) + 1


def first_reads(steps_before: int, steps: int) -> int:
    """How many steps to queue before the first count of rows left is read and the host's work between
    batches runs (the decoder's ``meanwhile``): half the steps the batch before ran until its rows had
    ended (a model's outputs have similar lengths from batch to batch), at least one. A step queued
    after every row ended costs a whole step; a host with nothing queued leaves the device idle."""
    return max(1, min(steps, steps_before // 2))


LENGTH_STEP = 16
"""Encoder lengths are padded up to a multiple of this for the graph's shape."""


def bucket_rows(rows: int) -> int:
    """The graph row count for a batch of ``rows``: the next power of two or three quarters of one
    (24, 48, ..., 1536), at least 8; so a batch pays for at most half again the rows it has, not twice."""
    power = max(8, 1 << (rows - 1).bit_length())
    return power * 3 // 4 if power >= 32 and rows <= power * 3 // 4 else power


def bucket_length(length: int) -> int:
    """The graph encoder length for a batch padded to ``length``: the next multiple of 16."""
    return max(LENGTH_STEP, -(-length // LENGTH_STEP) * LENGTH_STEP)


def windows(steps: int) -> list[int]:
    """Self-attention windows for a ``steps``-position cache: 8, 16, ... doubling, then ``steps``."""
    sizes, size = [], 8
    while size < steps:
        sizes.append(size)
        size *= 2
    return [*sizes, steps]


class _Storage:
    """Flat buffers for the largest bucket so far; `view` gives contiguous tensors of a smaller shape."""

    def __init__(self, dec: StepDecoder, rows: int, tokens: int, steps: int, like: torch.Tensor) -> None:
        self.rows, self.tokens, self.steps = rows, tokens, steps
        n_layers, hd, device = len(dec.layers), dec.heads * dec.d_kv, like.device
        self.self_kv = like.new_zeros(2, n_layers, rows * hd * steps)
        self.cross_kv = like.new_zeros(tokens, 2 * n_layers * hd)
        self.cross_bias = like.new_zeros(tokens)
        self.token = torch.zeros(rows, device=device, dtype=torch.long)
        self.pos = torch.zeros(1, device=device, dtype=torch.long)
        self.out = torch.zeros(rows * steps, device=device, dtype=torch.long)
        self.forced = torch.zeros(rows * steps, device=device, dtype=torch.long)
        self.finished = torch.zeros(rows, device=device, dtype=torch.bool)
        self.answerability = torch.zeros(rows, device=device, dtype=torch.float32)

    def fits(self, rows: int, tokens: int, steps: int) -> bool:
        return rows <= self.rows and tokens <= self.tokens and steps == self.steps


@dataclass
class _View:
    """One bucket's tensors: views of `_Storage` shaped for ``rows`` x ``length``."""

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    cross_kv: torch.Tensor
    """``(rows, length, 2 * layers * heads * d_kv)``: what `StepDecoder.cross_cache` fills."""
    cross: list[tuple[torch.Tensor, torch.Tensor]]
    cross_bias: torch.Tensor
    token: torch.Tensor
    pos: torch.Tensor
    out: torch.Tensor
    forced: torch.Tensor
    finished: torch.Tensor
    answerability: torch.Tensor
    """``(rows,)`` fp32: what `first_step` writes."""
    graphs: dict[int, torch.cuda.CUDAGraph] = field(default_factory=dict)
    """Per self-attention window, the captured step."""
    first_step: torch.cuda.CUDAGraph | None = None
    """QA models: step 0 (the first window's step) that also writes the answerability of its logits."""


def _view(store: _Storage, dec: StepDecoder, rows: int, length: int) -> _View:
    steps = store.steps
    kv_shape = (rows, dec.heads, steps, dec.d_kv)
    n_kv = rows * dec.heads * steps * dec.d_kv
    n_layers = len(dec.layers)
    cross_kv = store.cross_kv[: rows * length].view(rows, length, -1)
    return _View(
        keys=[store.self_kv[0, i, :n_kv].view(kv_shape) for i in range(n_layers)],
        values=[store.self_kv[1, i, :n_kv].view(kv_shape) for i in range(n_layers)],
        cross_kv=cross_kv,
        cross=dec.cross_views(cross_kv),
        cross_bias=store.cross_bias[: rows * length].view(rows, 1, 1, length),
        token=store.token[:rows],
        pos=store.pos,
        out=store.out[: rows * steps].view(rows, steps),
        forced=store.forced[: rows * steps].view(rows, steps),
        finished=store.finished[:rows],
        answerability=store.answerability[:rows],
    )


def _first_replays(view: _View) -> None:
    """Replay each of the bucket's graphs once, every row ended (the outputs are thrown away: a batch's
    `_load` fills every buffer a step reads), so that no call pays for a graph's first replay."""
    view.finished.fill_(True)
    view.pos.zero_()
    graphs = [*view.graphs.values(), *([view.first_step] if view.first_step is not None else [])]
    for graph in graphs:  # each advances the position by one; the first window holds them all
        graph.replay()
    view.pos.zero_()


class GraphedDecoding:
    """Greedy decoding of a `StepDecoder` (a `StaticT5Decoder`) with its step replayed from CUDA graphs."""

    def __init__(self, decoder: StepDecoder) -> None:
        self.dec = decoder
        self._store: _Storage | None = None
        self._views: dict[tuple[int, int, bool, int | None], _View] = {}
        self._pool: Any = None
        self._left: tuple[torch.Tensor, list[torch.cuda.Event]] | None = None
        """A pinned host slot per step for its count of ended rows, and two events (alternate steps)."""
        self._stream: torch.cuda.Stream | None = None
        """The one stream every capture runs on: the caching allocator reuses a block only on the stream
        it was allocated on, so with a stream per capture no graph could reuse the intermediates another
        one freed, and a warm-up of a few hundred buckets held 40 GB of graph pools."""
        self.captures = 0
        """Bucket shapes captured so far (each once, again only when storage grows), one graph per
        self-attention window each (and one for a QA model's first step)."""
        self._steps_run = 0
        """The steps the last batch ran until its rows had ended (`first_reads`)."""

    def generate(
        self,
        hidden: torch.Tensor,
        mask: torch.Tensor,
        *,
        max_new_tokens: int,
        unanswerable_id: int | None,
        forced: torch.Tensor | None,
        meanwhile: Callable[[], object] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Same contract as `StaticT5Decoder.generate` (``-1`` after a row ended).

        Capture and replay use the current stream of the current device, so both run with the batch's
        device made current: a process whose models live on ``cuda:1`` works without ``set_device``.
        """
        with torch.cuda.device(hidden.device):
            view = self._load(hidden, mask, max_new_tokens, forced, unanswerable_id)
            return self._run(view, mask.shape[0], max_new_tokens, meanwhile)

    @torch.inference_mode()
    def prepare(
        self,
        shapes: Iterable[tuple[int, int]],
        *,
        steps: int,
        like: torch.Tensor,
        forcing: bool = False,
        unanswerable_id: int | None = None,
        progress: Callable[[int], object] | None = None,
    ) -> int:
        """Capture now the graphs of every bucket that a batch of at most ``rows`` rows padded to
        ``length`` falls in, for each ``(rows, length)`` of ``shapes`` (as `generate` would on first
        sight), and replay each new bucket's graphs once, every row ended (`_first_replays`); storage for
        the largest is allocated once. Returns how many buckets were new. ``like`` gives the device and
        dtype of the encoder states; ``progress`` is called with 1 per bucket."""
        buckets = sorted(
            {(bucket_rows(r), bucket_length(length)) for most, length in shapes for r in range(1, most + 1)},
            reverse=True,
        )
        if not buckets:
            return 0
        before = self.captures
        with torch.cuda.device(like.device):
            self._reserve(max(r for r, _ in buckets), max(r * n for r, n in buckets), steps, like)
            assert self._store is not None
            self.dec.warm_products(self._store.cross_kv)  # each batch's keys and values overwrite it
            for r, n in buckets:
                captured = self.captures
                view = self._bucket(r, n, steps, like, forcing, unanswerable_id)
                if self.captures > captured:  # a new bucket
                    _first_replays(view)
                if progress is not None:
                    progress(1)
        return self.captures - before

    def _load(
        self,
        hidden: torch.Tensor,
        mask: torch.Tensor,
        steps: int,
        forced: torch.Tensor | None,
        unanswerable_id: int | None,
    ) -> _View:
        """This batch's bucket, its static buffers filled with the batch; padding rows start as ended."""
        dec = self.dec
        rows, length = mask.shape
        view = self._bucket(
            bucket_rows(rows), bucket_length(length), steps, hidden, forced is not None, unanswerable_id
        )
        view.cross_bias.fill_(torch.finfo(hidden.dtype).min)
        view.cross_bias[:rows, ..., :length].copy_(dec.cross_bias(mask, hidden.dtype))
        # keys and values of the bucket's first rows, computed in place; the positions past ``length``
        # come from zero states and, like the rows past ``rows`` (which the decoder may fill from zero
        # states too), are masked by ``cross_bias``
        padded = F.pad(hidden, (0, 0, 0, view.cross_kv.shape[1] - length))
        dec.cross_cache(padded, out=view.cross_kv)
        if not fused_available(view.keys[0]):  # the fused kernel reads no position past the step's
            for buf in (*view.keys, *view.values):
                buf.zero_()
        view.token.fill_(dec.start_id)
        view.pos.zero_()
        view.finished.fill_(True)
        view.finished[:rows] = False
        view.out.fill_(-1)
        if forced is not None:
            view.forced[:rows].copy_(forced)
        return view

    def _run(
        self, view: _View, rows: int, steps: int, meanwhile: Callable[[], object] | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Replay the step until every row has ended (or ``steps`` ran out). The first `first_reads`
        steps are queued before any count of rows left is read, then ``meanwhile`` runs (the device has
        those steps to run while the host does it); after that the next step is queued before the
        current one's count is read where `queue_ahead` says so. Each step's count has a slot of its
        own, so the steps the batch ran until its rows had ended are known exactly for the next batch."""
        dec = self.dec
        answerability = None
        sizes = windows(steps)
        ended, events = self._ended_counts(steps)
        bucket = view.finished.shape[0]
        first = first_reads(self._steps_run, steps)
        before, left = None, rows  # rows left after the last two steps whose counts were read
        live = -1  # the last step whose count was read with rows left
        unread = False  # the step before was queued ahead of reading its count
        ran = steps
        for step in range(steps):
            if step == 0 and view.first_step is not None:
                view.first_step.replay()
                answerability = view.answerability[:rows].clone()
            else:
                view.graphs[next(w for w in sizes if step < w)].replay()
            dec.row_steps += view.token.shape[0]
            ended[step].copy_(view.finished.sum(), non_blocking=True)
            events[step % 2].record()
            if step + 1 == first and meanwhile is not None:
                meanwhile()
            if step + 1 == steps:
                break
            if step + 1 < first:
                unread = True
                continue
            if unread:  # read the step before first; this one is queued behind it
                events[1 - step % 2].synchronize()
                before, left, unread = left, bucket - int(ended[step - 1]), False
                if left == 0:
                    ran = _ended_after(ended, bucket, live, step - 1)
                    break
                live = step - 1
            if queue_ahead(before, left):
                unread = True
                continue
            events[step % 2].synchronize()
            before, left = left, bucket - int(ended[step])
            if left == 0:
                ran = _ended_after(ended, bucket, live, step)
                break
            live = step
        self._steps_run = ran
        return view.out[:rows].clone(), answerability

    def _ended_counts(self, steps: int) -> tuple[torch.Tensor, list[torch.cuda.Event]]:
        if self._left is None or self._left[0].shape[0] < steps:
            self._left = (
                torch.zeros(max(steps, 64), dtype=torch.long, pin_memory=True),
                [torch.cuda.Event(), torch.cuda.Event()],
            )
        return self._left

    def _reserve(self, rows: int, tokens: int, steps: int, like: torch.Tensor) -> None:
        """Storage for at least ``rows`` rows and ``tokens`` encoder positions; growing it drops the
        captured graphs, which point into the old storage."""
        old = self._store
        if old is not None and old.fits(rows, tokens, steps):
            return
        self._views.clear()
        self._pool = None  # a pool dies with its last graph: the next capture starts a new one
        self._store = None  # freed before the larger one is allocated
        keep = (old.rows, old.tokens) if old is not None and steps == old.steps else (0, 0)
        self._store = _Storage(self.dec, max(rows, keep[0]), max(tokens, keep[1]), steps, like)

    def _bucket(
        self,
        rows: int,
        length: int,
        steps: int,
        like: torch.Tensor,
        forcing: bool,
        unanswerable_id: int | None,
    ) -> _View:
        """The view (with its captured graphs) for a bucket, growing storage when it does not fit."""
        self._reserve(rows, rows * length, steps, like)
        assert self._store is not None
        key = (rows, length, forcing, unanswerable_id)
        if key not in self._views:
            view = _view(self._store, self.dec, rows, length)
            for window in windows(steps):
                view.graphs[window] = self._capture_window(view, steps, window, like, forcing, None)
            if unanswerable_id is not None:
                first = windows(steps)[0]
                view.first_step = self._capture_window(view, steps, first, like, forcing, unanswerable_id)
            self._views[key] = view
            self.captures += 1
        return self._views[key]

    def _capture_window(
        self,
        view: _View,
        steps: int,
        window: int,
        like: torch.Tensor,
        forcing: bool,
        unanswerable_id: int | None,
    ) -> torch.cuda.CUDAGraph:
        """The step for positions below ``window`` (it reads only that much of the cache), captured;
        with ``unanswerable_id`` it also writes the answerability of its logits."""
        dec = self.dec
        self_bias = dec.self_bias(steps, like.device, like.dtype)[..., :window]
        keys = [k[:, :, :window] for k in view.keys]
        values = [v[:, :, :window] for v in view.values]

        def body() -> None:
            logits = dec.step(
                view.token, view.pos, keys, values, view.cross, view.cross_bias, self_bias, view.finished
            )
            token = view.forced.index_select(1, view.pos)[:, 0] if forcing else logits.argmax(dim=-1)
            view.out.index_copy_(1, view.pos, torch.where(view.finished, -1, token)[:, None])
            view.finished.logical_or_(token == dec.eos_id)
            view.token.copy_(torch.where(view.finished, dec.eos_id, token))
            view.pos.add_(1)
            if unanswerable_id is not None:
                view.answerability.copy_(dec.answerability(logits, unanswerable_id))

        # warm up on a side stream (cuBLAS workspaces, lazy inits), as capture requires
        view.token.fill_(dec.start_id)
        view.finished.fill_(True)
        if self._stream is None:
            self._stream = torch.cuda.Stream(device=like.device)
        stream = self._stream
        stream.wait_stream(torch.cuda.current_stream(like.device))
        with torch.cuda.stream(stream):
            view.pos.zero_()
            body()
        torch.cuda.current_stream(like.device).wait_stream(stream)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        # on an explicit stream of this device (torch's default capture stream lives on whichever device
        # first captured in this process, and a capture on another device's stream records nothing);
        # `torch.cuda.graph` would also empty the allocator's cache first (see the module docstring).
        # Thread-local: other threads' CUDA calls meanwhile (an RL trainer's data loader pinning its
        # next batch beside an in-process reward) would otherwise invalidate the capture
        with torch.cuda.stream(stream):
            graph.capture_begin(pool=self._pool, capture_error_mode="thread_local")
            try:
                body()
            finally:
                graph.capture_end()
        return graph
