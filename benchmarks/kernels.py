"""Where each model's device time goes, kernel by kernel: the encoder pass and the decoding steps of QG,
TQA and VQA, each profiled on its own, with every kernel's achieved rate and what bounds it.

    python -m benchmarks.kernels --out benchmarks/results/kernels_h200.json   # one GPU, about 2 minutes
    python -m benchmarks.kernels --tiny --out /tmp/kernels-tiny.json          # CPU smoke run, seconds

Engine and workload as ``benchmarks/throughput.py``'s: random T5-base QG and TQA, T5-small Visual-T5 over
36 random region features, the same seeded forced outputs, bf16 (``--precision``), QACE-Img
(``--variant``), the device's speed settings.

1. Batches. One pass scores ``--captions`` distinct PASCAL-50S captions in whole chunks (every chunk at
   the size a long run's steady state gives it, `score_in_full_chunks`), and records every batch each
   model's runner decodes, as the engine planned it (input ids; Visual-T5's region features gathered on
   the device), through the hook that forces the outputs (`qace.engine.instrument`'s ``force_tokens``).
   The pass also captures the CUDA graphs of the batch shapes it meets.
2. Stages. Per role, the recorded batches run again one stage at a time: the encoder of every batch
   (`TorchRunner.encode`), then the decoder of every batch (its ``generate``: CUDA-graph replays as in the
   engine, the forced outputs uploaded beforehand) from the encoder states of the run before. Each stage
   runs three times: untimed (a graph dropped when the decoder's storage grew is captured again), timed
   with the device synchronised after each batch (``wall_ms``, as the engine's ``profile`` hook times its
   stages; a pass also overlaps the next batch's encoder with this one's decoding), then under
   torch.profiler (CPU and CUDA activity, operator shapes recorded; ``profiled_wall_ms``).
3. Kernels. Every CUDA kernel of a stage's profile (copies and memsets apart, as ``copy_ms``), grouped by
   name: calls, time and share of the stage's kernel time; the ``--top`` longest, the rest as ``other``.
   The profiler reports the kernels of a CUDA-graph replay one by one (CUPTI traces graph kernels). A
   decoder stage showing fewer kernels without an operator than one per layer and replay (every layer
   runs matrix products) would mean it did not: its table is then profiled again with graphs off
   (``cuda_graphs`` false, the role's ``graph_kernels_reported`` false).
4. Work. A kernel's FLOPs and bytes come from the aten operator that launched it, from its recorded
   shapes: 2 M N K for a matrix product, 4 x query elements x keys for attention; bytes are every operand
   read once and the output written once (an estimate; none for indexed operators, whose traffic the
   indices decide). A kernel replayed from a CUDA graph has no operator: its work comes from an eager
   twin, the decoder's step (`StaticT5Decoder.step`) run at each graph's shapes (bucket rows, bucket
   encoder length, self-attention window; a QA model's first step with its answerability) as many times
   as that graph was replayed, profiled the same way. A kernel name takes the twin's work where the twin
   launched it from operators exactly as often as the replays ran it; else its work stays unknown (the
   graphs' own bookkeeping, such as picking the forced token). Triton kernels (the decoder's one-query
   attention) run outside any operator: their work is unknown. ``work_known_share``: the share of a
   stage's kernel time whose rate is known.
5. Bound. A kernel under `SHORT_KERNEL_US` a call is ``launch`` bound (its fixed start and drain set its
   time); else ``compute`` or ``memory``, whichever roof its rates come nearer (``roof_fraction``, of
   ``peak``: dense bf16 989 TFLOP/s and HBM 4.8 TB/s on an H200), or by its kind where its work is
   unknown (matrix products compute, the rest memory). A stage is ``launch`` bound when its kernels keep
   the device busy less than `LAUNCH_BUSY` of its wall time, else bound as the kernels holding most of
   its kernel time.

Writes ``--out`` (default ``benchmarks/results/kernels_<gpu>.json``) and prints each stage's table in
Markdown, as docs/performance.md shows them.
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from benchmarks.run_info import default_result, gpu_name, record
from benchmarks.throughput import DATA, PEAK_BF16
from benchmarks.workload import (
    PASCAL_DISTINCT,
    add_engine_arguments,
    batch_tokens,
    distinct_captions,
    engine_defaults,
    flickr_workload,
    pascal_workload,
    score_in_full_chunks,
    workload_models,
    workload_scorer,
)
from qace.api import QACE
from qace.engine import instrument
from qace.engine.batches import TextBatch, VisualBatch
from qace.engine.instrument import cuda_sync
from qace.engine.pinned_upload import to_device
from qace.families.t5.decode_graphs import bucket_length, bucket_rows, windows

ROLES = ("qg", "tqa", "vqa")
PEAK_HBM = {"H100": 3.35e12, "H200": 4.8e12}  # HBM bytes/s, vendor datasheet (SXM)
SHORT_KERNEL_US = 4.0
"""Kernels shorter than this a call are ``launch`` bound: about a kernel's fixed start and drain."""
LAUNCH_BUSY = 0.5
"""A stage whose kernels keep the device busy less than this fraction of its wall is ``launch`` bound."""

