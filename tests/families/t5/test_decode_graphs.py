"""The static-cache decoder: bucketing rules on any machine, CUDA-graph replay against eager on a GPU."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from qace.engine.scheduler import pad_batch
from qace.families.t5.decode_graphs import (
    AHEAD_ROWS,
    GraphedDecoding,
    bucket_length,
    bucket_rows,
    first_reads,
    queue_ahead,
    windows,
)
from qace.families.t5.decoder import StaticT5Decoder
from qace.families.t5.encoder import T5Encoder
from qace.models.loading import load_seq2seq

PROMPTS = [
    "answer: young girl  context: a young girl in a red dress runs on the beach </s>",
    "answer: red dress  context: a young girl in a red dress runs on the beach </s>",
    "answer: park  context: two dogs play with a ball in the park </s>",
    "question: who sits on the grass ?  context: a old man in a blue coat sits on the grass </s>",
    "question: where does the boy walk ?  context: a little boy in a green hat walks on the street </s>",
]


def test_buckets_cover_every_batch_with_few_shapes() -> None:
    assert [bucket_rows(n) for n in (1, 8, 9, 24, 25, 255, 256, 257, 385, 2048)] == [
        8, 8, 16, 24, 32, 256, 256, 384, 512, 2048
    ]  # fmt: skip
    assert [bucket_length(n) for n in (1, 16, 17, 102, 511)] == [16, 16, 32, 112, 512]
    assert len({bucket_rows(n) for n in range(1, 2049)}) == 16
    assert all(n <= bucket_rows(n) <= max(16, 1.5 * n) for n in range(1, 2049))
    assert windows(31) == [8, 16, 31] and windows(8) == [8] and windows(5) == [5] and windows(9) == [8, 9]


def _ids(tokenizer, prompts: list[str], device: str = "cuda") -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    ids, mask = pad_batch(tokenizer(prompts)["input_ids"], tokenizer.pad_token_id)
    return torch.from_numpy(mask).to(device), {"input_ids": torch.from_numpy(ids).to(device)}


def _decode(model, tokenizer, prompts: list[str], device: str, graphs: bool, forced=None, decoder=None):
    mask_t, ids = _ids(tokenizer, prompts, device)
    decoder = decoder or StaticT5Decoder(model, cuda_graphs=graphs)
    hidden, mask_t = T5Encoder(model)(mask_t, **ids)  # fp32: Hugging Face's forward
    tokens, answerability = decoder.generate(
        hidden, mask_t, max_new_tokens=31, unanswerable_id=5, forced=forced
    )
    return tokens.cpu().numpy(), answerability.double().cpu().numpy(), decoder


def test_eager_decoder_equals_generate_on_cpu(test_models_dir) -> None:
    model, tokenizer = load_seq2seq(
        str(test_models_dir / "tqa"), role="TQA", device="cpu", dtype=torch.float32
    )
    tokens, answerability, _ = _decode(model, tokenizer, PROMPTS, "cpu", graphs=True)
    enc = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    with torch.no_grad():
        ref = model.generate(**enc, max_length=32, num_beams=1, do_sample=False)[:, 1:].numpy()
    for row, expected in zip(tokens, ref, strict=True):
        got = row[row >= 0]
        assert got.tolist() == expected[: len(got)].tolist()
        assert got[-1] == 1 or len(got) == 31  # ends with EOS unless it ran out of steps
    assert np.all((answerability >= 0) & (answerability <= 1))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_graph_replay_equals_eager_on_gpu(test_models_dir, dtype) -> None:
    model, tokenizer = load_seq2seq(str(test_models_dir / "tqa"), role="TQA", device="cuda", dtype=dtype)
    prompts = PROMPTS * 7  # 35 rows: a padded bucket of 64
    eager, an_eager, _ = _decode(model, tokenizer, prompts, "cuda", graphs=False)
    graphed, an_graphed, decoder = _decode(model, tokenizer, prompts, "cuda", graphs=True)
    # bf16 rounding depends on the GEMM kernel, which depends on the batch shape (eager drops rows)
    same = np.mean([np.array_equal(a, b) for a, b in zip(graphed, eager, strict=True)])
    assert same == 1.0 if dtype == torch.float32 else same >= 0.9
    np.testing.assert_allclose(an_graphed, an_eager, atol=1e-5 if dtype == torch.float32 else 5e-2)
    # a batch of another shape in between leaves nothing stale behind; the same shape reuses its graph
    _decode(model, tokenizer, prompts[:3], "cuda", graphs=True, decoder=decoder)
    again, _, _ = _decode(model, tokenizer, prompts, "cuda", graphs=True, decoder=decoder)
    assert np.array_equal(again, graphed)
    assert decoder._graphs.captures == 2
    forced = torch.randint(3, 50, (len(prompts), 31), device="cuda")
    forced[:, 5] = 1  # every row ends at step 6
    out, _, _ = _decode(model, tokenizer, prompts, "cuda", graphs=True, forced=forced, decoder=decoder)
    assert np.array_equal(out[:, :6], forced[:, :6].cpu().numpy()) and np.all(out[:, 6:] == -1)
    assert decoder._graphs.captures == 3  # forcing is part of the graph


def test_a_step_is_queued_ahead_only_while_rows_end_slowly() -> None:
    assert not queue_ahead(None, 2048)  # the first step: no rate known
    assert queue_ahead(2048, 2000) and queue_ahead(100, 67)  # 48 / 33 ended, far more left
    assert not queue_ahead(100, 66)  # 34 ended: 66 left could end at the next step
    assert not queue_ahead(9, AHEAD_ROWS) and queue_ahead(AHEAD_ROWS + 1, AHEAD_ROWS + 1)


def test_the_steps_queued_before_the_first_read_are_half_the_batch_befores() -> None:
    assert first_reads(0, 31) == 1  # nothing known: read after the first step
    assert first_reads(17, 31) == 8 and first_reads(5, 31) == 2 and first_reads(3, 31) == 1
    assert first_reads(40, 6) == 6  # never more than the steps there are


def _replays_expected(ends: list[int], steps: int, first: int = 1) -> int:
    """Step replays of a batch whose row ``i`` ends at step ``ends[i]``, ``first`` steps queued before
    the first count is read, then under `queue_ahead`."""

    def left_after(step: int) -> int:
        return sum(end > step for end in ends)

    before, left, unread = None, len(ends), False
    for step in range(steps):
        if step + 1 == steps:
            return step + 1
        if step + 1 < first:
            unread = True
            continue
        if unread:
            before, left, unread = left, left_after(step - 1), False
            if left == 0:
                return step + 1
        if queue_ahead(before, left):
            unread = True
            continue
        before, left = left, left_after(step)
        if left == 0:
            return step + 1
    return steps


class _Event:
    """A CUDA event's part `GraphedDecoding._run` uses, on the CPU (copies there are done at once)."""

    def record(self) -> None: ...

    def synchronize(self) -> None: ...


