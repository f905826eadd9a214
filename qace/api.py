"""The public entry points: ``QACE`` (a reusable scorer) and ``score()`` (one shot).

Most users need nothing else: build a ``QACE`` once (it loads the models), then score lists of
captions, streams of records, or whole files with crash-safe, resumable output.
"""

from __future__ import annotations

import functools
import gc
import itertools
import logging
import threading
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from qace.chunks import Tapered, take
from qace.config import QACEConfig, build_signature, parsing_beside_hosts, speed_defaults
from qace.data.records import Record, RecordError, caption_problem, list_record, require
from qace.engine import instrument
from qace.engine.gc_pause import collector_paused, freeze_heap
from qace.errors import ConfigError, FeatureError, HostWorkerError
from qace.metric.candidates import CandidateParts
from qace.metric.pipeline import score_chunk
from qace.scoring import FileScorer, list_ids

if TYPE_CHECKING:
    from qace.engine.core import DeviceCore
    from qace.engine.host_pool import HostPool

log = logging.getLogger(__name__)

_CONFIG_FIELDS = {f.name for f in fields(QACEConfig)}

HOST_MIN_CHUNKS = 4
"""Host processes (``host_workers``) start for the first input longer than this many chunks; shorter
input is scored in this process: starting the processes (each imports torch, transformers and spaCy)
costs more than they save on it (docs/performance.md, start-up)."""


@dataclass(frozen=True)
class _Prepared:
    """A chunk whose records are validated and whose candidates are being extracted (also in ``parts``)."""

    results: list[dict[str, Any] | RecordError | None]
    valid: list[Record]
    candidates: Future[list[list[str]]]
    parts: CandidateParts | None = None