GEMMS = {
    "aten::mm": 0, "aten::addmm": 1, "aten::addmm_": 1, "aten::_addmm_activation": 1, "aten::bmm": 0,
    "aten::baddbmm": 1, "aten::baddbmm_": 1,
}  # fmt: skip
"""Matrix-product operators -> the position of their first factor among the recorded inputs."""
ATTENTION = {
    "aten::_scaled_dot_product_efficient_attention": 2, "aten::_efficient_attention_forward": 1,
    "aten::_scaled_dot_product_flash_attention": 2, "aten::_flash_attention_forward": 1,
    "aten::_scaled_dot_product_flash_attention_for_cpu": 2,
}  # fmt: skip
"""Attention operators -> the keys' sequence dimension (``(B, H, S, D)`` or ``(B, S, H, D)`` layouts)."""
INDEXED = ("index", "gather", "scatter", "embedding", "take", "put")
"""Operators whose traffic their indices decide: no byte estimate."""
WRITE_ONLY = {"aten::fill_", "aten::zero_", "aten::copy_"}
"""In-place operators that overwrite their first operand without reading it."""
ITEM_BYTES = {
    "float": 4, "double": 8, "c10::BFloat16": 2, "c10::Half": 2, "long int": 8, "int": 4, "short int": 2,
    "bool": 1, "signed char": 1, "unsigned char": 1,
}  # fmt: skip
"""Bytes per element of the dtypes the profiler records (tensor operands only)."""
KINDS = (
    ("attention", ("attention", "attend", "fmha", "flash")),
    ("gemm", ("gemm", "nvjet", "xmma", "cublas", "cutlass", "wgmma")),
    ("norm", ("norm",)),
)
"""Kernel kinds by the words of their operator's or their own name (first match); else ``other``."""


@dataclass(frozen=True)
class Kernel:
    """One kernel's run on the GPU (on the CPU, one operator's own time) and the work of the aten
    operator that launched it: ``op`` None where none did (a CUDA-graph replay, a Triton kernel), and
    ``flops`` / ``bytes`` None where unknown."""

    name: str
    ns: int
    op: str | None = None
    flops: float | None = None
    bytes: float | None = None


@dataclass(frozen=True)
class Peaks:
    """The device's roofs: dense FLOP/s at the run's precision and HBM bytes/s (None: unknown)."""

    flops: float | None
    bytes: float | None


class Recorded(NamedTuple):
    """A batch a runner decoded in the recording pass, and its decoding steps."""

    batch: TextBatch | VisualBatch
    steps: int


class DecodeInput(NamedTuple):
    """A decoder stage's inputs for one batch: encoder states, their mask, steps and forced outputs."""

    hidden: torch.Tensor
    mask: torch.Tensor
    steps: int
    forced: torch.Tensor


class GraphKey(NamedTuple):
    """One captured decoding step: bucket rows and encoder length, steps, self-attention window, and
    whether it is a QA model's first step (which also writes the answerability)."""

    rows: int
    length: int
    steps: int
    window: int
    first: bool


def runners(scorer: QACE) -> dict[str, Any]:
    """The scorer's model runners by role (QG, TQA and, for QACE-Img, VQA)."""
    return {role: getattr(scorer.models, role) for role in ROLES if getattr(scorer.models, role, None)}


