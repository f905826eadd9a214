"""The engine: de-duplicate work across captions, pack it into batches, run them, map results back.

Every stage of the metric is one call here with the work of a whole chunk of captions, so a batch is
filled from many captions and identical inputs (the same question on the same reference, say) run once.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from tqdm.auto import tqdm

from qace.engine.batches import Generated, ImageRows, TextBatch, VisualBatch
from qace.engine.pinned_upload import to_device
from qace.engine.prompt_ids import PromptIds, prompt_ids
from qace.engine.scheduler import Deduped, dedupe, pad_batch, plan_batches
from qace.engine.tokenize import cut_to, decode
from qace.progress import Tracker, bars_shown


class Runner(Protocol):
    """What the engine needs from a backend (PyTorch now, ONNX Runtime alike).

    A runner class may also offer ``generate_jobs(jobs, *, max_new_tokens)``, yielding ``(key,
    Generated)`` for an iterable of ``(runner, key, batch, unanswerable_id)`` in order, to overlap
    consecutive batches, of one model or several (`qace.engine.torch_runner.generate_jobs`); the
    engine uses it when every runner of a call shares it. It may fetch a job before the previous
    job's result is yielded; a stage built from an earlier stage's outputs (`deferred_stage`'s
    ``needs``) runs in the same stream as that stage where the results of every job but the last
    fetched are yielded when a job is fetched, else after the stream has drained.
    """

    def generate(
        self, batch: TextBatch | VisualBatch, *, max_new_tokens: int, unanswerable_id: int | None = None
    ) -> Generated: ...


NO_LOCK = nullcontext()
"""The device lock of a caller that runs alone (see `qace.engine.device_lock`)."""


@dataclass(frozen=True)
class StageOutput:
    """Decoded outputs of one stage, aligned with the inputs it was given."""

    texts: list[str]
    answerability: np.ndarray | None
    truncated: list[bool]


@dataclass(frozen=True)
class BatchLimits:
    """Scheduler budgets: padded tokens and rows per batch."""

    max_batch_tokens: int = 16384
    max_batch_rows: int = 256


@dataclass
class Stage:
    """One model's work in a call: its batches (built lazily, so a later stage's host work can wait
    until the device runs an earlier one) and how its generated ids become a `StageOutput`."""

    runner: Runner
    n_items: int
    batches: Iterator[tuple[np.ndarray, TextBatch | VisualBatch]]
    unanswerable_id: int | None
    bar: Any
    finish: Callable[[list[list[int]], np.ndarray | None], StageOutput]
    needs: tuple[int, ...] = ()
    """The stages of the run (their places in it, all before this one) whose outputs build this one
    (`deferred_stage`); `run_stages` gives them to it (``inputs``) before it asks for its first batch."""
    inputs: list[StageOutput] = field(default_factory=list)


def run_stages(
    stages: Sequence[AbstractContextManager[Stage]],
    device_lock: AbstractContextManager[Any] = NO_LOCK,
    *,
    max_new_tokens: int,
) -> list[StageOutput]:
    """Run stages (answers on the caption and on the image, say) as one stream of batches, each row
    generating at most ``max_new_tokens`` tokens; their outputs in order.

    A runner class that overlaps batches (`Runner`) then overlaps them across the stages too: the
    first visual batch's encoder runs while the last text-QA batch decodes, instead of after it. A
    stage that ``needs`` earlier stages' outputs (`deferred_stage`) is built once every batch of those
    is back; where the stream has not yielded them yet when it reaches the stage, the stream ends
    there, and a new one starts with that stage once every batch fetched is back.
    """
    with ExitStack() as stack:
        opened = [stack.enter_context(stage) for stage in stages]
        for k, st in enumerate(opened):
            if any(not 0 <= j < k for j in st.needs):
                raise ValueError(f"run_stages: stage {k} needs {st.needs}: only stages before it")
        done: list[list[tuple[np.ndarray, Generated]]] = [[] for _ in opened]
        fetched = [0] * len(opened)
        outputs: dict[int, StageOutput] = {}
        reached = 0  # the stage whose batches are being fetched; those before have all been

        def output(k: int) -> StageOutput:  # a stage's size is read once its batches are done
            if k not in outputs:
                outputs[k] = _finish(opened[k], done[k])
            return outputs[k]

        def jobs() -> Iterator[tuple[Runner, tuple[int, np.ndarray], TextBatch | VisualBatch, int | None]]:
            nonlocal reached
            while reached < len(opened):
                st = opened[reached]
                if any(len(done[j]) < fetched[j] for j in st.needs):
                    return  # not back yet: this stream drains first
                st.inputs = [output(j) for j in st.needs]
                for index, batch in st.batches:
                    fetched[reached] += 1
                    yield st.runner, (reached, index), batch, st.unanswerable_id
                reached += 1

        shared = {getattr(type(st.runner), "generate_jobs", None) for st in opened}
        generate_jobs = shared.pop() if len(shared) == 1 else None
        with device_lock:
            while reached < len(opened):
                at, fetched_before = reached, sum(fetched)
                stream = jobs()
                if generate_jobs is not None:
                    results = generate_jobs(stream, max_new_tokens=max_new_tokens)
                else:
                    results = (
                        (key, runner.generate(batch, max_new_tokens=max_new_tokens, unanswerable_id=uid))
                        for runner, key, batch, uid in stream
                    )
                for (k, index), out in results:
                    done[k].append((index, out))
                    opened[k].bar.update(len(index))
                if (reached, sum(fetched)) == (at, fetched_before):
                    raise RuntimeError(f"run_stages: a stream answered fewer batches than it fetched ({at})")
        return [output(k) for k in range(len(opened))]


def _finish(stage: Stage, outs: list[tuple[np.ndarray, Generated]]) -> StageOutput:
    """A stage's output from its batches' generated rows, each put back at its item's place."""
    tokens: list[list[int]] = [[] for _ in range(stage.n_items)]
    answerability = np.zeros(stage.n_items, dtype=np.float64) if stage.unanswerable_id is not None else None
    for index, out in outs:
        for item, row in zip(index.tolist(), out.tokens, strict=True):
            tokens[item] = row
        if answerability is not None and out.answerability is not None:
            answerability[index] = out.answerability
    return stage.finish(tokens, answerability)