class _Step:
    """A graph's replay on the CPU: one step of a batch whose row ``i`` ends at step ``ends[i]``."""

    def __init__(self, view: SimpleNamespace, ends: list[int], replays: list[int]) -> None:
        self.view, self.ends, self.replays = view, torch.tensor(ends), replays

    def replay(self) -> None:
        step = len(self.replays)
        self.replays.append(step)
        self.view.finished[: len(self.ends)] |= self.ends <= step


@pytest.mark.parametrize("steps_before", [0, 3, 12, 40])
@pytest.mark.parametrize(
    "ends",
    [
        [5] * 35,
        [2] * 34 + [20],
        [1] * 20 + [9] * 15,
        [3 + i % 7 for i in range(35)],
        [4 + i % 26 for i in range(35)],
    ],
)
def test_the_decoding_loop_queues_and_reads_as_its_rules_say(steps_before: int, ends: list[int]) -> None:
    """`GraphedDecoding._run`'s loop on the CPU, its graphs and events stood in for: the steps it
    replays (`first_reads` before the first read and ``meanwhile``, then `queue_ahead`) and the steps
    it records for the next batch."""
    steps, bucket, replays, seen = 31, 48, [], []
    view = SimpleNamespace(
        first_step=None,
        token=torch.zeros(bucket, dtype=torch.long),
        finished=torch.ones(bucket, dtype=torch.bool),
    )
    view.finished[: len(ends)] = False
    view.out = torch.full((bucket, steps), -1)
    view.graphs = dict.fromkeys(windows(steps), _Step(view, ends, replays))
    graphs = GraphedDecoding.__new__(GraphedDecoding)
    graphs.dec, graphs._steps_run = SimpleNamespace(row_steps=0), steps_before
    graphs._left = (torch.zeros(steps, dtype=torch.long), [_Event(), _Event()])
    first = first_reads(steps_before, steps)
    graphs._run(view, len(ends), steps, lambda: seen.append(len(replays)))
    assert len(replays) == _replays_expected(ends, steps, first) >= max(ends) + 1
    assert seen == [first] and graphs._steps_run == max(ends) + 1
    assert graphs.dec.row_steps == bucket * len(replays)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_step_queued_ahead_changes_no_output(test_models_dir, dtype, monkeypatch) -> None:
    model, tokenizer = load_seq2seq(str(test_models_dir / "tqa"), role="TQA", device="cuda", dtype=dtype)
    prompts = PROMPTS * 7  # 35 rows, more than AHEAD_ROWS
    replays = []
    replay = torch.cuda.CUDAGraph.replay
    monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", lambda graph: replays.append(graph) or replay(graph))
    decoder = StaticT5Decoder(model)
    _decode(model, tokenizer, prompts, "cuda", graphs=True, decoder=decoder)  # captures
    cases = [
        [5] * 35,
        [2] * 34 + [20],
        [1] * 20 + [9] * 15,
        [3 + i % 7 for i in range(35)],
        [4 + i % 26 for i in range(35)],
    ]
    graphs = decoder._graphs
    assert graphs is not None
    for ends in cases:  # each batch after the one before, which sets how many steps go before a read
        first = first_reads(graphs._steps_run, 31)
        forced = torch.randint(3, 50, (len(prompts), 31), device="cuda")
        for row, end in enumerate(ends):
            forced[row, end] = 1  # the row's EOS
        replays.clear()
        out, _, _ = _decode(model, tokenizer, prompts, "cuda", graphs=True, forced=forced, decoder=decoder)
        for row, end in enumerate(ends):
            assert out[row, : end + 1].tolist() == forced[row, : end + 1].tolist()
            assert np.all(out[row, end + 1 :] == -1)
        assert len(replays) == _replays_expected(ends, 31, first) >= max(ends) + 1
        assert graphs._steps_run == max(ends) + 1
    mask, ids = _ids(tokenizer, prompts)
    hidden, mask = T5Encoder(model)(mask, **ids)
    forced = torch.randint(3, 50, (len(prompts), 31), device="cuda")
    forced[:, 5] = 1  # every row ends at step 5
    for steps_before, first in [(0, 1), (12, 6)]:
        graphs._steps_run = steps_before
        seen: list[int] = []
        replays.clear()
        decoder.generate(
            hidden,
            mask,
            max_new_tokens=31,
            unanswerable_id=5,
            forced=forced,
            meanwhile=lambda seen=seen: seen.append(len(replays)),
        )
        assert seen == [first] and len(replays) == 7  # once, after the first steps were queued
    assert _replays_expected([5] * 35, 31) == 7  # all rows end at once: one step queued past the end
    assert _replays_expected([5] * 35, 31, 6) == 7  # the first read is of the 5th step: one past too
    assert _replays_expected([5] * 35, 31, 9) == 9  # three steps queued past the end
    assert _replays_expected([2] * 34 + [20], 31) == 21