class QACE(FileScorer):
    """A reusable QACE scorer: models are loaded once, then any number of captions are scored.

    ``models`` is a directory holding ``qg/``, ``tqa/`` and ``vqa/`` (as ``qace make-test-models``
    writes them); ``qg``/``tqa``/``vqa`` override single models (hub id or directory); without any,
    the paper's models are loaded (spec defaults). ``features`` is a feature store or a path to one
    (a directory of per-image ``.npz`` files or an HDF5 store), needed for QACE-Img. Any
    :class:`~qace.config.QACEConfig` field can be passed by keyword (``variant="img"``, ``precision="bf16"``).
    Without a ``config``, the speed settings not passed follow the device (`qace.config.speed_defaults`:
    on a GPU, large batches and spaCy in worker processes).
    """

    score_key = "qace"

    def __init__(
        self,
        config: QACEConfig | None = None,
        *,
        models: str | Path | None = None,
        qg: str | Path | None = None,
        tqa: str | Path | None = None,
        vqa: str | Path | None = None,
        features: Any = None,
        **settings: Any,
    ) -> None:
        unknown = set(settings) - _CONFIG_FIELDS
        if unknown:
            raise ConfigError(f"unknown setting(s) {sorted(unknown)}; valid: {sorted(_CONFIG_FIELDS)}")
        if config is None:  # settings left open get the device's (`speed_defaults`)
            device = str(settings.get("device", QACEConfig.device))
            backend = str(settings.get("backend", QACEConfig.backend))
            variant = str(settings.get("variant", QACEConfig.variant))
            settings = {**speed_defaults(device, backend, variant), **settings}
        self.config = (config or QACEConfig()).with_(**settings)
        from qace.engine.feature_cache import FeatureCache
        from qace.kernels.bertscore import BertScoreMatcher
        from qace.metric.candidates import CandidateExtractor
        from qace.metric.runners import build_models

        self.features = None
        if self.config.variant == "img" and features is not None:  # a bad path fails before the models load
            from qace.features.stores import open_feature_store

            self.features = FeatureCache(open_feature_store(features))
        self.models, fingerprints, self.uses_test_models = build_models(
            self.config, models_dir=models, qg=qg, tqa=tqa, vqa=vqa
        )
        on_gpu = self.config.device.startswith("cuda")
        self.matcher = BertScoreMatcher(
            self.config.bertscore_model,
            layer=self.config.bertscore_layer,
            device=self.config.device,
            batch_size=4096 if on_gpu else 128,
            precision=bertscore_precision(self.config),
        )
        self.candidates = CandidateExtractor(self.config.spacy_model, workers=self.config.spacy_workers)
        self.signature = build_signature(
            self.config,
            qg=fingerprints["qg"],
            qa=fingerprints["tqa"],
            vqa=fingerprints.get("vqa"),
            bertscore=self.matcher.signature,
            features=None if self.features is None else self.features.store.identity,
        )
        self.core: DeviceCore | None = None
        """Once host processes started: the engine core feeding the device (`qace.engine.core`)."""
        self.host: HostPool | None = None
        """Once started: the processes doing each chunk's host work (`qace.metric.host`)."""
        self._starting = threading.Lock()
        self._design_said = False
        self._closed = False
        self._froze_heap = False

    def start_host_processes(self, wait: bool = False) -> None:
        """Start the engine core (a thread of this process, serving the models and BERTScore's encoder)
        and ``host_workers`` host processes that send it their chunks' device work, with the spaCy
        processes (``spacy_workers``); idempotent, nothing without ``host_workers``. Scoring starts them
        by itself for the first input longer than `HOST_MIN_CHUNKS` chunks; shorter input is scored in
        this process, which is faster for it than starting processes, and input of one chunk always is
        (`_choose_design`). Returns at once (with ``wait``, once every process is ready): chunks are
        scored in this process until they are."""
        if self.config.host_workers < 1:
            return
        with self._starting:
            if self.host is None:
                self._start_host_processes()
            host = self.host
        assert host is not None
        if wait:
            host.wait_ready()
            self.candidates.start(wait=True)

    def _start_host_processes(self) -> None:
        from qace.engine.core import DeviceCore
        from qace.engine.host_pool import HostPool
        from qace.metric.host import BERTSCORE, HostSetup

        self.candidates.limit(parsing_beside_hosts(self.config.spacy_workers, self.config.host_workers))
        self.candidates.start()
        m = self.models
        runners = {"qg": m.qg, "tqa": m.tqa, **({"vqa": m.vqa} if m.vqa is not None else {})}
        self.core = DeviceCore(
            runners,
            functions={BERTSCORE: self.matcher.match},
            features=self.features.get if self.features is not None else None,
            lock=m.device_lock,
        )
        self.core.start()
        setup = HostSetup(
            self.config,
            m.qg_tokenizer,
            m.tqa_tokenizer,
            m.tqa_unanswerable,
            m.vqa_tokenizer,
            m.vqa_unanswerable,
            self.matcher.planner,
            self.signature,
        )
        self.host = HostPool(self.config.host_workers, "qace.metric.host:setup", setup, self.core.attach)
        self._shutdown = weakref.finalize(self, _shut_down, self.core, self.host)

    def close(self) -> None:
        """Stop the engine core, the host processes and spaCy's processes (idempotent); a closed scorer
        scores no more (`HostWorkerError`). A scorer that is garbage-collected, or alive when the
        interpreter exits, is closed the same way, so the core never runs device work while the process
        tears down."""
        with self._starting:
            self._closed = True
        if self.host is not None:
            self._shutdown()
        self.candidates.close()
        if self.features is not None:
            self.features.close()
        if self._froze_heap:  # what the warm-up froze can be collected again (its cycles included)
            self._froze_heap = False
            gc.unfreeze()

    def warm_up(self, max_rows: int | None = None, max_length: int = 96) -> int:
        """Capture now the CUDA graphs of every batch shape the decoders can meet, for batches of up to
        ``max_rows`` rows (default: the ``max_batch_rows`` setting) of prompts of up to ``max_length``
        tokens (Visual-T5's layout whole), so that no later call stops to capture one: a capture costs
        a call tens of milliseconds, the tail of a reward service's latency. Takes seconds, and reserves
        the decoders' graph buffers for the largest batch at once. Longer prompts are still captured
        when first met. Returns how many batch shapes were captured: 0 on the CPU or the ONNX Runtime
        backend, which capture nothing. On a GPU the encoders also run their products once at every
        row count their batches are padded to (`qace.families.t5.encoder.T5Encoder.warm_up`), so that
        cuBLAS has chosen each kernel before a call needs it.

        It also starts, on any device, what a first call would otherwise wait for: spaCy's worker
        processes (each loads the parser; they start while the graphs are captured), then synthetic
        captions through the whole chain (`_warm_chain`: the encoders' kernels, which CUDA loads on
        first launch, pinned upload buffers, BERTScore's encoder and token F1's compiled kernels). Host
        processes are not started: a call that fits a few chunks (a reward call) is scored in this
        process.

        It ends by freezing the process's heap (`freeze_heap`: ``gc.freeze``), so that no later call
        pays for a garbage collection that walks the models; `close` unfreezes it.
        """
        from tqdm.auto import tqdm

        from qace.engine.scheduler import batch_shapes
        from qace.metric.prompts import MAX_NEW_TOKENS
        from qace.models.visual_inputs import NUM_REGIONS, encoder_length

        c, m = self.config, self.models
        text_lengths = range(1, min(max_length, c.max_input_tokens) + 1)
        rows = c.max_batch_rows if max_rows is None else min(max_rows, c.max_batch_rows)
        text = batch_shapes(text_lengths, c.max_batch_tokens, rows)
        jobs = [(m.qg, text, None), (m.tqa, text, m.tqa_unanswerable)]
        if m.vqa is not None and hasattr(m.vqa, "warm_up"):
            visual_lengths = range(NUM_REGIONS + 1, encoder_length(m.vqa.model.config) + 1)
            visual = batch_shapes(visual_lengths, c.max_batch_tokens, rows)
            jobs.append((m.vqa, visual, m.vqa_unanswerable))
        jobs = [job for job in jobs if hasattr(job[0], "warm_up")]
        self.candidates.start()
        with m.device_lock, tqdm(desc="capturing CUDA graphs", unit=" shapes", disable=not c.progress) as bar:
            captured = sum(
                runner.warm_up(
                    shapes, max_new_tokens=MAX_NEW_TOKENS, unanswerable_id=uid, progress=bar.update
                )
                for runner, shapes, uid in jobs
            )
        self._warm_chain(rows)
        self.candidates.start(wait=True)
        freeze_heap()  # a reward call meets no collection that walks the models (`freeze_heap`)
        self._froze_heap = True
        return captured

    def _warm_chain(self, max_rows: int) -> None:
        """Score synthetic captions through every stage, their rows thrown away: on a GPU calls of 1, 64,
        256 and 1,024 captions (those whose batches stay within the ``max_rows`` rows the graphs were
        captured for: a caption gives up to about 8), whose batch sizes pick the matrix-product kernels
        a reward call's will (CUDA loads each at its first launch) and whose uploads size the pinned
        buffers; elsewhere one caption. QACE-Img reads zero region features for them, which leave no
        trace in the device's feature cache."""
        c = self.config
        whole = max_rows >= c.max_batch_rows  # every batch the scheduler cuts has a captured graph
        sizes = [n for n in _WARM_UP_SIZES if n == 1 or whole or n * 8 <= max_rows]
        sizes = sizes if c.device.startswith("cuda") else [1]
        image = _WARM_UP_IMAGE if c.variant == "img" else None
        for size in sizes:
            captions = _warm_up_captions(size)
            records = [
                Record(f"qace-warm-up-{i}", text, image, (text,) if c.variant == "ref" else None)
                for i, text in enumerate(captions)
            ]
            score_chunk(
                records,
                self.candidates(captions),
                self.models,
                c,
                self.matcher,
                features=_ZeroFeatures() if image else None,
                signature=self.signature,
            )
        resident = getattr(self.models.vqa, "features", None)
        if image and resident is not None:
            resident.discard([image])

    # -- scoring -------------------------------------------------------------------------------

    def score(
        self,
        captions: Sequence[str],
        references: Sequence[Sequence[str]] | None = None,
        image_ids: Sequence[str] | None = None,
        ids: Sequence[str] | None = None,
    ) -> list[dict[str, Any]]:
        """Score captions given as lists; one row per caption, in order.

        A caption that cannot be scored gets a row ``{"id", "error"}`` instead of raising, so one bad
        caption never costs the others.
        """
        ids = list_ids(captions, ids, references=references, image_ids=image_ids)
        records = [
            list_record(
                ids[i],
                captions[i],
                references[i] if references is not None else None,
                image_ids[i] if image_ids is not None else None,
            )
            for i in range(len(captions))
        ]
        return self._rows(records)

    def score_records(
        self, records: Iterable[Record | RecordError]
    ) -> Iterator[dict[str, Any] | RecordError]:
        """Stream results (rows or ``RecordError``) in input order, a chunk of captions at a time.

        While one chunk runs through the models, a prefetch thread reads the next chunk, validates it, loads
        its region features from the store and hands its captions to the candidate extractor, so reading,
        feature I/O and (with ``spacy_workers``) parsing overlap the GPU work. Input that fits one chunk (a
        reward call) stays one chunk; longer input is cut so that the first three chunks grow and the last
        ones shrink (`qace.chunks.Tapered`): the models start early on a small first chunk and are not left
        alone with a last big one. The cuts depend on the input only, so rows do not depend on
        ``host_workers`` or on timing. Input longer than `HOST_MIN_CHUNKS` chunks starts the host processes
        (`start_host_processes`); input of one chunk is scored in this process even once they run
        (`_choose_design`). Scorers in several threads share the device: their model stages take turns under
        the device lock (`qace.engine.device_lock`), their host work overlaps.
        """
        return self._stream(records, ramp=True)

    def score_committed(
        self, records: Iterable[Record | RecordError]
    ) -> Iterator[dict[str, Any] | RecordError]:
        """`score_records` in whole chunks from the first: files commit every ``chunk_size`` records
        and resume at a commit, and fp32 scores can differ in the last bit with a chunk's batch
        composition, so a resumed file equals an uninterrupted run only if both cut chunks alike."""
        return self._stream(records, ramp=False)

    def _stream(
        self, records: Iterable[Record | RecordError], *, ramp: bool
    ) -> Iterator[dict[str, Any] | RecordError]:
        """Results in input order, in chunks of ``chunk_size`` (with ``ramp``, `qace.chunks.Tapered`
        chunks for input longer than one); host processes for input longer than `HOST_MIN_CHUNKS`
        chunks."""
        if self._closed:
            raise HostWorkerError("this scorer was closed (QACE.close); build a new one to score again")
        size = self.config.chunk_size
        if self.config.variant == "img":
            records = map(_with_image_key, records)
        iterator: Iterator[Record | RecordError] = iter(records)
        head = list(itertools.islice(iterator, HOST_MIN_CHUNKS * size + 1))
        hosted = self._choose_design(len(head), size)
        iterator = itertools.chain(head, iterator)
        chunks: Callable[[], list[Record | RecordError]]
        if ramp and len(head) > size:
            chunks = Tapered(iterator, size).next_chunk
        else:  # whole chunks (files, and input that fits one chunk: a reward call)
            chunks = functools.partial(take, iterator, itertools.repeat(size))
        with ThreadPoolExecutor(1, thread_name_prefix="qace-prefetch") as prefetch:
            upcoming = prefetch.submit(self._prepare_next, chunks, not hosted)
            # with host processes ready: chunks in flight, one more than there are processes, so none
            # waits for its next chunk; else each chunk here, while the next one is prepared
            inflight: deque[Future[list[dict[str, Any] | RecordError]]] = deque()
            exhausted = False
            try:
                while True:
                    while not exhausted and len(inflight) < (self.host.size + 1 if self.host else 1):
                        prepared = upcoming.result()
                        if prepared is None:
                            exhausted = True
                            break
                        upcoming = prefetch.submit(self._prepare_next, chunks, not hosted)
                        host = self.host if hosted and self.host is not None and self.host.ready() else None
                        if host is None:
                            here: Future[list[dict[str, Any] | RecordError]] = Future()
                            here.set_result(self._finish(prepared))
                            inflight.append(here)
                            break  # given out before the next chunk is taken
                        inflight.append(self._dispatch(prepared, host))
                    if not inflight:
                        return
                    yield from inflight.popleft().result()
            except (HostWorkerError, KeyboardInterrupt):
                # a lost host process, or the user stopping the run: the chunks in flight cannot be
                # taken back, so the scorer closes (a new one scores again)
                if self.host is not None:
                    self.close()
                raise

    def _choose_design(self, records: int, size: int) -> bool:
        """Whether host processes score an input of ``records`` records (counted up to `HOST_MIN_CHUNKS`
        chunks and one more): input longer than `HOST_MIN_CHUNKS` chunks starts them (with the spaCy
        processes, in the background) and is; input of one chunk (a reward call) never is, since its
        chain gains nothing from them but the hand-over (on an H200, 256 captions: 205 ms p50 and 499 ms
        p99 through them, 178 and 195 here); input in between is where they were started (`QACE.
        start_host_processes`). Says which in the log (at info level the first time, then at debug)."""
        c = self.config
        if records > HOST_MIN_CHUNKS * size:
            self.candidates.start()
            self.start_host_processes()
        hosted = records > size and self.host is not None
        if c.host_workers > 0 or c.spacy_workers > 0:
            level = logging.DEBUG if self._design_said else logging.INFO
            self._design_said = True
            chunks = (
                "one chunk" if records <= size
                else f"at most {HOST_MIN_CHUNKS} chunks" if records <= HOST_MIN_CHUNKS * size
                else f"more than {HOST_MIN_CHUNKS} chunks"
            )  # fmt: skip
            design = (
                f"{c.host_workers} host processes and {c.spacy_workers} spaCy processes" if hosted
                else "this process"
            )  # fmt: skip
            log.log(level, "input of %s: scored by %s", chunks, design)
        return hosted

    def _dispatch(self, prepared: _Prepared, host: HostPool) -> Future[list[dict[str, Any] | RecordError]]:
        """A chunk's results from a host process, sent there once its candidates are extracted."""
        from qace.metric.host import ScoreChunk

        rows: Future[list[dict[str, Any] | RecordError]] = Future()

        def send(candidates: Future[list[list[str]]]) -> None:
            try:
                if not prepared.valid:
                    rows.set_result(_merge(prepared.results, []))
                    return
                task = host.submit(ScoreChunk(prepared.valid, candidates.result()))
            except BaseException as exc:  # noqa: BLE001 - raised where the rows are read
                rows.set_exception(exc)
                return
            task.add_done_callback(lambda done: _copy_outcome(done, rows, prepared.results))

        prepared.candidates.add_done_callback(send)
        return rows

    def _prepare_next(self, chunks: Callable[[], list[Record | RecordError]], here: bool) -> _Prepared | None:
        """The next chunk of records, prepared (``here``: to score here, a large one parsed in parts)."""
        with instrument.of(self).timer("prepare"):
            chunk = chunks()
            return self._prepare(chunk, here) if chunk else None

    def _prepare(self, chunk: list[Record | RecordError], here: bool) -> _Prepared:
        """Check the chunk's records and start their parse. QACE-Img reads the chunk's new images at once
        while the parse runs; records whose features fail are listed and the rest parsed again (from the
        parse's cache, once the first parse is done)."""
        results: list[dict[str, Any] | RecordError | None] = [
            item if isinstance(item, RecordError) else self._check(item) for item in chunk
        ]
        valid = _unlisted(chunk, results)
        parsing = self._parse(valid, here)
        features = self.features
        if self.config.variant == "img" and valid:
            if features is None:
                raise ConfigError("QACE-Img needs region features: pass features=PATH (or --features PATH)")
            features.load(r.image_id or "" for r in valid)
            for pos, item in enumerate(chunk):
                if results[pos] is None and isinstance(item, Record):
                    try:
                        features.get(item.image_id or "")
                    except FeatureError as exc:
                        results[pos] = RecordError(item.id, exc.reason, item.line)
            if len(kept := _unlisted(chunk, results)) < len(valid):
                wait([parsing[0]])
                valid, parsing = kept, self._parse(kept, here)
        return _Prepared(results, valid, *parsing)

    def _parse(
        self, records: list[Record], here: bool
    ) -> tuple[Future[list[list[str]]], CandidateParts | None]:
        captions = [r.caption for r in records]
        parts = self.candidates.submit_in_parts(captions) if here else None
        return (self.candidates.submit(captions) if parts is None else parts.joined(len(captions))), parts

    def _finish(self, prepared: _Prepared) -> list[dict[str, Any] | RecordError]:
        timer = instrument.of(self).timer  # benchmarks time the stages (`qace.engine.instrument`)
        # only the wait (for the first part, where there are parts): extraction started in the prefetch thread
        with timer("candidates"):
            parts = prepared.parts
            candidates = prepared.candidates.result() if parts is None else parts.first_known()
        with collector_paused():
            rows = score_chunk(
                prepared.valid,
                candidates,
                self.models,
                self.config,
                self.matcher,
                features=self.features,
                signature=self.signature,
                timer=timer,
            )
        return _merge(prepared.results, rows)

    def _check(self, record: Record) -> RecordError | None:
        """Why ``record`` cannot be scored by this variant (its features aside), as an error naming it."""
        img = self.config.variant == "img"
        reason = require(record, references=not img, image=img)
        if reason is None:
            reason = caption_problem(record.caption, self.config.max_caption_chars)
        return None if reason is None else RecordError(record.id, reason, record.line)