@contextmanager
def deferred_stage(
    runner: Runner,
    unanswerable_id: int | None,
    make: Callable[..., AbstractContextManager[Stage]],
    needs: Sequence[int] = (),
) -> Iterator[Stage]:
    """A stage for `run_stages` whose inputs are not known yet when the run starts (a part of a call
    whose captions are still being parsed, or whose questions an earlier stage of the run asks):
    ``make(*outputs)`` builds it when the run reaches its first batch, given the outputs of the stages
    of the run it ``needs`` (their places in the run), so the wait for its inputs overlaps the device's
    work on the stages before it. ``runner`` and ``unanswerable_id`` must be the ones the built stage
    has."""
    with ExitStack() as stack:
        stage = Stage(runner, 0, iter(()), unanswerable_id, None, _not_built, tuple(needs))

        def batches() -> Iterator[tuple[np.ndarray, TextBatch | VisualBatch]]:
            built = stack.enter_context(make(*stage.inputs))
            if built.runner is not runner or built.unanswerable_id != unanswerable_id:
                raise ValueError("deferred_stage: the built stage has another runner or unanswerable id")
            stage.n_items, stage.bar, stage.finish = built.n_items, built.bar, built.finish
            yield from built.batches

        stage.batches = batches()
        yield stage


def _not_built(tokens: list[list[int]], answerability: np.ndarray | None) -> StageOutput:
    raise RuntimeError("a deferred stage finished before its first batch was asked for")


def _text_batches(
    encode: PromptIds, rows: list[tuple[str, ...]], max_input_tokens: int, limits: BatchLimits
) -> tuple[list[tuple[np.ndarray, TextBatch]], list[bool]]:
    """A slice of prompts tokenised, planned into batches and padded (in the helper thread), and which
    prompts were cut."""
    tokenizer = encode.tokenizer
    ids, cut = cut_to(encode(rows), max_input_tokens, tokenizer.eos_token_id)
    planned = plan_batches([len(x) for x in ids], limits.max_batch_tokens, limits.max_batch_rows)
    pad = tokenizer.pad_token_id
    return [(index, TextBatch(*pad_batch([ids[i] for i in index], pad))) for index in planned], cut


def _progress(total: int, desc: str, progress: bool) -> Any:
    """One bar per stage, counting sequences (shown for long chunks only, as the caller decides, and only
    where bars draw: `qace.progress.bars_shown`)."""
    if not (progress and total >= 2 and bars_shown()):
        # not a disabled tqdm: that takes tqdm's process-wide lock as it opens and closes, on the
        # thread that feeds the device
        return Tracker(desc, total, "seq", enabled=False)
    return tqdm(total=total, desc=desc, unit="seq", leave=False)


