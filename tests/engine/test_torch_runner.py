"""The PyTorch runner's batch stream: overlapping batches on a GPU changes no result."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from qace.engine.batches import TextBatch, VisualBatch
from qace.engine.scheduler import pad_batch
from qace.engine.torch_runner import TorchRunner
from qace.families import torch_runner
from qace.families.t5.decode_graphs import first_reads
from qace.models.loading import load_seq2seq, load_visual_t5
from qace.models.visual_inputs import visual_question_inputs

WORDS = "a dog runs on the grass two girls play with a red ball in the park near water".split()


def _text_batches(tokenizer, n_batches: int) -> list[tuple[np.ndarray, TextBatch]]:
    rng = np.random.default_rng(0)
    out = []
    for b in range(n_batches):
        prompts = [" ".join(rng.choice(WORDS, size=rng.integers(3, 14))) for _ in range(17 + b)]
        ids, mask = pad_batch(tokenizer(prompts)["input_ids"], tokenizer.pad_token_id)
        out.append((np.arange(len(prompts)) + 100 * b, TextBatch(ids, mask)))
    return out


def _visual_batches(tokenizer, device: str, n_batches: int) -> list[tuple[np.ndarray, VisualBatch]]:
    rng = np.random.default_rng(1)
    out = []
    for b in range(n_batches):
        questions = [" ".join(rng.choice(WORDS, size=rng.integers(2, 9))) + " ?" for _ in range(9 + b)]
        ids, mask, _ = visual_question_inputs(tokenizer, questions)
        features = torch.from_numpy(rng.standard_normal((len(questions), 36, 2054)).astype(np.float32))
        out.append((np.arange(len(questions)), VisualBatch(ids.numpy(), mask.numpy(), features.to(device))))
    return out


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("role", ["tqa", "vqa"])
def test_streamed_jobs_equal_one_batch_at_a_time(test_models_dir, device: str, role: str) -> None:
    """On a GPU each batch's encoder runs on a side stream while the previous batch decodes."""
    if role == "vqa":
        model, tokenizer = load_visual_t5(test_models_dir / "vqa", device=device)
        batches = _visual_batches(tokenizer, device, 4)
    else:
        model, tokenizer = load_seq2seq(str(test_models_dir / "tqa"), role="TQA", device=device)
        batches = _text_batches(tokenizer, 4)
    runner = torch_runner(model, device=device)
    one_by_one = [runner.generate(batch, max_new_tokens=12, unanswerable_id=5) for _, batch in batches]
    jobs = ((runner, index, batch, 5) for index, batch in batches)
    streamed = list(TorchRunner.generate_jobs(jobs, max_new_tokens=12))
    assert [index.tolist() for index, _ in streamed] == [index.tolist() for index, _ in batches]
    for (_, got), want in zip(streamed, one_by_one, strict=True):
        assert got.tokens == want.tokens
        np.testing.assert_array_equal(got.answerability, want.answerability)


@pytest.mark.parametrize("device", DEVICES)
def test_jobs_of_two_models_stream_as_one(test_models_dir, device: str) -> None:
    """Answers on the caption (text QA) and on the image (Visual-T5) run as one stream of jobs: on a GPU
    the first visual encoder overlaps the last text-QA decode. Each job's outputs are its own."""
    tqa, tqa_tok = load_seq2seq(str(test_models_dir / "tqa"), role="TQA", device=device)
    vqa, vqa_tok = load_visual_t5(test_models_dir / "vqa", device=device)
    text, visual = torch_runner(tqa, device=device), torch_runner(vqa, device=device)
    jobs = [(text, ("t", i), b, 5) for i, (_, b) in enumerate(_text_batches(tqa_tok, 2))]
    jobs += [(visual, ("v", i), b, 7) for i, (_, b) in enumerate(_visual_batches(vqa_tok, device, 2))]
    streamed = list(TorchRunner.generate_jobs(iter(jobs), max_new_tokens=12))
    assert [key for key, _ in streamed] == [key for _, key, _, _ in jobs]
    for (_, got), (runner, _, batch, uid) in zip(streamed, jobs, strict=True):
        want = runner.generate(batch, max_new_tokens=12, unanswerable_id=uid)
        assert got.tokens == want.tokens
        np.testing.assert_array_equal(got.answerability, want.answerability)


