"""The instrumentation seam: hooks attach to one target, merge, restore, and go with it; runners obey them."""

from __future__ import annotations

import gc
import time

import numpy as np

from qace.engine import instrument
from qace.engine.batches import TextBatch
from qace.engine.instrument import NOTHING, StageTimer
from qace.families import torch_runner
from qace.models.loading import load_seq2seq


class Target:
    pass


def test_hooks_belong_to_their_target_merge_and_come_back_after_a_block() -> None:
    one, other = Target(), Target()
    assert instrument.of(one) is NOTHING
    instrument.attach(one, full_length=True)
    timer = StageTimer()
    with instrument.attached(one, timer=timer) as hooks:
        assert hooks.full_length and hooks.timer is timer
        assert instrument.of(other) is NOTHING
    assert instrument.of(one).full_length and instrument.of(one).timer is instrument.NO_TIMER
    with instrument.attached(other, full_length=True):
        pass
    assert instrument.of(other) is NOTHING


def test_hooks_go_with_their_target() -> None:
    target, held = Target(), len(instrument._ATTACHED)
    instrument.attach(target, full_length=True)
    assert len(instrument._ATTACHED) == held + 1
    del target
    gc.collect()
    assert len(instrument._ATTACHED) == held


def test_a_runner_emits_forced_tokens_and_times_its_stages(test_models_dir) -> None:
    model, tokenizer = load_seq2seq(str(test_models_dir / "tqa"), role="TQA")
    runner = torch_runner(model)
    ids = np.array(tokenizer(["question: who runs ?  context: a dog runs </s>"] * 2)["input_ids"])
    batch = TextBatch(ids, np.ones_like(ids))
    forced = np.array([[7, 8, 1, 9], [6, 1, 9, 9]])
    profile = StageTimer()
    with instrument.attached(runner, force_tokens=lambda b, steps: forced[:, :steps], profile=profile):
        out = runner.generate(batch, max_new_tokens=4)
    assert out.tokens == [[7, 8], [6]]
    assert set(profile.seconds) == {"encoder", "decoder"}
    assert runner.generate(batch, max_new_tokens=4).tokens != out.tokens  # detached: its own argmax


def test_stage_timer_tells_waiting_from_working() -> None:
    """A stage that sleeps has wall time but next to no CPU time; one that computes has both. The work
    is counted in CPU time, not wall time, so a loaded machine (less CPU per wall second) changes
    nothing asserted here."""
    timer = StageTimer()
    with timer("wait"):
        time.sleep(0.05)
    with timer("work"):
        until = time.thread_time() + 0.05
        while time.thread_time() < until:
            pass
    assert timer.seconds["wait"] >= 0.05 and timer.cpu_seconds["wait"] < 0.02
    # wall and thread CPU time come from different clocks: allow their resolution between them
    assert timer.seconds["work"] + 1e-3 >= timer.cpu_seconds["work"] >= 0.05


def test_collector_pauses_count_collections_until_closed() -> None:
    pauses = instrument.CollectorPauses()
    gc.collect()
    gc.collect(0)
    assert pauses.count == 2 and pauses.seconds > 0
    assert {g: n for g, (n, _) in pauses.by_generation.items()} == {2: 1, 0: 1}
    pauses.close()
    gc.collect()
    assert pauses.count == 2 and pauses._on_gc not in gc.callbacks