@contextmanager
def text_stage(
    runner: Runner,
    tokenizer: Any,
    template: str,
    rows: Sequence[tuple[str, ...]],
    *,
    max_input_tokens: int,
    limits: BatchLimits,
    unanswerable_id: int | None = None,
    desc: str = "generate",
    progress: bool = False,
) -> Iterator[Stage]:
    """A text model's greedy outputs for the prompts ``template.format(*row)`` of ``rows``, as a stage
    for `run_stages`: identical prompts run once, and the prompts' ids are composed from their parts'
    (`qace.engine.prompt_ids`).

    Prompts are tokenised, planned into batches and padded a slice at a time (`_slice_bounds`: half a
    batch, then doubling up to four batches), the next slice in a helper thread while this one's
    batches run: the tokenizer works in Rust without the interpreter lock. Slices follow the prompts'
    text length, and batches are planned within a slice. The batches of all slices form one stream, so a
    runner that overlaps batches (`Runner`) does so across slices.
    """
    encode = prompt_ids(tokenizer, template)
    unique = dedupe(list(rows))
    # longest text first, so each slice holds prompts of similar token length and its batches pad as
    # little as batches planned over the whole stage would
    lengths = np.fromiter(
        (sum(map(len, row)) for row in unique.unique), dtype=np.int64, count=len(unique.unique)
    )
    order = np.argsort(-lengths, kind="stable")
    by_length = [unique.unique[i] for i in order.tolist()]
    bounds = _slice_bounds(len(by_length), limits.max_batch_rows)
    truncated: list[bool] = []
    with (
        ThreadPoolExecutor(1, thread_name_prefix="qace-tokenize") as helper,
        _progress(len(unique.unique), desc, progress) as bar,
    ):

        def prepare(lo: int, hi: int) -> tuple[list[tuple[np.ndarray, TextBatch]], list[bool]]:
            return _text_batches(encode, by_length[lo:hi], max_input_tokens, limits)

        spans = list(itertools.pairwise(bounds))
        first = helper.submit(prepare, *spans[0]) if spans else None

        def batches() -> Iterator[tuple[np.ndarray, TextBatch]]:
            upcoming = first
            for at, (lo, _) in enumerate(spans):
                assert upcoming is not None
                prepared, cut = upcoming.result()
                if at + 1 < len(spans):
                    upcoming = helper.submit(prepare, *spans[at + 1])
                truncated.extend(cut)
                for index, batch in prepared:
                    yield index + lo, batch

        def finish(tokens: list[list[int]], answerability: np.ndarray | None) -> StageOutput:
            texts = decode(tokenizer, tokens, only_pad_eos=True)
            position = np.empty(len(order), dtype=np.int64)  # unique prompt -> its place in length order
            position[order] = np.arange(len(order))
            at = position[unique.inverse]
            picks = at.tolist()
            return StageOutput(
                texts=[texts[i] for i in picks],
                answerability=None if answerability is None else answerability[at],
                truncated=[truncated[i] for i in picks],
            )

        yield Stage(runner, len(by_length), batches(), unanswerable_id, bar, finish)


