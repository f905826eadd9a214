"""The one greedy decoding loop: every backend runs it with its own decoder step, on its own arrays.

`greedy_decode` owns the bookkeeping, backend-neutral; a backend (`Steps`) runs one decoder step and
keeps its caches. Per step:

- the backend's step for the rows still held, fed each row's previous token (the decoder start first);
- at step 0, when asked, the answerability of the step's output (``1 - P(unanswerable)``);
- each row's next token: the step's greedy choice (argmax), or the forced one (benchmarks);
- a row that has ended writes ``-1`` and is fed EOS until it is dropped; the loop stops as soon as every
  row has ended;
- once the ended rows are at least half of those held, they are dropped, from the backend's caches too
  (each drop copies the caches, so it is amortised: CTranslate2's trick).

The caller turns the ``(rows, steps)`` output into ids cut at EOS (`qace.engine.batches.cut_at_eos`).
Backends: the ONNX runner on the CPU (numpy on the host, its graphs' K/V on the session's device) and
the T5 family's eager decoder (torch, on the model's device). The CUDA-graph decodings, the T5 family's
(`qace.families.t5.decode_graphs`) and ONNX Runtime's (the exported ``decoder_static`` step,
`qace.engine.onnx_static`), do not run this loop: there the same rules are device operations captured
inside each step's graph, on fixed-shape static buffers (a graph cannot hand control back to the host
between its kernels, and its shapes cannot shrink, so no row is dropped); only the stop test is left
to the host. They keep the contract (``-1`` after a row ended, answerability at step 0) and the EOS
cut.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np


class Arrays(Protocol):
    """The array operations the loop needs, on the backend's device (int64 ids, bool flags)."""

    def full(self, shape: int | tuple[int, int], value: int | bool) -> Any:
        """An array of ``value``: bool flags for a bool, int64 ids for an int."""
        ...

    def arange(self, n: int) -> Any: ...

    def where(self, condition: Any, a: Any, b: Any) -> Any: ...

    def nonzero(self, flags: Any) -> Any:
        """Positions of the true ``flags`` (1-D), usable as an index."""
        ...


class Steps(Protocol):
    """One batch's decoder as the loop drives it; its state (caches, encoder states) lives inside."""

    @property
    def arrays(self) -> Arrays:
        """The backend's array operations (where its tokens and flags live)."""
        ...

    def step(self, step: int, token: Any) -> Any:
        """Run decoding step ``step`` for the rows still held, fed their previous tokens ``(rows,)``."""
        ...

    def choose(self, output: Any) -> Any:
        """Each row's greedy next token from a step's output."""
        ...

    def answerability(self, output: Any, unanswerable_id: int) -> Any:
        """``1 - P(unanswerable_id)`` per row from step 0's output."""
        ...

    def keep(self, rows: Any) -> None:
        """Keep only ``rows`` (positions among the rows held) in the caches."""
        ...


def greedy_decode(
    steps: Steps,
    rows: int,
    *,
    start_id: int,
    eos_id: int,
    max_new_tokens: int,
    unanswerable_id: int | None = None,
    forced: Any = None,
    meanwhile: Callable[[], object] | None = None,
) -> tuple[Any, Any]:
    """Greedy tokens ``(rows, max_new_tokens)``, ``-1`` after a row ended, and the first step's
    answerability (None unless ``unanswerable_id``), as the backend's arrays (see module docstring).
    ``meanwhile`` is called once, after the first step's work is queued and before its count of rows
    left is read.

    ``forced`` (benchmarks only, ``(rows, max_new_tokens)``) replaces each step's greedy choice, so
    random-weight models can be timed on realistic outputs (varied, EOS-terminated) with all the work done.
    """
    arrays = steps.arrays
    alive = arrays.arange(rows)
    finished = arrays.full(rows, False)
    token = arrays.full(rows, start_id)
    out = arrays.full((rows, max_new_tokens), -1)
    answerability = None
    for step in range(max_new_tokens):
        output = steps.step(step, token)
        if step == 0 and unanswerable_id is not None:
            answerability = steps.answerability(output, unanswerable_id)
        token = steps.choose(output) if forced is None else forced[alive, step]
        out[alive, step] = arrays.where(finished, -1, token)
        finished |= token == eos_id
        token = arrays.where(finished, eos_id, token)  # ended rows idle until dropped
        if step == 0 and meanwhile is not None:
            meanwhile()
        n_alive = int((~finished).sum())
        if n_alive == 0:
            break
        if n_alive <= len(alive) // 2:
            keep = arrays.nonzero(~finished)
            alive, token, finished = alive[keep], token[keep], finished[keep]
            steps.keep(keep)
    return out, answerability


class NumpyArrays:
    """`Arrays` on the host."""

    def full(self, shape: int | tuple[int, int], value: int | bool) -> np.ndarray:
        return np.full(shape, value, dtype=bool if isinstance(value, bool) else np.int64)

    def arange(self, n: int) -> np.ndarray:
        return np.arange(n)

    def where(self, condition: Any, a: Any, b: Any) -> np.ndarray:
        return np.where(condition, a, b)

    def nonzero(self, flags: np.ndarray) -> np.ndarray:
        return np.flatnonzero(flags)


class TorchArrays:
    """`Arrays` as torch tensors on ``device`` (torch is imported here only when one is made)."""

    def __init__(self, device: Any) -> None:
        import torch

        self.torch, self.device = torch, device

    def full(self, shape: int | tuple[int, int], value: int | bool) -> Any:
        dtype = self.torch.bool if isinstance(value, bool) else self.torch.long
        size = (shape,) if isinstance(shape, int) else shape
        return self.torch.full(size, value, dtype=dtype, device=self.device)

    def arange(self, n: int) -> Any:
        return self.torch.arange(n, device=self.device)

    def where(self, condition: Any, a: Any, b: Any) -> Any:
        return self.torch.where(condition, a, b)

    def nonzero(self, flags: Any) -> Any:
        return flags.nonzero()[:, 0]
