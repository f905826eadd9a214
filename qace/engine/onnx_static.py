"""Greedy decoding over a static cache on ONNX Runtime: ``decoder_static`` run step after step with no
host work between steps but reading what each row emitted; on CUDA each step is one CUDA-graph replay.

Per batch (same contract as the engine's greedy loop, `qace.engine.greedy`: ``-1`` after a row ended,
answerability from the first step, forced tokens for benchmarks):

- ``decoder_init`` runs the first step as the loop does (first choice, answerability, per layer the
  self K/V of position 0 and the cross-attention K/V, the latter written straight into the buffers
  the later steps read);
- ``static_init`` lays out the state after it (`qace.export.static_graphs`): the step-0 greedy rules,
  the tokens to feed, the step index 1, the ended flags, the forced tokens (`NOT_FORCED` unless a
  benchmark forces them) and the encoder mask, and the caches with position 0 filled;
- ``decoder_static`` then runs once per step, its outputs of step k being its inputs of step k+1: the
  self-attention caches are updated in place (`static_in_place`: each one's output bound to its input's
  buffer), the other carried tensors (`static_carried`: the tokens, the step index, the ended flags)
  have two buffer sets, and the two directions (set 0 -> set 1, set 1 -> set 0) alternate
  (ping-pong), each with its own IO binding made once; the host copies only ``emitted`` (one int64 per
  row) per step, writes it into the output and stops once every row has ended. Rows are never dropped
  (the shapes are fixed); a finished row keeps emitting -1.

Buffers: one allocation (the slab) holds every tensor the step reads or writes, laid out for the batch's
(rows, encoder length) from offset 0: only one batch decodes at a time, and each batch rewrites all of
them before its first step. A shape needs the self caches (2 x layers x rows x heads x static_steps x
d_kv) and the cross K/V (2 x layers x rows x heads x length x d_kv), in the export's float type, plus a
few int64 per row: for T5-base in fp16 at 256 rows of 48 tokens about 0.7 GB, at 2,048 rows of 64 tokens
about 7 GB. Given the scheduler's batch limits (``max_batch``: at most R rows
and T tokens a batch, so rows x length <= T), the first slab is sized for every shape within them and
is allocated once: ONNX Runtime's device arena keeps freed memory for itself, so growing the slab shape
by shape would hold every smaller slab too. A shape beyond the limits (or any shape larger than the
slab, without them) reallocates it, which drops every shape's bindings and captured graphs (they point
into the old one).

CUDA graphs (``capture``): the step session has ``enable_cuda_graph``; each shape gets two graph ids,
one per direction (`gpu_graph_id` run option). ONNX Runtime captures an id on its first run (inside
that one call it runs the step twice to allocate its intermediates, then captures, then replays; the
step writes other buffers than it reads, but for the cache position ``step``, which each repetition
writes with the same values, so repeating it is harmless) and replays it afterwards,
reading and writing the addresses bound at capture: hence bindings made once per shape and never
rebound. The intermediates of all captured graphs come from the step session's arena and are reused
across graphs (replays never overlap). Captured graphs belong to the thread that captured them (ONNX
Runtime keeps them per thread), so one thread should drive a runner. A shape's first batch runs its
steps without capture (graph id -1, which ONNX Runtime runs as a plain run): many shapes of a run occur
once, and for them capturing cost more than it saved (the call that captures runs the step twice and
instantiates the graph, about 7 ms for T5-base, against the launches of a few steps: QACE-Ref's answers
are 2-4 tokens); from its second batch on a shape's steps are captured and replayed. On the CPU the same
steps run without capture.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from qace.errors import ConfigError
from qace.onnx_format import (
    CROSS_KV,
    EMITTED,
    FORCED,
    NEXT,
    NOT_FORCED,
    GraphInfo,
    init_input_names,
    init_output_names,
    past_names,
    static_carried,
    static_in_place,
    static_init_input_names,
    static_init_output_names,
    static_input_names,
)

logger = logging.getLogger(__name__)

ALIGN = 256
"""Byte alignment of every tensor in the slab (what CUDA allocations give)."""
GRAPH_ID = "gpu_graph_id"


Key = tuple[int | None, str]
"""A tensor of the slab: ``(set, input name)`` for carried tensors, ``(None, input name)`` for those both
sets share."""


@dataclass(frozen=True)
class _Place:
    """Where one tensor lives in the slab."""

    offset: int
    shape: tuple[int, ...]
    dtype: np.dtype


@dataclass
class _Shape:
    """One (rows, encoder length) shape: its tensors' places, its step bindings and graph ids."""

    places: dict[Key, _Place]
    emitted: list[Any]
    """Per set, the (rows,) int64 buffer that a step writing that set fills with what it emitted."""
    bindings: list[Any] = field(default_factory=list)
    """Per direction ``d``: reads set ``d``, writes set ``1 - d``."""
    options: list[Any] = field(default_factory=list)
    graph_ids: list[int] = field(default_factory=list)
    batches: int = 0
    """Batches decoded in this shape so far (the first runs uncaptured)."""