def record_batches(scorer: QACE, records: Sequence[Any]) -> dict[str, list[Recorded]]:
    """Score ``records`` once and return every batch each runner decoded, in order (module docstring, 1);
    the runners keep forcing the workload's outputs afterwards."""
    recorded: dict[str, list[Recorded]] = {role: [] for role in runners(scorer)}
    for role, runner in runners(scorer).items():

        def force(batch: TextBatch | VisualBatch, steps: int, role: str = role) -> np.ndarray:
            recorded[role].append(Recorded(batch, steps))
            return batch_tokens(role)(batch, steps)

        instrument.attach(runner, force_tokens=force)
    try:
        score_in_full_chunks(scorer, records)
    finally:
        for role, runner in runners(scorer).items():
            instrument.attach(runner, force_tokens=batch_tokens(role))
    return recorded


def timed(run: Callable[[int], object], n: int) -> float:
    """Seconds of ``run(i)`` for ``i`` in ``range(n)``, the device synchronised around each."""
    total = 0.0
    for i in range(n):
        cuda_sync()
        start = time.perf_counter()
        run(i)
        cuda_sync()
        total += time.perf_counter() - start
    return total


def profiled(run: Callable[[int], object], n: int, on_gpu: bool) -> tuple[list[Kernel], int, float]:
    """`timed` under torch.profiler: the kernels (`kernels_of`), the copies' nanoseconds, the seconds."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with profile(activities=activities, record_shapes=True) as prof:
        seconds = timed(run, n)
    kernels, copies = kernels_of(prof, on_gpu)
    return kernels, copies, seconds


def kernels_of(prof: Any, on_gpu: bool) -> tuple[list[Kernel], int]:
    """The kernels of a finished profile, each with its launching operator's work, and the nanoseconds
    of its copies and memsets; on the CPU every operator's own time (its span less its children's)."""
    from torch.autograd import DeviceType

    events = prof.profiler.kineto_results.events()
    ops = [e for e in events if e.device_type() == DeviceType.CPU and e.linked_correlation_id() == 0]
    if not on_gpu:
        return own_times(ops), 0
    by_id = {e.correlation_id(): e for e in ops}
    kernels, copies = [], 0
    for e in events:
        if e.device_type() != DeviceType.CUDA:
            continue
        if e.name().startswith(("Memcpy", "Memset")):
            copies += e.duration_ns()
        else:
            kernels.append(launched(e.name(), e.duration_ns(), by_id.get(e.linked_correlation_id())))
    return kernels, copies


@dataclass
class _Open:
    event: Any
    end: int
    children: int = 0


def own_times(ops: Sequence[Any]) -> list[Kernel]:
    """Each operator event's own time (its span less its direct children's on the same thread), as a
    `Kernel` named after it: the CPU's stand-in for kernels."""
    threads: dict[int, list[Any]] = defaultdict(list)
    for e in ops:
        threads[e.start_thread_id()].append(e)
    return [k for events in threads.values() for k in _own_times_of_thread(events)]


def _own_times_of_thread(events: list[Any]) -> list[Kernel]:
    out: list[Kernel] = []
    stack: list[_Open] = []
    for e in [*sorted(events, key=lambda e: (e.start_ns(), -e.duration_ns())), None]:
        while stack and (e is None or stack[-1].end <= e.start_ns()):
            done = stack.pop()
            own = done.event.duration_ns() - done.children
            if own > 0:
                out.append(launched(done.event.name(), own, done.event))
        if e is not None:
            if stack:
                stack[-1].children += e.duration_ns()
            stack.append(_Open(e, e.start_ns() + e.duration_ns()))
    return out


def launched(name: str, ns: int, op: Any) -> Kernel:
    """A kernel ``name`` of ``ns`` nanoseconds launched by the profiler event ``op`` (None: none); only
    aten operators give it work."""
    if op is None or not op.name().startswith("aten::"):
        return Kernel(name, ns)
    flops, nbytes = op_work(op.name(), op.shapes(), op.dtypes())
    return Kernel(name, ns, op.name(), flops, nbytes)