def _slice_bounds(n: int, rows: int) -> list[int]:
    """Where a stage's length-sorted prompts are cut into slices: half a batch first, then doubling up
    to four batches. Only the first slice's tokenising is waited for (the rest is tokenised while the
    previous slice runs), and a slice's batches take the GPU longer than twice as many prompts take to
    tokenise, so each next slice is ready in time."""
    bounds, size = [0], max(1, rows // 2)
    while bounds[-1] < n:
        bounds.append(min(n, bounds[-1] + size))
        size = min(2 * size, 4 * rows)
    return bounds


@contextmanager
def visual_stage(
    runner: Runner,
    tokenizer: Any,
    questions: Sequence[str],
    image_ids: Sequence[str],
    features: Callable[[str], np.ndarray] | None,
    *,
    encode_questions: Callable[[Sequence[str]], tuple[Any, Any, Sequence[bool]]],
    limits: BatchLimits,
    unanswerable_id: int | None,
    desc: str = "visual QA",
    progress: bool = False,
) -> Iterator[Stage]:
    """Visual-T5's answers for (question, image) pairs, as a stage for `run_stages`: identical pairs
    run once.

    Every row has the same fixed 102-position encoder input, so batches are cut by rows only. Batches
    gather their rows from the runner's device-resident features of hot images (an image is uploaded
    once while it stays hot, not once per chunk or per question); a runner without them gets one host
    table per chunk. ``encode_questions`` turns the distinct questions into the model's fixed-width
    ``(ids, mask, truncated)``. The questions are encoded in a helper thread, and the features gathered once
    the stream reaches this stage (under the caller's device lock), so both overlap an earlier stage.
    """
    unique = dedupe(list(zip(questions, image_ids, strict=True)))
    asked = dedupe([q for q, _ in unique.unique])  # a question is asked of several images
    images = dedupe([image for _, image in unique.unique])
    with (
        ThreadPoolExecutor(1, thread_name_prefix="qace-tokenize") as helper,
        _progress(len(unique.unique), desc, progress) as bar,
    ):
        inputs = helper.submit(encode_questions, asked.unique)
        truncated: list[bool] = []

        def batches() -> Iterator[tuple[np.ndarray, VisualBatch]]:
            ids_t, mask_t, cut = inputs.result()
            input_ids = np.asarray(ids_t, dtype=np.int64)[asked.inverse]
            mask = np.asarray(mask_t, dtype=np.int64)[asked.inverse]
            truncated.extend(cut[i] for i in asked.inverse)
            make_batch = _visual_batches(runner, features, images, input_ids, mask)
            width = input_ids.shape[1] + 38
            for index in plan_batches(
                [width] * len(unique.unique), limits.max_batch_tokens, limits.max_batch_rows
            ):
                yield index, make_batch(index)

        def finish(tokens: list[list[int]], answerability: np.ndarray | None) -> StageOutput:
            texts = decode(tokenizer, tokens)
            return StageOutput(
                texts=[texts[i] for i in unique.inverse],
                answerability=None if answerability is None else answerability[unique.inverse],
                truncated=[truncated[i] for i in unique.inverse],
            )

        yield Stage(runner, len(unique.unique), batches(), unanswerable_id, bar, finish)


def _visual_batches(
    runner: Runner,
    features: Callable[[str], np.ndarray] | None,
    images: Deduped[str],
    input_ids: np.ndarray,
    mask: np.ndarray,
) -> Callable[[np.ndarray], VisualBatch]:
    """Builds a batch of (question, image) rows: region features gathered on the runner's device from
    its hot-image slab, or (a runner without one, e.g. ONNX Runtime) from one host table per chunk, or,
    for a runner in another process (``gathers_features``), named by `ImageRows` for it to gather."""
    if getattr(runner, "gathers_features", False):

        def named(index: np.ndarray) -> VisualBatch:
            used, rows = np.unique(images.inverse[index], return_inverse=True)
            refs = ImageRows(tuple(images.unique[i] for i in used.tolist()), rows.astype(np.int64))
            return VisualBatch(input_ids[index], mask[index], refs)

        return named
    assert features is not None, "a runner that does not gather features itself needs a feature loader"
    resident = getattr(runner, "feature_rows", lambda *_: None)(images.unique, features)
    if resident is not None:
        slab, slots = resident
        row_of = slots[to_device(images.inverse, slots.device)]

        def on_device(index: np.ndarray) -> VisualBatch:
            rows = row_of[to_device(index, row_of.device)]
            return VisualBatch(input_ids[index], mask[index], slab[rows])

        return on_device
    host = [features(image) for image in images.unique]
    table = np.stack(host).astype(np.float32, copy=False) if host else np.zeros((0, 36, 2054), np.float32)

    def from_host(index: np.ndarray) -> VisualBatch:
        return VisualBatch(input_ids[index], mask[index], table[images.inverse[index]])

    return from_host


def gather_features(runner: Runner, features: Callable[[str], np.ndarray], batch: VisualBatch) -> VisualBatch:
    """``batch`` with its `ImageRows` replaced by the features themselves, gathered as `_visual_batches`
    gathers a chunk's (the runner's device-resident slab, else a host table)."""
    refs = batch.features
    if not isinstance(refs, ImageRows):
        return batch
    images = Deduped(list(refs.image_ids), refs.rows)
    make = _visual_batches(runner, features, images, batch.input_ids, batch.attention_mask)
    return make(np.arange(len(refs.rows)))