class StaticDecoder:
    """Greedy decoding of one export over its static-cache step (see module docstring)."""

    def __init__(
        self,
        sessions: dict[str, Any],
        info: GraphInfo,
        where: tuple[str, int],
        *,
        capture: bool,
        max_batch: tuple[int, int] | None = None,
    ) -> None:
        """``max_batch``: the scheduler's (rows, tokens) limits a batch keeps within, which size the slab
        once (see the module docstring); None sizes it by the shapes seen."""
        import onnxruntime as ort

        self.ort, self.sessions, self.info, self.where, self.capture = ort, sessions, info, where, capture
        self.max_batch = max_batch
        self.float = np.dtype(info.float_dtype)
        self.carried = static_carried(info.layers)
        self.in_place = set(static_in_place(info.layers))
        self.cross = past_names(info.layers, "present", CROSS_KV)
        self._slab: Any = None
        self._shapes: dict[tuple[int, int], _Shape] = {}
        self._graph_ids = 0
        self._captured: set[int] = set()
        """Graph ids that have run, so are captured (ONNX Runtime captures an id on its first run)."""
        self._uncaptured = ort.RunOptions()
        self._uncaptured.add_run_config_entry(GRAPH_ID, "-1")  # ONNX Runtime's "no graph for this run"
        self.captured_shapes = 0
        """Shapes whose step has been captured as CUDA graphs (one graph per direction), for benchmarks."""
        self.row_steps = 0
        """Decoder positions computed so far (rows x steps, the first step included), as the PyTorch
        decoder counts them."""

    def decode(
        self,
        hidden: Any,
        mask: Any,
        *,
        max_new_tokens: int,
        unanswerable_id: int | None,
        forced: np.ndarray | None,
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Greedy tokens ``(rows, max_new_tokens)``, ``-1`` after a row ended, and the first step's
        answerability (None unless ``unanswerable_id``), from the encoder's ``hidden`` and ``mask``
        (OrtValues on the session's device); ``forced`` (benchmarks) replaces the greedy choices."""
        info = self.info
        if max_new_tokens > info.static_steps:
            raise ConfigError(
                f"this export's static-cache step decodes at most {info.static_steps} tokens, not "
                f"{max_new_tokens}: export again with more steps, or decode with static_cache=False"
            )
        rows, length = mask.shape()
        shape = self._shape(rows, length)
        answerability, first = self._first_step(shape, hidden, mask, unanswerable_id)
        wanted = np.full((rows, info.static_steps), NOT_FORCED, dtype=np.int64)
        if forced is not None:
            wanted[:, :max_new_tokens] = forced[:, :max_new_tokens]
        out = np.full((rows, max_new_tokens), -1, dtype=np.int64)
        out[:, 0] = self._start(shape, first, wanted, mask)
        self.row_steps += rows
        session = self.sessions["decoder_static"]
        captured = self.capture and shape.batches > 0
        shape.batches += 1
        for step in range(1, max_new_tokens):
            if np.isin(out[:, step - 1], (-1, info.eos_id)).all():
                break
            direction = (step - 1) % 2  # static_init wrote set 0
            options = shape.options[direction] if captured or not self.capture else self._uncaptured
            session.run_with_iobinding(shape.bindings[direction], options)
            out[:, step] = shape.emitted[1 - direction].numpy()
            self.row_steps += rows
            if captured and shape.graph_ids[direction] not in self._captured:
                self._captured.add(shape.graph_ids[direction])
                self.captured_shapes += direction == 0  # a shape's first step runs direction 0
        return out, answerability

    def _first_step(
        self, shape: _Shape, hidden: Any, mask: Any, unanswerable_id: int | None
    ) -> tuple[np.ndarray | None, dict[str, Any]]:
        """``decoder_init``: its cross K/V into the slab, the answerability to the host (when asked), its
        choice and self K/V kept on the device for ``static_init``."""
        session = self.sessions["decoder_init"]
        binding = session.io_binding()
        rows = mask.shape()[0]
        start = np.full((rows, 1), self.info.start_id, dtype=np.int64)
        unanswerable = np.array([unanswerable_id or 0], dtype=np.int64)
        bind_feeds(binding, dict(zip(init_input_names(), (start, hidden, mask, unanswerable), strict=True)))
        kept = [name for name in init_output_names(self.info.layers)[1:] if name not in self.cross]
        if unanswerable_id is None:
            kept.remove("answerability")
        for name in kept:
            binding.bind_output(name, *(("cpu", 0) if name == "answerability" else self.where))
        for name in self.cross:
            self._bind(binding, name, shape.places[None, name.replace("present.", "past.")], output=True)
        session.run_with_iobinding(binding)
        values = dict(zip(kept, binding.get_outputs()[: len(kept)], strict=True))
        answerability = values.pop("answerability").numpy() if unanswerable_id is not None else None
        return answerability, values

    def _start(self, shape: _Shape, first: dict[str, Any], forced: np.ndarray, mask: Any) -> np.ndarray:
        """``static_init``: the state after the first step into set 0 (and the forced tokens and mask
        where every step reads them); returns what the first step emitted."""
        session = self.sessions["static_init"]
        binding = session.io_binding()
        layers = self.info.layers
        given = {**first, FORCED: forced, "encoder_attention_mask": mask}
        bind_feeds(binding, {name: given[name] for name in static_init_input_names(layers)})
        binding.bind_output(EMITTED, "cpu", 0)
        for name in static_init_output_names(layers)[1:]:
            name = name.removeprefix(NEXT)
            self._bind(binding, NEXT + name, shape.places[self._key(0, name)], output=True)
        session.run_with_iobinding(binding)
        return np.asarray(binding.get_outputs()[0].numpy())

    def _two_sets(self, name: str) -> bool:
        """Whether ``name`` has a buffer per set (carried, not updated in place) rather than one."""
        return name in self.carried and name not in self.in_place

    def _key(self, which: int, name: str) -> Key:
        """Where set ``which``'s ``name`` lives."""
        return (which, name) if self._two_sets(name) else (None, name)

    def _bind(self, binding: Any, name: str, place: _Place, *, output: bool) -> None:
        args = (name, *self.where, place.dtype, place.shape, self._slab.data_ptr() + place.offset)
        if output:
            binding.bind_output(*args)
        else:
            binding.bind_input(*args)

    def _shape(self, rows: int, length: int) -> _Shape:
        """The shape's places, bindings and graph ids, made on first sight (growing the slab if needed)."""
        if (rows, length) in self._shapes:
            return self._shapes[rows, length]
        places, size = _layout(self._tensors(rows, length))
        if self._slab is None or size > self._slab.shape()[0]:
            self._grow(max(size, self._bound()))
        new = self.ort.OrtValue.ortvalue_from_shape_and_type
        shape = _Shape(places, [new((rows,), np.int64, *self.where) for _ in (0, 1)])
        session = self.sessions["decoder_static"]
        for direction in (0, 1):
            binding = session.io_binding()
            for name in static_input_names(self.info.layers):
                self._bind(binding, name, places[self._key(direction, name)], output=False)
            for name in self.carried:  # an in-place cache: the same place as the input above
                self._bind(binding, NEXT + name, places[self._key(1 - direction, name)], output=True)
            binding.bind_ortvalue_output(EMITTED, shape.emitted[1 - direction])
            options = self.ort.RunOptions()
            if self.capture:
                self._graph_ids += 1
                options.add_run_config_entry(GRAPH_ID, str(self._graph_ids))  # 0 is ONNX Runtime's own
                shape.graph_ids.append(self._graph_ids)
            shape.bindings.append(binding)
            shape.options.append(options)
        self._shapes[rows, length] = shape
        return shape

    def _bound(self) -> int:
        """The slab bytes every shape within ``max_batch`` fits in (0 without limits): the layout at R rows
        of ceil(T / R) tokens, since each tensor grows with the rows or with rows x length."""
        if self.max_batch is None:
            return 0
        rows, tokens = self.max_batch
        return _layout(self._tensors(rows, -(-tokens // rows)))[1]

    def _tensors(self, rows: int, length: int) -> list[tuple[Key, tuple[int, ...], np.dtype]]:
        """Every tensor the step reads or writes for this shape: ``(key, shape, dtype)``."""
        info = self.info
        cache, cross = (rows, info.heads, info.static_steps, info.d_kv), (rows, info.heads, length, info.d_kv)
        shapes: dict[str, tuple[tuple[int, ...], np.dtype]] = {
            "decoder_input_ids": ((rows, 1), np.dtype(np.int64)),
            "step": ((1,), np.dtype(np.int64)),
            "finished": ((rows,), np.dtype(np.bool_)),
            FORCED: ((rows, info.static_steps), np.dtype(np.int64)),
            "encoder_attention_mask": ((rows, length), np.dtype(np.int64)),
        }
        for name in static_input_names(info.layers):
            if name.startswith("past."):
                shapes[name] = (cross if name.endswith(CROSS_KV) else cache, self.float)
        return [
            (key, *shapes[name])
            for name in static_input_names(info.layers)
            for key in ([(0, name), (1, name)] if self._two_sets(name) else [(None, name)])
        ]

    def _grow(self, size: int) -> None:
        """A slab of ``size`` bytes; the shapes laid out in the old one (and their graphs) are dropped."""
        release = getattr(self.sessions["decoder_static"], "release_captured_graph", None)  # ORT >= 1.27
        if release is not None:
            for graph_id in self._captured:
                release(graph_id)
        self._captured.clear()
        logger.info(
            "static decoding: %d MB of buffers%s",
            size >> 20,
            " for a larger batch shape" if self._shapes else "",
        )
        self._shapes.clear()
        self._slab = None  # freed before the larger one is allocated
        self._slab = self.ort.OrtValue.ortvalue_from_shape_and_type((size,), np.uint8, *self.where)


def bind_feeds(binding: Any, feeds: dict[str, Any]) -> None:
    """Bind graph inputs: numpy arrays are uploaded by the run, OrtValues used where they are."""
    for name, value in feeds.items():
        if isinstance(value, np.ndarray):
            binding.bind_cpu_input(name, value)
        else:
            binding.bind_ortvalue_input(name, value)


def _layout(tensors: list[tuple[Key, tuple[int, ...], np.dtype]]) -> tuple[dict[Key, _Place], int]:
    """Consecutive ``ALIGN``-aligned places for ``tensors`` from offset 0, and the bytes they take."""
    places, offset = {}, 0
    for key, shape, dtype in tensors:
        places[key] = _Place(offset, shape, dtype)
        offset += -(-int(np.prod(shape)) * dtype.itemsize // ALIGN) * ALIGN
    return places, offset