def _unlisted(
    chunk: list[Record | RecordError], results: list[dict[str, Any] | RecordError | None]
) -> list[Record]:
    """The chunk's records with no result yet: those to score."""
    return [r for r, result in zip(chunk, results, strict=True) if result is None and isinstance(r, Record)]


_WARM_UP_IMAGE = "\x00qace-warm-up"
"""`QACE._warm_chain`'s image id: no feature store holds it (ids are file names and keys)."""


_WARM_UP_SIZES = (1, 64, 256, 1024)
"""`QACE._warm_chain`'s calls on a GPU, in captions."""


def _warm_up_captions(n: int) -> list[str]:
    """``n`` distinct synthetic captions (up to 1,024)."""
    who = "a dog|two girls|a man|three boys|a woman|a black cat|an old man|two horses".split("|")
    does = "runs across|sits on|walks along|plays near|jumps over|stands by|looks at|rides".split("|")
    what = "the green grass|a red car|the beach|a wooden bench|the water|a street|a tree|snow".split("|")
    when = ["", " at night"]
    every = [f"{a} {b} {c}{d}" for d in when for a in who for b in does for c in what]
    return every[:n]


class _ZeroFeatures:
    """`QACE._warm_chain`'s feature store: zero regions for any image."""

    def get(self, image_id: str) -> np.ndarray:
        from qace.models.visual_inputs import NUM_REGIONS, REGION_DIM

        return np.zeros((NUM_REGIONS, REGION_DIM), dtype=np.float32)


