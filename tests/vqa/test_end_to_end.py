"""Captions -> ``qace vqa-data`` -> ``qace vqa-train`` (killed and resumed) -> ``qace score --variant img``,
on the tiny test models: the loss falls and the trained directory scores, named by its content hash."""

from __future__ import annotations

import json
import logging
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from transformers import TrainerCallback

from qace.cli import main
from qace.models.loading import checkpoint_fingerprint
from qace.testing.qace_models import world_captions
from qace.vqa.train import TrainSettings, train_visual_t5
from tests.helpers import random_regions

IMAGES = 12


class KillAt(TrainerCallback):
    """Interrupts training at the end of step ``step``, as a kill would."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs) -> None:
        if state.global_step == self.step:
            raise KeyboardInterrupt


@pytest.fixture(autouse=True)
def _offline(monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def write_inputs(tmp_path):
    captions = world_captions(48, seed=1)
    rows = [{"id": f"c{i}", "image_id": f"img{i % IMAGES}", "caption": c} for i, c in enumerate(captions)]
    (tmp_path / "captions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    features = tmp_path / "features"
    features.mkdir()
    for i in range(IMAGES):
        regions, boxes = random_regions(i)
        np.savez(features / f"img{i}.npz", features=regions, norm_bb=boxes)
    return tmp_path / "captions.jsonl", features


def test_captions_to_a_trained_visual_t5_that_scores(test_models_dir, tmp_path, capfd) -> None:
    captions, features = write_inputs(tmp_path)
    triples = tmp_path / "triples.parquet"
    common = ["--models", str(test_models_dir), "--chunk-size", "16", "--val-fraction", "0.25"]
    assert main(["vqa-data", str(captions), "-o", str(triples), *common]) == 0
    table = pq.read_table(triples).to_pylist()
    assert {r["split"] for r in table} == {"train", "val"}
    assert any(r["answerable"] for r in table)

    out = tmp_path / "visual-t5"
    train = [
        str(triples),
        "--features",
        str(features),
        "-o",
        str(out),
        "--init",
        str(test_models_dir / "tqa"),
    ]
    train += ["--batch-size", "2", "--learning-rate", "3e-3", "--logging-steps", "1", "--save-steps", "2"]
    settings = TrainSettings(
        init=str(test_models_dir / "tqa"), epochs=3, batch_size=2, learning_rate=3e-3, logging_steps=1,
        save_steps=2, workers=0,
    )  # fmt: skip
    with pytest.raises(KeyboardInterrupt):  # killed at step 3, after the checkpoint of step 2
        train_visual_t5(triples, str(features), out, settings=settings, callbacks=[KillAt(3)])
    assert (out / "checkpoints" / "checkpoint-2").is_dir() and not (out / "training.json").exists()
    assert main(["vqa-train", *train, "--epochs", "3"]) == 2  # checkpoints there: --resume or another DIR
    assert "--resume" in capfd.readouterr().err
    transformers_log: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = transformers_log.append  # type: ignore[method-assign]
    logging.getLogger("transformers").addHandler(handler)
    try:
        assert main(["vqa-train", *train, "--epochs", "3", "--resume"]) == 0
    finally:
        logging.getLogger("transformers").removeHandler(handler)
    # the resume says where it resumed from, and neither the Trainer nor the loading warns of missing keys
    assert "resumed from checkpoint-2" in capfd.readouterr().err
    assert [r.getMessage() for r in transformers_log if "missing" in r.getMessage().lower()] == []
    record = json.loads((out / "training.json").read_text())
    assert record["resumed_from"] == "checkpoint-2"
    train_rows = sum(r["split"] == "train" for r in table)
    assert record["steps"] == 3 * -(-train_rows // 2)  # every step once: the resumed run began at step 3
    losses = record["losses"]
    assert len(losses) == record["steps"] and losses[-1] < losses[0]
    val = record["validation"]
    assert val["triples"] == sum(r["split"] == "val" for r in table)
    assert all(0.0 <= val[k] <= 1.0 for k in ("exact_match", "token_f1", "answerability_accuracy"))
    assert record["checkpoint"] == checkpoint_fingerprint(out)

    scores = tmp_path / "scores.jsonl"
    score = ["score", str(captions), "--variant", "img", "--models", str(test_models_dir), "--vqa", str(out)]
    assert main([*score, "--features", str(features), "-o", str(scores)]) == 0
    rows = [json.loads(line) for line in scores.read_text().splitlines()]
    assert len(rows) == 48 and all(math.isfinite(r["qace"]) for r in rows)
    assert f"vqa:{record['checkpoint']}" in rows[0]["signature"]


def test_bad_arguments_fail_before_any_model_loads(tmp_path, capsys) -> None:
    captions, features = write_inputs(tmp_path)
    assert main(["vqa-data", str(captions), "-o", str(tmp_path / "t.parquet"), "--unanswerable", "1.5"]) == 2
    assert "--unanswerable" in capsys.readouterr().err
    assert main(["vqa-data", str(captions), "-o", str(tmp_path / "t.csv")]) == 2
    assert ".parquet" in capsys.readouterr().err
    triples = tmp_path / "t.parquet"
    columns = {"question": ["q?"], "answer": ["a"], "image_id": ["nowhere"], "split": ["train"]}
    pq.write_table(pa.table(columns | {"answerable": [True]}), triples)
    assert main(["vqa-train", str(triples), "--features", str(features), "-o", str(tmp_path / "m")]) == 2
    err = capsys.readouterr().err
    assert "nowhere" in err and "qace features extract" in err