@pytest.mark.gpu
def test_prepared_buckets_are_replayed_not_captured(test_models_dir, monkeypatch) -> None:
    model, tokenizer = load_seq2seq(
        str(test_models_dir / "tqa"), role="TQA", device="cuda", dtype=torch.float32
    )
    prompts = PROMPTS * 7  # 35 rows: the bucket of 48
    cold, an_cold, _ = _decode(model, tokenizer, prompts, "cuda", graphs=True)
    decoder = StaticT5Decoder(model)
    like = torch.empty(0, device="cuda", dtype=torch.float32)
    shapes = [(64, n) for n in range(1, 33)]  # up to 64 rows of up to 32 positions
    replays = []
    replay = torch.cuda.CUDAGraph.replay
    monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", lambda graph: replays.append(graph) or replay(graph))
    new = decoder.graphed().prepare(shapes, steps=31, like=like, unanswerable_id=5)
    assert new == 6 * 2  # rows 8, 16, 24, 32, 48, 64 x lengths 16, 32
    # each new graph replayed once (windows 8, 16 and 31, and the first step), so no call pays for it
    assert len(replays) == len(set(map(id, replays))) == new * 4
    assert decoder.graphed().prepare(shapes, steps=31, like=like, unanswerable_id=5) == 0
    warm, an_warm, _ = _decode(model, tokenizer, prompts, "cuda", graphs=True, decoder=decoder)
    _decode(model, tokenizer, prompts[:3], "cuda", graphs=True, decoder=decoder)
    assert decoder.graphed().captures == new  # both batches replayed prepared graphs
    assert np.array_equal(warm, cold) and np.array_equal(an_warm, an_cold)