@pytest.mark.gpu
def test_the_host_work_between_batches_runs_once_the_next_step_is_queued(
    test_models_dir, monkeypatch
) -> None:
    """The next job is fetched after the current batch's first steps are queued (`first_reads`), not
    before them: the device has those steps to run meanwhile."""
    model, tokenizer = load_seq2seq(str(test_models_dir / "tqa"), role="TQA", device="cuda")
    batches = _text_batches(tokenizer, 3)
    runner = torch_runner(model, device="cuda")
    one_by_one = [runner.generate(batch, max_new_tokens=12, unanswerable_id=5) for _, batch in batches]
    replays: list[object] = []
    replay = torch.cuda.CUDAGraph.replay
    monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", lambda graph: replays.append(graph) or replay(graph))
    pulled: list[int] = []

    def jobs():
        for index, batch in batches:
            pulled.append(len(replays))
            yield runner, index, batch, 5

    graphs = runner.decoder._graphs
    first = first_reads(graphs._steps_run, 12)  # steps queued first, from the batch before's length
    streamed = list(TorchRunner.generate_jobs(jobs(), max_new_tokens=12))
    assert pulled[:2] == [0, first]  # the second job once the first batch's first steps were queued
    assert pulled[2] > pulled[1]  # the third after the second batch's first steps too
    for (_, got), want in zip(streamed, one_by_one, strict=True):
        assert got.tokens == want.tokens
        np.testing.assert_array_equal(got.answerability, want.answerability)


@pytest.mark.parametrize("device", DEVICES)
def test_streamed_jobs_decode_their_own_forced_outputs(test_models_dir, device: str) -> None:
    """A benchmark's forced outputs (`qace.engine.instrument`'s ``force_tokens``) are made for each job
    as its encoder is queued (on a GPU while the job before decodes): each batch gets its own."""
    from qace.engine import instrument

    model, tokenizer = load_seq2seq(str(test_models_dir / "tqa"), role="TQA", device=device)
    runner = torch_runner(model, device=device)
    eos = tokenizer.eos_token_id

    def force(batch, steps):  # row i of a batch of n rows: i + n, then i + 10, then EOS
        n = len(batch.input_ids)
        out = np.full((n, steps), eos, dtype=np.int64)
        out[:, 0], out[:, 1] = np.arange(n) + n + 10, np.arange(n) + 10
        return out

    batches = _text_batches(tokenizer, 4)
    with instrument.attached(runner, force_tokens=force):
        jobs = ((runner, index, batch, 5) for index, batch in batches)
        streamed = list(TorchRunner.generate_jobs(jobs, max_new_tokens=6))
    for (_, got), (_, batch) in zip(streamed, batches, strict=True):
        n = len(batch.input_ids)
        assert got.tokens == [[i + n + 10, i + 10] for i in range(n)]


@pytest.mark.parametrize("device", DEVICES)
def test_a_result_is_yielded_before_the_job_two_after_it_is_fetched(test_models_dir, device: str) -> None:
    """The order a stage built from an earlier stage's outputs relies on (`qace.engine.engine.Runner`):
    when job ``i + 2`` is fetched, the results of jobs up to ``i`` have been yielded."""
    model, tokenizer = load_seq2seq(str(test_models_dir / "tqa"), role="TQA", device=device)
    runner = torch_runner(model, device=device)
    events: list[tuple[str, int]] = []

    def jobs():
        for i, (_, batch) in enumerate(_text_batches(tokenizer, 5)):
            events.append(("fetched", i))
            yield runner, i, batch, 5

    for i, _ in TorchRunner.generate_jobs(jobs(), max_new_tokens=12):
        events.append(("yielded", i))
    assert sorted(events) == sorted([("fetched", i) for i in range(5)] + [("yielded", i) for i in range(5)])
    for i in range(3):
        assert events.index(("yielded", i)) < events.index(("fetched", i + 2)), events


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_streamed_jobs_on_a_device_that_is_not_current(test_models_dir) -> None:
    """Each batch's copy to the host is waited for on its model's device, not the current one."""
    model, tokenizer = load_seq2seq(str(test_models_dir / "tqa"), role="TQA", device="cuda:1")
    runner = torch_runner(model, device="cuda:1")
    batches = _text_batches(tokenizer, 3)
    one_by_one = [runner.generate(batch, max_new_tokens=12, unanswerable_id=5) for _, batch in batches]
    assert torch.cuda.current_device() == 0
    jobs = ((runner, index, batch, 5) for index, batch in batches)
    for (_, got), want in zip(TorchRunner.generate_jobs(jobs, max_new_tokens=12), one_by_one, strict=True):
        assert got.tokens == want.tokens
        np.testing.assert_array_equal(got.answerability, want.answerability)