def op_work(
    name: str, shapes: Sequence[Sequence[int]], dtypes: Sequence[str]
) -> tuple[float | None, float | None]:
    """FLOPs and bytes of one aten operator call from its recorded input shapes and dtypes (module
    docstring, 4): FLOPs for matrix products and attention only, else None; bytes None for indexed
    operators and where the shapes were not recorded."""
    dims = [list(shape) for shape in shapes]
    sizes = [int(np.prod(d)) * ITEM_BYTES[t] for d, t in zip(dims, dtypes, strict=False) if t in ITEM_BYTES]
    if name in GEMMS:  # the addend (if any) and both factors read, the product written once
        at = GEMMS[name]
        if len(dims) < at + 2 or min(len(dims[at]), len(dims[at + 1])) < 2:
            return None, None
        a, n = dims[at], dims[at + 1][-1]
        item = ITEM_BYTES.get(dtypes[at], 2)
        read = sum(int(np.prod(dims[i])) * ITEM_BYTES.get(dtypes[i], item) for i in range(at + 2))
        return 2.0 * float(np.prod(a)) * n, float(read + int(np.prod(a[:-1])) * n * item)
    if name in ATTENTION:  # q, k, v (and a bias) read, an output the size of q written
        if len(dims) < 2 or min(len(dims[0]), len(dims[1])) < 4:
            return None, None
        return 4.0 * float(np.prod(dims[0])) * dims[1][ATTENTION[name]], float(sum(sizes) + sizes[0])
    base = name.split("::")[-1]
    if any(word in base for word in INDEXED) or not sizes:
        return None, None
    if name in WRITE_ONLY:
        return None, float(sum(sizes[1:]) + sizes[0])
    in_place = base.endswith("_") and not base.endswith("__")
    return None, float(sum(sizes) + (sizes[0] if in_place else max(sizes)))


def replay_keys(rows: int, length: int, steps: int, replays: int, first: bool) -> list[GraphKey]:
    """The graph each of a batch's ``replays`` step replays ran, in order, for a batch of ``rows`` rows
    whose encoder states are ``length`` long (`qace.families.t5.decode_graphs`' loop): step ``s`` that of
    the first self-attention window above ``s``; a QA model's (``first``) step 0 its own."""
    sizes = windows(steps)
    r, n = bucket_rows(rows), bucket_length(length)
    return [GraphKey(r, n, steps, next(w for w in sizes if s < w), first and s == 0) for s in range(replays)]


def twin_kernels(
    decoder: Any, replays: Counter[GraphKey], like: torch.Tensor, unanswerable_id: int | None, on_gpu: bool
) -> list[Kernel]:
    """The kernels of the decoder's step run eagerly at each graph's shapes as many times as
    ``replays`` counts (module docstring, 4), on buffers laid out as the graphs' (views of flat storage
    allocated before the profile, so the profile holds the steps' kernels alone)."""
    from torch.profiler import ProfilerActivity, profile

    if not replays:
        return []
    layers, heads, d_kv = len(decoder.layers), decoder.heads, decoder.d_kv
    rows = max(k.rows for k in replays)
    steps = max(k.steps for k in replays)
    tokens = max(k.rows * k.length for k in replays)
    self_kv = like.new_zeros(2, layers, rows * heads * steps * d_kv)
    cross_kv = like.new_zeros(tokens, 2 * layers * heads * d_kv)
    cross_bias = like.new_zeros(tokens)
    token = torch.full((rows,), decoder.start_id, dtype=torch.long, device=like.device)
    pos = torch.zeros(1, dtype=torch.long, device=like.device)
    biases = {s: decoder.self_bias(s, like.device, like.dtype) for s in {k.steps for k in replays}}

    def step(key: GraphKey) -> None:
        shape = (key.rows, heads, key.steps, d_kv)
        n_kv = key.rows * heads * key.steps * d_kv
        keys = [self_kv[0, i, :n_kv].view(shape)[:, :, : key.window] for i in range(layers)]
        values = [self_kv[1, i, :n_kv].view(shape)[:, :, : key.window] for i in range(layers)]
        cross = decoder.cross_views(cross_kv[: key.rows * key.length].view(key.rows, key.length, -1))
        bias = cross_bias[: key.rows * key.length].view(key.rows, 1, 1, key.length)
        self_bias = biases[key.steps][..., : key.window]
        logits = decoder.step(token[: key.rows], pos, keys, values, cross, bias, self_bias)
        if key.first:
            decoder.answerability(logits, unanswerable_id)

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    with torch.inference_mode(), profile(activities=activities, record_shapes=True) as prof:
        for key, n in sorted(replays.items()):
            for _ in range(n):
                step(key)
        cuda_sync()
    return kernels_of(prof, on_gpu)[0]