@pytest.mark.gpu
def test_a_capture_survives_another_thread_pinning_memory(test_models_dir, monkeypatch) -> None:
    """Another thread of the process may pin memory while a graph is captured (an RL trainer's data
    loader beside an in-process reward); in CUDA's global capture mode its allocation would invalidate
    the capture. Here every capture has such an allocation in it."""
    model, tokenizer = load_seq2seq(
        str(test_models_dir / "tqa"), role="TQA", device="cuda", dtype=torch.float32
    )
    eager, an_eager, _ = _decode(model, tokenizer, PROMPTS, "cuda", graphs=False)
    pinned: list[torch.Tensor] = []
    ends = []
    capture_end = torch.cuda.CUDAGraph.capture_end

    def pinned_meanwhile(graph: torch.cuda.CUDAGraph) -> None:
        ends.append(graph)

        def pin() -> None:  # kept, so each is a new pinned allocation, not a cached block
            pinned.append(torch.empty(1 << 20, dtype=torch.uint8, pin_memory=True))

        thread = threading.Thread(target=pin)
        thread.start()
        thread.join()
        capture_end(graph)

    monkeypatch.setattr(torch.cuda.CUDAGraph, "capture_end", pinned_meanwhile)
    graphed, an_graphed, decoder = _decode(model, tokenizer, PROMPTS, "cuda", graphs=True)
    assert decoder._graphs.captures == 1 and len(ends) >= 1 and len(pinned) == len(ends)
    assert np.array_equal(graphed, eager)
    np.testing.assert_allclose(an_graphed, an_eager, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_graphs_on_a_device_that_is_not_current(test_models_dir) -> None:
    model, tokenizer = load_seq2seq(
        str(test_models_dir / "tqa"), role="TQA", device="cuda:1", dtype=torch.float32
    )
    assert torch.cuda.current_device() == 0
    eager, _, _ = _decode(model, tokenizer, PROMPTS, "cuda:1", graphs=False)
    graphed, _, _ = _decode(model, tokenizer, PROMPTS, "cuda:1", graphs=True)
    assert np.array_equal(graphed, eager)
