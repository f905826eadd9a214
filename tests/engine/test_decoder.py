"""The static-cache decoder: how often it checks for ended rows never changes what it generates."""

from __future__ import annotations

import numpy as np

from qace.demo import example_path
from qace.engine.batches import TextBatch
from qace.engine.scheduler import pad_batch
from qace.engine.tokenize import encode_texts
from qace.engine.torch_runner import TorchRunner
from qace.metric.prompts import qg_input
from qace.models.loading import load_seq2seq


def test_ended_row_checks_do_not_change_outputs(test_models_dir):
    import json

    captions = [json.loads(line)["caption"] for line in example_path().open()]
    model, tokenizer = load_seq2seq(str(test_models_dir / "qg"), role="qg")
    ids, _ = encode_texts(tokenizer, [qg_input(w, c) for c in captions for w in ("girl", "dog", "beach")], 512)
    batch = TextBatch(*pad_batch(ids, tokenizer.pad_token_id))
    runner = TorchRunner(model)
    every_step = runner.generate(batch, max_new_tokens=31, unanswerable_id=5)
    runner.decoder.check_every = 4
    every_fourth = runner.generate(batch, max_new_tokens=31, unanswerable_id=5)
    assert every_step.tokens == every_fourth.tokens
    assert len({tuple(t) for t in every_step.tokens}) > 3 and all(len(t) < 31 for t in every_step.tokens)
    np.testing.assert_array_equal(every_step.answerability, every_fourth.answerability)
