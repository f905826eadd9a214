"""A text stage through the engine: order, de-duplication, budgets, and tokenising ahead of the device."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from qace.engine.batches import Generated, TextBatch
from qace.engine.engine import BatchLimits, deferred_stage, run_stages, text_stage
from qace.metric.prompts import MAX_NEW_TOKENS
from qace.models.loading import load_seq2seq


class EchoRunner:
    """Generates each row's first three input ids; answerability = unpadded length / 100."""

    def __init__(self) -> None:
        self.batches: list[np.ndarray] = []

    def generate(self, batch: TextBatch, *, max_new_tokens: int, unanswerable_id: int | None = None):
        self.batches.append(batch.attention_mask)
        lengths = batch.attention_mask.sum(axis=1)
        return Generated(
            tokens=[row[:3].tolist() for row in batch.input_ids],
            answerability=lengths / 100.0 if unanswerable_id is not None else None,
        )


@pytest.fixture(scope="module")
def tokenizer(test_models_dir):
    return load_seq2seq(str(test_models_dir / "tqa"), role="TQA")[1]


def _prompts() -> list[str]:
    words = "a dog runs on the grass two girls play with a red ball in the park near water".split()
    rng = np.random.default_rng(0)
    prompts = [" ".join(rng.choice(words, size=rng.integers(2, 12))) for _ in range(40)]
    return prompts + prompts[::3]  # duplicates run once


@pytest.mark.parametrize("rows", [2, 3, 256])
def test_slices_give_the_same_outputs_in_input_order(tokenizer, rows) -> None:
    prompts = _prompts()
    runner = EchoRunner()
    limits = BatchLimits(max_batch_tokens=64, max_batch_rows=rows)
    stage = text_stage(
        runner,
        tokenizer,
        "{}",
        [(p,) for p in prompts],
        max_input_tokens=512,
        limits=limits,
        unanswerable_id=5,
    )
    (out,) = run_stages([stage], max_new_tokens=MAX_NEW_TOKENS)
    ids = tokenizer(prompts)["input_ids"]
    assert out.texts == [
        t.strip() for t in tokenizer.batch_decode([x[:3] for x in ids], skip_special_tokens=True)
    ]
    np.testing.assert_array_equal(out.answerability, [len(x) / 100.0 for x in ids])
    assert sum(len(m) for m in runner.batches) == len(set(prompts))
    assert all(m.shape[0] <= rows and m.size <= max(64, m.shape[1]) for m in runner.batches)


def test_next_slice_is_tokenised_while_this_one_runs(tokenizer, monkeypatch) -> None:
    """Slice 1's first batch cannot finish unless slice 2 is being tokenised meanwhile, in the helper."""
    import qace.engine.engine as engine

    real = engine._text_batches
    threads: list[str] = []
    second = threading.Event()

    def recording_encode(encode, rows, max_tokens, limits):
        threads.append(threading.current_thread().name)
        if len(threads) == 2:
            second.set()
        return real(encode, rows, max_tokens, limits)

    class WaitingRunner(EchoRunner):
        def generate(self, batch, **kwargs):
            if not self.batches:
                assert second.wait(30), "slice 2 was not tokenised while slice 1 ran"
            return super().generate(batch, **kwargs)

    monkeypatch.setattr(engine, "_text_batches", recording_encode)
    limits = BatchLimits(max_batch_tokens=10_000, max_batch_rows=2)  # slices of 1, 2, 4, 8, 8, 1 prompts
    runner = WaitingRunner()
    rows = [(p,) for p in _prompts()[:24]]
    run_stages(
        [text_stage(runner, tokenizer, "{}", rows, max_input_tokens=512, limits=limits)],
        max_new_tokens=MAX_NEW_TOKENS,
    )
    assert len(threads) == 6 and all(name.startswith("qace-tokenize") for name in threads)
    assert sum(len(m) for m in runner.batches) == 24