def _shut_down(core: DeviceCore, host: HostPool) -> None:
    """Stop the engine core first (it finishes the batch it runs and takes no more), then the host
    processes."""
    core.stop()
    host.close()


def _merge(
    results: list[dict[str, Any] | RecordError | None], rows: list[dict[str, Any]]
) -> list[dict[str, Any] | RecordError]:
    """A chunk's results in input order: its records' errors, and its rows where they were scored."""
    scored = iter(rows)
    return [next(scored) if r is None else r for r in results]


def _copy_outcome(
    source: Future[list[dict[str, Any]]],
    target: Future[list[dict[str, Any] | RecordError]],
    results: list[dict[str, Any] | RecordError | None],
) -> None:
    """A host task's rows merged into its chunk's ``results`` (`_merge`), or its error, into ``target``."""
    exc = source.exception()
    if exc is not None:
        target.set_exception(exc)
    else:
        target.set_result(_merge(results, source.result()))


def bertscore_precision(config: QACEConfig) -> str:
    """The BERTScore encoder's precision: fp16 for half-precision engines on a GPU (see
    `qace.kernels.bertscore.BertScoreMatcher`), else fp32 as the reference (fp32 engines, CPUs)."""
    return "fp16" if config.device.startswith("cuda") and config.precision != "fp32" else "fp32"


def _with_image_key(record: Record | RecordError) -> Record | RecordError:
    """A record with an ``image`` file but no ``image_id`` is looked up by the file's stem, the id
    `qace features extract` gives it."""
    if isinstance(record, Record) and not record.image_id and record.image:
        from qace.features.extract import image_key

        return replace(record, image_id=image_key(None, record.image))
    return record


def score(
    captions: Sequence[str],
    references: Sequence[Sequence[str]] | None = None,
    image_ids: Sequence[str] | None = None,
    **kwargs: Any,
) -> list[dict[str, Any]]:
    """One-shot convenience: build a :class:`QACE` with ``kwargs`` and score the captions."""
    return QACE(**kwargs).score(captions, references=references, image_ids=image_ids)