def with_twin_work(kernels: Sequence[Kernel], twin: Sequence[Kernel]) -> list[Kernel]:
    """``kernels`` where each kernel without an operator (replayed from a CUDA graph) takes its work from
    the eager ``twin``: per name, the twin's operator and work per call, where the twin launched that
    name from operators exactly as many times as ``kernels`` hold it without one, and never without."""
    replayed = Counter(k.name for k in kernels if k.op is None)
    linked: dict[str, list[Kernel]] = defaultdict(list)
    unlinked: Counter[str] = Counter()
    for k in twin:
        if k.op is None:
            unlinked[k.name] += 1
        else:
            linked[k.name].append(k)
    work: dict[str, tuple[str, float | None, float | None]] = {}
    for name, calls in replayed.items():
        same = linked.get(name, [])
        if len(same) != calls or unlinked[name]:
            continue
        flops = [k.flops for k in same]
        nbytes = [k.bytes for k in same]
        work[name] = (
            Counter(k.op for k in same).most_common(1)[0][0],
            None if None in flops else sum(f for f in flops if f is not None) / calls,
            None if None in nbytes else sum(b for b in nbytes if b is not None) / calls,
        )
    return [
        replace(k, op=work[k.name][0], flops=work[k.name][1], bytes=work[k.name][2])
        if k.op is None and k.name in work
        else k
        for k in kernels
    ]


TRITON_MODULES = (
    "qace.families.t5.decode_attention",
    "qace.families.t5.encoder_attention",
    "qace.families.t5.fp16_guard",
    "qace.families.t5.rms_norm",
    "qace.features.half_roi_pool",
)
"""Every qace module that defines a Triton kernel (a test holds the list to the source)."""


def triton_names() -> dict[str, str]:
    """qace's Triton kernels by the name the profiler shows (their function's), as ``module.function``
    (none where Triton is absent). The profiler shows only the function's name, so two kernels of one
    name would be confused: refused."""
    names: dict[str, str] = {}
    for module_name in TRITON_MODULES:
        for attr, value in vars(importlib.import_module(module_name)).items():
            if type(value).__name__ != "JITFunction":
                continue
            name = f"{module_name.rsplit('.', 1)[-1]}.{attr}"
            if attr in names:
                raise ValueError(f"two Triton kernels named {attr}: {names[attr]} and {name}")
            names[attr] = name
    return names


def short_name(name: str, triton: dict[str, str]) -> str:
    """A kernel's name for a table: a qace Triton kernel's ``module.function``; else the function's last
    name without ``void``, namespaces and arguments, with the functor or inner kernel its template names
    (``vectorized_elementwise_kernel<FillFunctor>``), at most 72 characters."""
    if name in triton:
        return triton[name]
    text = name.replace("(anonymous namespace)::", "").removeprefix("void ").strip()
    head = re.match(r"[\w:]+", text)
    if head is None:
        return text[:72]
    base = head.group(0).split("::")[-1]
    rest = text[head.end() :]
    inner = re.search(r"(\w*(?:Functor|_kernel_cuda|gemm)\w*)", rest) if rest.startswith("<") else None
    return (f"{base}<{inner.group(1).split('::')[-1]}>" if inner else base)[:72]


def kind_of(op: str | None, name: str) -> str:
    """``gemm``, ``attention``, ``norm`` or ``other``: by the launching operator, else by `KINDS`' words."""
    if op in GEMMS:
        return "gemm"
    if op in ATTENTION:
        return "attention"
    text = f"{op or ''} {name}".lower()
    return next((kind for kind, words in KINDS if any(w in text for w in words)), "other")


def bound_of(
    kind: str, mean_us: float, flop_rate: float | None, byte_rate: float | None, peaks: Peaks
) -> tuple[str, float | None]:
    """A kernel's bound and the fraction of the nearer roof its rates reach (module docstring, 5)."""
    compute = flop_rate / peaks.flops if flop_rate is not None and peaks.flops else None
    memory = byte_rate / peaks.bytes if byte_rate is not None and peaks.bytes else None
    known = [f for f in (compute, memory) if f is not None]
    roof = max(known) if known else None
    if mean_us < SHORT_KERNEL_US:
        return "launch", roof
    if not known:
        return ("compute" if kind == "gemm" else "memory"), None
    return ("compute" if (compute or 0.0) >= (memory or 0.0) else "memory"), roof