@pytest.mark.parametrize(("n", "rows"), [(0, 8), (1, 8), (3, 8), (100, 8), (37_000, 2048), (5, 1)])
def test_slices_start_at_half_a_batch_and_double_to_four(n: int, rows: int) -> None:
    from qace.engine.engine import _slice_bounds

    bounds = _slice_bounds(n, rows)
    sizes = np.diff(bounds)
    assert bounds[0] == 0 and bounds[-1] == n and (sizes > 0).all()
    if n:
        full = sizes[:-1]  # the last slice holds what is left
        assert sizes[0] == min(n, max(1, rows // 2))
        assert (full[1:] == np.minimum(2 * full[:-1], 4 * rows)).all()


def test_text_stage_keeps_unknown_tokens_and_drops_pad_and_eos() -> None:
    """A question or text-QA answer keeps the ``<unk>`` a model emits (spec 2/3); padding and EOS go."""
    from qace.testing.qace_models import build_tokenizer

    tokenizer = build_tokenizer(["what is the dog doing"])
    unk, eos, pad = tokenizer.unk_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id
    dog = tokenizer.convert_tokens_to_ids("▁dog")

    class UnknownRunner(EchoRunner):
        def generate(self, batch, *, max_new_tokens, unanswerable_id=None):
            self.batches.append(batch.attention_mask)
            return Generated(tokens=[[dog, unk, eos, pad] for _ in batch.input_ids], answerability=None)

    limits = BatchLimits(max_batch_tokens=64, max_batch_rows=8)
    stage = text_stage(
        UnknownRunner(), tokenizer, "{}", [("a",), ("b",)], max_input_tokens=512, limits=limits
    )
    (out,) = run_stages([stage], max_new_tokens=MAX_NEW_TOKENS)
    assert out.texts == ["dog<unk>", "dog<unk>"]


def test_a_deferred_stage_is_built_when_the_run_reaches_it_and_gives_what_a_plain_one_gives(tokenizer):
    prompts = _prompts()
    first, second = prompts[:20], prompts[20:]
    limits = BatchLimits(max_batch_tokens=64, max_batch_rows=4)
    runner = EchoRunner()

    def stage(rows: list[str]):
        return text_stage(runner, tokenizer, "{}", [(p,) for p in rows], max_input_tokens=512, limits=limits,
                          unanswerable_id=5)  # fmt: skip

    plain = run_stages([stage(first), stage(second)], max_new_tokens=MAX_NEW_TOKENS)
    batches_before_built = []

    def build():
        batches_before_built.append(len(runner.batches))
        return stage(second)

    runner.batches.clear()
    deferred = run_stages([stage(first), deferred_stage(runner, 5, build)], max_new_tokens=MAX_NEW_TOKENS)
    for got, want in zip(deferred, plain, strict=True):
        assert got.texts == want.texts and got.truncated == want.truncated
        np.testing.assert_array_equal(got.answerability, want.answerability)
    # built when the run asked for its first batch: after every batch of the first stage was generated
    # (EchoRunner has no `generate_jobs`: a batch is generated before the next one is asked for)
    runner.batches.clear()
    run_stages([stage(first)], max_new_tokens=MAX_NEW_TOKENS)
    assert batches_before_built == [len(runner.batches)] and batches_before_built[0] > 1


class FetchingAhead(EchoRunner):
    """A runner whose `generate_jobs` fetches ``ahead`` jobs before it yields the first one's result, as
    a stream that overlaps batches may."""

    ahead = 2
    fetched: list[object] = []
    streams = 0

    @classmethod
    def generate_jobs(cls, jobs, *, max_new_tokens):
        cls.streams += 1
        it, queued = iter(jobs), []
        while True:
            while len(queued) < cls.ahead and (job := next(it, None)) is not None:
                cls.fetched.append(job[1])
                queued.append(job)
            if not queued:
                return
            runner, key, batch, uid = queued.pop(0)
            yield key, runner.generate(batch, max_new_tokens=max_new_tokens, unanswerable_id=uid)


@pytest.mark.parametrize("ahead", [0, 1, 2, 3])
def test_a_stage_built_from_earlier_outputs_gives_what_a_run_after_them_gives(tokenizer, ahead) -> None:
    """``needs``: the answers to part k's questions are built from them in the same run, and a last
    stage from the stage just before it. Where the stream has fetched past the needed stage's last
    batch without yielding it (there: two jobs or more ahead), the stream drains and a new one starts
    there; either way every stage gives what it gives in runs of its own."""
    prompts = _prompts()
    parts = [prompts[:20], prompts[20:34], prompts[34:]]
    limits = BatchLimits(max_batch_tokens=64, max_batch_rows=4)
    runner = EchoRunner() if ahead == 0 else FetchingAhead()
    FetchingAhead.ahead, FetchingAhead.fetched = ahead, []

    def stage(rows: list[str]):
        return text_stage(runner, tokenizer, "{}", [(p,) for p in rows], max_input_tokens=512, limits=limits,
                          unanswerable_id=5)  # fmt: skip

    def from_texts(out):  # a stage whose prompts are an earlier stage's outputs
        return stage([f"{t} ?" for t in out.texts])

    first = run_stages([stage(p) for p in parts], max_new_tokens=MAX_NEW_TOKENS)
    then = run_stages([from_texts(out) for out in first], max_new_tokens=MAX_NEW_TOKENS)
    (last,) = run_stages([from_texts(then[-1])], max_new_tokens=MAX_NEW_TOKENS)
    built: list[int] = []
    FetchingAhead.fetched, FetchingAhead.streams, generated_before = [], 0, len(runner.batches)

    def answers(k: int, out):
        built.append(k)
        return from_texts(out)

    one_run = run_stages(
        [stage(parts[0]), *(deferred_stage(runner, 5, lambda p=p: stage(p)) for p in parts[1:])]
        + [deferred_stage(runner, 5, lambda out, k=k: answers(k, out), needs=(k,)) for k in range(3)]
        + [deferred_stage(runner, 5, from_texts, needs=(5,))],
        max_new_tokens=MAX_NEW_TOKENS,
    )
    assert built == [0, 1, 2]
    assert FetchingAhead.streams == (0 if ahead == 0 else 1 if ahead == 1 else 2)
    for got, want in zip(one_run, [*first, *then, last], strict=True):
        assert got.texts == want.texts and got.truncated == want.truncated
        np.testing.assert_array_equal(got.answerability, want.answerability)
    if ahead:  # every batch fetched once, none twice, across however many streams
        keys = [repr(key) for key in FetchingAhead.fetched]
        assert len(keys) == len(set(keys)) == len(runner.batches) - generated_before


def test_a_stage_can_need_only_stages_before_it(tokenizer) -> None:
    limits = BatchLimits(max_batch_tokens=64, max_batch_rows=4)
    runner = EchoRunner()
    plain = text_stage(runner, tokenizer, "{}", [("a dog",)], max_input_tokens=512, limits=limits)
    with pytest.raises(ValueError, match="only stages before it"):
        run_stages([plain, deferred_stage(runner, None, lambda out: plain, needs=(1,))], max_new_tokens=3)


def test_a_deferred_stage_must_be_built_with_its_runner(tokenizer) -> None:
    limits = BatchLimits(max_batch_tokens=64, max_batch_rows=4)
    built = text_stage(EchoRunner(), tokenizer, "{}", [("a dog",)], max_input_tokens=512, limits=limits)
    with pytest.raises(ValueError, match="another runner"):
        run_stages([deferred_stage(EchoRunner(), None, lambda: built)], max_new_tokens=MAX_NEW_TOKENS)


@pytest.mark.parametrize("progress, shown", [(False, True), (True, False), (True, True)])
def test_a_stage_makes_a_tqdm_only_where_its_bar_draws(tokenizer, monkeypatch, progress, shown) -> None:
    import qace.engine.engine as engine
    from qace.progress import Tracker

    made = []
    monkeypatch.setattr(engine, "bars_shown", lambda: shown)
    monkeypatch.setattr(engine, "tqdm", lambda **kw: made.append(kw) or Tracker("t", 1, "", False))
    limits = BatchLimits(max_batch_tokens=64, max_batch_rows=4)
    rows = [(p,) for p in _prompts()]
    stage = text_stage(
        EchoRunner(), tokenizer, "{}", rows, max_input_tokens=512, limits=limits, progress=progress
    )
    (out,) = run_stages([stage], max_new_tokens=MAX_NEW_TOKENS)
    assert len(out.texts) == len(rows)
    assert len(made) == (progress and shown)
