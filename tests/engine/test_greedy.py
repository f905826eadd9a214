"""The one greedy loop on hand-made decoder steps (ended rows, drops, forcing, answerability), the EOS cut."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qace.engine.batches import cut_at_eos, eos_lengths
from qace.engine.greedy import NumpyArrays, TorchArrays, greedy_decode

EOS = 1
PLANNED = [[5, 6, EOS], [7, EOS], [8, 9, 10, 11, 12], [3, EOS], [4, 4, 4, 4, 4, 4, EOS]]
"""What each row emits: rows end at different steps, one (row 2) runs out of steps."""


class Scripted:
    """Emits ``PLANNED``; records what it was fed and which rows it held at each step."""

    def __init__(self, arrays) -> None:
        self.arrays = arrays
        self.held = list(range(len(PLANNED)))
        self.fed: list[list[int]] = []
        self.kept: list[list[int]] = []

    def step(self, step: int, token):
        self.fed.append([int(t) for t in token])
        best = [PLANNED[r][step] if step < len(PLANNED[r]) else EOS for r in self.held]
        ids = self.arrays.full(len(best), 0)  # the backend's own array type
        for i, value in enumerate(best):
            ids[i] = value
        return ids

    def choose(self, output):
        return output

    def answerability(self, output, unanswerable_id: int):
        return [0.5 + r for r in self.held]

    def keep(self, rows) -> None:
        self.kept.append([self.held[int(i)] for i in rows])
        self.held = [self.held[int(i)] for i in rows]


@pytest.mark.parametrize("arrays", [NumpyArrays(), TorchArrays("cpu")], ids=["numpy", "torch"])
def test_rows_end_at_eos_drop_at_half_and_the_loop_stops_when_all_ended(arrays) -> None:
    steps = Scripted(arrays)
    out, answerability = greedy_decode(
        steps, len(PLANNED), start_id=0, eos_id=EOS, max_new_tokens=5, unanswerable_id=2
    )
    out = np.asarray(out)
    assert cut_at_eos(out, EOS) == [[5, 6], [7], [8, 9, 10, 11, 12], [3], [4, 4, 4, 4, 4]]
    assert out[1].tolist() == [7, EOS, -1, -1, -1]  # -1 after the EOS
    assert steps.fed[0] == [0] * 5  # the start token, then each row's previous token
    assert steps.fed[1] == [5, 7, 8, 3, 4]
    assert steps.fed[2] == [6, EOS, 9, EOS, 4]  # ended rows are fed EOS until dropped
    assert steps.kept == [[2, 4]]  # after step 2 two of five rows still run: the others are dropped
    assert steps.fed[3] == [10, 4]
    assert answerability == [0.5, 1.5, 2.5, 3.5, 4.5]


def test_the_loop_stops_once_every_row_ended_and_forcing_replaces_the_choice() -> None:
    steps = Scripted(NumpyArrays())
    forced = np.full((len(PLANNED), 8), 9, dtype=np.int64)
    forced[:, 2] = EOS
    out, answerability = greedy_decode(
        steps, len(PLANNED), start_id=0, eos_id=EOS, max_new_tokens=8, forced=forced
    )
    assert len(steps.fed) == 3 and answerability is None
    assert out.tolist() == [[9, 9, EOS, -1, -1, -1, -1, -1]] * len(PLANNED)


def test_numpy_and_torch_arrays_make_the_same_arrays() -> None:
    n, t = NumpyArrays(), TorchArrays("cpu")
    flags = np.array([True, False, True])
    for name, made in (("ids", lambda a: a.full((2, 3), -1)), ("flags", lambda a: a.full(3, False))):
        assert np.asarray(made(n)).dtype == made(t).numpy().dtype, name
    assert n.nonzero(flags).tolist() == t.nonzero(torch.from_numpy(flags)).tolist() == [0, 2]
    assert n.arange(3).tolist() == t.arange(3).tolist()


def test_eos_lengths_stop_at_any_eos_id_or_minus_one_and_say_which_rows_ran_out() -> None:
    out = np.array([[4, 2, 5, 2], [4, 5, 6, 7], [9, 7, 1, 1], [3, -1, -1, -1]])
    lengths, stopped = eos_lengths(out, {2, 7})
    assert lengths.tolist() == [1, 3, 1, 1] and stopped.tolist() == [True, True, True, True]
    lengths, stopped = eos_lengths(out, 1)
    assert lengths.tolist() == [4, 4, 2, 1] and stopped.tolist() == [False, False, True, True]
    assert cut_at_eos(out, 1) == [[4, 2, 5, 2], [4, 5, 6, 7], [9, 7], [3]]


def test_meanwhile_runs_once_after_the_first_step() -> None:
    steps = Scripted(NumpyArrays())
    seen: list[int] = []
    out, _ = greedy_decode(
        steps,
        len(PLANNED),
        start_id=0,
        eos_id=EOS,
        max_new_tokens=7,
        meanwhile=lambda: seen.append(len(steps.fed)),
    )
    assert seen == [1]  # once, with the first step run and no later one
    plain, _ = greedy_decode(Scripted(NumpyArrays()), len(PLANNED), start_id=0, eos_id=EOS, max_new_tokens=7)
    assert np.array_equal(out, plain)