def _row(
    name: str, kernels: Sequence[Kernel], total_ns: int, peaks: Peaks, triton: dict[str, str]
) -> dict[str, Any]:
    """One table row: the kernels of one name (see `stage_table`)."""
    ns = sum(k.ns for k in kernels)
    seconds = ns / 1e9
    flops = None if any(k.flops is None for k in kernels) else sum(k.flops or 0.0 for k in kernels)
    nbytes = None if any(k.bytes is None for k in kernels) else sum(k.bytes or 0.0 for k in kernels)
    ops = Counter(k.op for k in kernels if k.op)
    op = ops.most_common(1)[0][0] if ops else None
    kind = kind_of(op, name)
    flop_rate = flops / seconds if flops is not None and seconds else None
    byte_rate = nbytes / seconds if nbytes is not None and seconds else None
    mean_us = ns / len(kernels) / 1e3
    bound, roof = bound_of(kind, mean_us, flop_rate, byte_rate, peaks)
    return {
        "kernel": short_name(name, triton),
        "op": op,
        "kind": kind,
        "calls": len(kernels),
        "total_ms": ns / 1e6,
        "mean_us": mean_us,
        "share": ns / total_ns if total_ns else 0.0,
        "tflops": None if flop_rate is None else flop_rate / 1e12,
        "gbps": None if byte_rate is None else byte_rate / 1e9,
        "roof_fraction": roof,
        "bound": bound,
        "flops": flops,
        "bytes": nbytes,
        "name": name,
    }


def stage_table(
    kernels: Sequence[Kernel], copies_ns: int, wall_s: float, profiled_wall_s: float, top: int, peaks: Peaks
) -> dict[str, Any]:
    """A stage's kernels summed and ranked: totals, the ``top`` names by time and the rest as ``other``
    (their shares add up to 1), the stage's counted FLOPs over its wall and its bound."""
    total = sum(k.ns for k in kernels)
    groups: dict[str, list[Kernel]] = defaultdict(list)
    for k in kernels:
        groups[k.name].append(k)
    triton = triton_names()
    rows = sorted(
        (_row(n, ks, total, peaks, triton) for n, ks in groups.items()), key=lambda r: -r["total_ms"]
    )
    rest = rows[top:]
    busy = total / 1e9 / wall_s if wall_s else 0.0
    by_bound: Counter[str] = Counter()
    for r in rows:
        by_bound[r["bound"]] += r["total_ms"]
    flops = sum(k.flops for k in kernels if k.flops is not None)
    known = sum(r["total_ms"] for r in rows if r["tflops"] is not None or r["gbps"] is not None)
    return {
        "wall_ms": 1000 * wall_s,
        "profiled_wall_ms": 1000 * profiled_wall_s,
        "kernel_ms": total / 1e6,
        "copy_ms": copies_ns / 1e6,
        "busy_fraction": busy,
        "kernels": len(kernels),
        "distinct_kernels": len(rows),
        "flops": flops,
        "tflops": flops / wall_s / 1e12 if wall_s else 0.0,
        "work_known_share": known / (total / 1e6) if total else 0.0,
        "bound": "launch" if busy < LAUNCH_BUSY else (by_bound.most_common(1)[0][0] if rows else "launch"),
        "top": rows[:top],
        "other": {
            "kernels": len(rest),
            "calls": sum(r["calls"] for r in rest),
            "total_ms": sum(r["total_ms"] for r in rest),
            "share": sum(r["share"] for r in rest),
        },
    }


def encoder_stage(
    runner: Any, batches: Sequence[Recorded], on_gpu: bool, top: int, peaks: Peaks
) -> tuple[dict[str, Any], list[tuple[torch.Tensor, torch.Tensor]]]:
    """The encoder stage of one role (module docstring, 2) and the encoder states of every batch."""
    encoded: list[Any] = [None] * len(batches)

    def run(i: int) -> None:
        encoded[i] = runner.encode(batches[i].batch)

    timed(run, len(batches))
    wall = timed(run, len(batches))
    kernels, copies, profiled_wall = profiled(run, len(batches), on_gpu)
    return stage_table(kernels, copies, wall, profiled_wall, top, peaks), encoded


def decoder_stage(
    runner: Any,
    inputs: Sequence[DecodeInput],
    unanswerable_id: int | None,
    on_gpu: bool,
    top: int,
    peaks: Peaks,
    *,
    graphs: bool,
) -> dict[str, Any] | None:
    """The decoder stage of one role (module docstring, 2-4), with CUDA graphs where ``graphs`` and the
    device has them; None when graph replays ran but the profile did not show their kernels."""
    decoder = runner.decoder
    before = decoder.cuda_graphs
    decoder.cuda_graphs = graphs
    graphed = graphs and on_gpu
    replays: Counter[GraphKey] = Counter()

    def run(i: int) -> None:
        x = inputs[i]
        decoder.generate(
            x.hidden, x.mask, max_new_tokens=x.steps, unanswerable_id=unanswerable_id, forced=x.forced
        )

    try:
        for i, x in enumerate(inputs):  # the untimed run; it counts each graph's replays
            row_steps = decoder.row_steps
            run(i)
            if graphed:
                rows, length = x.mask.shape
                n = (decoder.row_steps - row_steps) // bucket_rows(rows)
                replays.update(replay_keys(rows, length, x.steps, n, unanswerable_id is not None))
        wall = timed(run, len(inputs))
        kernels, copies, profiled_wall = profiled(run, len(inputs), on_gpu)
    finally:
        decoder.cuda_graphs = before
    replayed = sum(1 for k in kernels if k.op is None)
    if graphed and replayed < replays.total() * len(decoder.layers):  # a step has a product a layer
        return None
    given = 0
    if graphed:
        twin = twin_kernels(decoder, replays, inputs[0].hidden, unanswerable_id, on_gpu)
        kernels = with_twin_work(kernels, twin)
        given = sum(1 for k in kernels if k.op is not None) - (len(kernels) - replayed)
    table = stage_table(kernels, copies, wall, profiled_wall, top, peaks)
    return {
        "cuda_graphs": graphed,
        "graph_replays": replays.total(),
        "graphs_replayed": len(replays),
        "kernels_without_operator": replayed,
        "kernels_given_twin_work": given,
        **table,
    }


def profile_role(
    scorer: QACE, role: str, batches: Sequence[Recorded], on_gpu: bool, top: int, peaks: Peaks
) -> dict[str, Any]:
    """Both stages of ``role`` on its recorded ``batches`` (module docstring, 2-5)."""
    runner = runners(scorer)[role]
    unanswerable_id = None if role == "qg" else getattr(scorer.models, f"{role}_unanswerable")
    encoder, encoded = encoder_stage(runner, batches, on_gpu, top, peaks)
    inputs = [
        DecodeInput(hidden, mask, b.steps, to_device(batch_tokens(role)(b.batch, b.steps), runner.device))
        for (hidden, mask), b in zip(encoded, batches, strict=True)
    ]
    decoder = decoder_stage(runner, inputs, unanswerable_id, on_gpu, top, peaks, graphs=True)
    graph_kernels_reported = decoder is not None
    if decoder is None:  # the profiler missed the graphs' kernels: the table comes from eager decoding
        decoder = decoder_stage(runner, inputs, unanswerable_id, on_gpu, top, peaks, graphs=False)
        assert decoder is not None
    return {
        "batches": len(batches),
        "rows": sum(len(b.batch.input_ids) for b in batches),
        "encoder_tokens_padded": sum(int(b.batch.attention_mask.size) for b in batches),
        "decoder_steps": max(b.steps for b in batches),
        "graph_kernels_reported": graph_kernels_reported if on_gpu else None,
        "encoder": encoder,
        "decoder": decoder,
    }


def peaks_for(device: str, precision: str) -> Peaks:
    """The roofs of ``device`` (`PEAK_BF16`, `PEAK_HBM`); FLOP/s only for half precision."""
    gpu = gpu_name(device) or ""
    flops = (
        next((v for k, v in PEAK_BF16.items() if k in gpu), None) if precision in ("bf16", "fp16") else None
    )
    return Peaks(flops, next((v for k, v in PEAK_HBM.items() if k in gpu), None))


def _rate(value: float | None) -> str:
    return "" if value is None else f"{value:,.1f}"


def markdown(report: dict[str, Any]) -> str:
    """Each role and stage of ``report`` as a heading line and a Markdown table of its top kernels."""
    lines: list[str] = []
    for role, entry in report["roles"].items():
        for stage in ("encoder", "decoder"):
            s = entry[stage]
            lines += [
                f"**{role} {stage}**: {s['wall_ms']:.1f} ms wall, {s['kernel_ms']:.1f} ms of kernels "
                f"({s['busy_fraction']:.0%} busy, {s['kernels']} kernels), {s['tflops']:.1f} TFLOP/s "
                f"counted, bound: {s['bound']}",
                "",
                "| kernel | operator | calls | ms | share | TFLOP/s | GB/s | bound |",
                "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |",
            ]
            lines += [
                f"| `{r['kernel']}` | {r['op'] or ''} | {r['calls']} | {r['total_ms']:.2f} "
                f"| {r['share']:.1%} | {_rate(r['tflops'])} | {_rate(r['gbps'])} | {r['bound']} |"
                for r in s["top"]
            ]
            o = s["other"]
            lines += [
                f"| other ({o['kernels']} kernels) | | {o['calls']} | {o['total_ms']:.2f} | {o['share']:.1%} "
                "| | | |",
                "",
            ]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default=None, help="default: benchmarks/results/kernels_<gpu>.json")
    parser.add_argument("--variant", default="img", choices=["img", "ref"], help="ref: QG and TQA only")
    parser.add_argument("--captions", type=int, default=None, help="distinct captions (default 4,096)")
    parser.add_argument("--top", type=int, default=10, help="kernels listed per stage")
    parser.add_argument("--seed", type=int, default=0)
    add_engine_arguments(parser)
    args = parser.parse_args(argv)
    engine_defaults(args)
    args.captions = args.captions or (16 if args.tiny else 4096)
    if not 1 <= args.captions <= PASCAL_DISTINCT:
        parser.error(f"--captions must be between 1 and PASCAL-50S's {PASCAL_DISTINCT} distinct captions")
    if args.top < 1:
        parser.error("--top must be positive")
    if not DATA.is_dir():
        parser.error(f"shared data not found at {DATA}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    start = time.perf_counter()
    pascal = pascal_workload(DATA, PASCAL_DISTINCT, seed=args.seed)
    records = pascal[: args.captions]
    models_dir = workload_models(args, [*pascal, *flickr_workload(DATA)], "qace-kernels-", DATA)
    scorer = workload_scorer(
        models_dir, args.variant, device=args.device, precision=args.precision, args=args
    )
    on_gpu = args.device.startswith("cuda")
    peaks = peaks_for(args.device, args.precision)
    try:
        pass_start = time.perf_counter()
        recorded = record_batches(scorer, records)
        pass_seconds = time.perf_counter() - pass_start
        roles: dict[str, Any] = {}
        for role in runners(scorer):
            roles[role] = profile_role(scorer, role, recorded.pop(role), on_gpu, args.top, peaks)
            counts = {k: v for k, v in roles[role].items() if k not in ("encoder", "decoder")}
            print(f"{role}: {json.dumps(counts)}", flush=True)
    finally:
        scorer.close()
    out = Path(args.out or default_result("kernels", gpu_name(args.device)))
    report = {
        **record("benchmarks.kernels", argv, device=args.device, packages=("transformers", "triton")),
        "precision": args.precision,
        "tiny": args.tiny,
        "variant": args.variant,
        "settings": {
            "batch_rows": args.batch_rows,
            "batch_tokens": args.batch_tokens,
            "chunk_size": args.chunk_size,
            "host_workers": scorer.config.host_workers,
            "top": args.top,
        },
        "models": "tiny random T5s (a smoke run: numbers mean nothing)"
        if args.tiny
        else "random T5-base QG/TQA, random T5-small Visual-T5, random features, forced seeded outputs "
        "(questions 8-16, answers 2-4 tokens)",
        "workload": {
            "name": "PASCAL-50S distinct human captions, 5 other captions of the image as references",
            "captions": len(records),
            "distinct_captions": distinct_captions(records),
            "seed": args.seed,
        },
        "peak": {"flops": peaks.flops, "hbm_bytes_per_s": peaks.bytes},
        "short_kernel_us": SHORT_KERNEL_US,
        "launch_busy_fraction": LAUNCH_BUSY,
        "recording_pass_seconds": pass_seconds,
        "run_seconds": time.perf_counter() - start,
        "roles": roles,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(markdown(report))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
