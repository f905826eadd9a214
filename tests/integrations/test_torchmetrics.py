"""torchmetrics door: QACEScore collects text, scores once per compute, and syncs over two gloo ranks."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from qace.errors import ConfigError, InputError
from qace.integrations import shared
from qace.integrations.torchmetrics import QACEScore
from qace.reward import QACEReward

REPO = Path(__file__).resolve().parents[2]
CAPTIONS = ["a girl runs on the beach", "a dog in the snow", "", "two men play football in a park"]
REFS = [
    ["a girl in a red dress runs on the beach", "a child plays near the sea"],
    ["a brown dog runs through snow"],
    ["a cat sleeps on a sofa"],
    "men are playing soccer on the grass",
]


@pytest.fixture(scope="module")
def expected(test_models_dir: Path) -> list[dict[str, float]]:
    reward = QACEReward(models=test_models_dir, progress=False)
    refs = [[r] if isinstance(r, str) else r for r in REFS]
    return [r.scores or {"qace": 0.0} for r in reward.score(CAPTIONS, references=refs)]


def test_mean_components_and_per_sample(test_models_dir: Path, expected: list[dict[str, float]]) -> None:
    metric = QACEScore(models=test_models_dir, per_sample=True, components=True)
    metric.update(CAPTIONS[:2], REFS[:2])
    metric.update(CAPTIONS[2:], REFS[2:])
    out = metric.compute()
    want = [e["qace"] for e in expected]
    assert out["qace_per_sample"].tolist() == pytest.approx(want, abs=1e-6)
    assert out["qace"].item() == pytest.approx(sum(want) / 4, abs=1e-6)
    assert out["qace_f1"].item() == pytest.approx(sum(e.get("qace_f1", 0.0) for e in expected) / 4, abs=1e-6)
    assert out["qace_an_per_sample"][2].item() == 0.0  # the empty caption
    plain = QACEScore(models=test_models_dir)
    plain.update(CAPTIONS[:3], REFS[:3])
    plain.update(CAPTIONS[3], REFS[3])  # one caption and its one reference, as strings
    assert plain.compute().item() == pytest.approx(out["qace"].item(), abs=1e-6)


def test_one_engine_per_process(test_models_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    built = []
    original = QACEReward.__init__

    def counting(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        built.append(1)
        original(self, *args, **kwargs)

    monkeypatch.setattr(shared, "_ENGINES", {})
    monkeypatch.setattr(QACEReward, "__init__", counting)
    for _ in range(3):  # a fresh metric per epoch, compute per epoch
        metric = QACEScore(models=test_models_dir)
        metric.update(CAPTIONS[:1], REFS[:1])
        metric.compute()
        metric.reset()
    assert len(built) == 1


def test_unicode_survives_the_byte_states(test_models_dir: Path) -> None:
    metric = QACEScore(models=test_models_dir)
    metric.update(["un café près de la tour Eiffel 🗼"], [["a café next to the Eiffel tower"]])
    from qace.integrations.torchmetrics import _decode

    assert _decode(metric.captions, metric.caption_lengths) == ["un café près de la tour Eiffel 🗼"]


def test_bad_arguments_fail_before_models_load(test_models_dir: Path) -> None:
    with pytest.raises(ConfigError, match="variant"):
        QACEScore(variant="both")
    with pytest.raises(ConfigError, match="unknown QACE setting"):
        QACEScore(modles=test_models_dir)
    metric = QACEScore(models=test_models_dir)
    with pytest.raises(InputError, match="2 captions but 1 targets"):
        metric.update(CAPTIONS[:2], REFS[:1])
    with pytest.raises(InputError, match="sample 1"):
        metric.update(CAPTIONS[:2], [REFS[0], []])
    with pytest.raises(InputError, match="image id"):
        QACEScore(variant="img", models=test_models_dir).update(["a dog"], [None])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_gloo_ranks_agree_with_one_process(
    test_models_dir: Path, expected: list[dict[str, float]], tmp_path: Path
) -> None:
    """Rank 0 sees captions 0-2, rank 1 caption 3 then nothing: both get all four scores."""
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
        "GLOO_SOCKET_IFNAME": "lo",  # loopback: no wait on resolving this host's name
        "OMP_NUM_THREADS": "1",
    }
    worker = Path(__file__).with_name("ddp_worker.py")
    data = tmp_path / "inputs.json"
    data.write_text(json.dumps({"captions": CAPTIONS, "refs": REFS}))
    logs = [tmp_path / f"{rank}.log" for rank in (0, 1)]
    with logs[0].open("w") as err0, logs[1].open("w") as err1:
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    str(worker),
                    str(rank),
                    str(test_models_dir),
                    str(data),
                    str(tmp_path / f"{rank}.json"),
                ],
                env=env,
                stderr=err,
            )
            for rank, err in ((0, err0), (1, err1))
        ]
        codes = [p.wait(timeout=240) for p in procs]
    stderr = "\n".join(f"rank {r} stderr:\n{log.read_text()[-3000:]}" for r, log in enumerate(logs))
    assert codes == [0, 0], stderr
    results = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in (0, 1)]
    want = [e["qace"] for e in expected]
    for result in results:
        assert result["per_sample"] == pytest.approx(want, abs=1e-6)  # rank 0's captions, then rank 1's
        assert result["mean"] == pytest.approx(sum(want) / 4, abs=1e-6)
        assert result["scored_here"] == 2  # each rank scored its share, not all four
        assert result["empty_rank_mean"] == pytest.approx(want[3], abs=1e-6)


def test_lightning_validation_loop_loads_models_once_on_the_module_device(
    test_models_dir: Path, expected: list[dict[str, float]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two validation runs of a LightningModule that logs the metric: one engine, on the module's device."""
    lightning = pytest.importorskip("lightning")
    built: list[str] = []
    original = shared.shared_reward

    def recording(**settings):  # noqa: ANN003, ANN202
        reward = original(**settings)
        if id(reward) not in built:
            built.append(id(reward))
        return reward

    monkeypatch.setattr(shared, "_ENGINES", {})
    monkeypatch.setattr("qace.integrations.torchmetrics.shared_reward", recording)

    class Captioner(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)
            self.val_qace = QACEScore(models=test_models_dir)

        def validation_step(self, batch, batch_idx):  # noqa: ANN001, ANN201
            captions, refs = batch
            self.val_qace.update(captions, refs)
            self.log("val_qace", self.val_qace, on_epoch=True, batch_size=len(captions))

    samples = list(zip(CAPTIONS, REFS, strict=True))
    loader = torch.utils.data.DataLoader(
        samples, batch_size=2, collate_fn=lambda b: tuple(map(list, zip(*b, strict=True)))
    )
    module = Captioner()
    trainer = lightning.Trainer(
        accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False
    )
    for _ in range(2):
        (logged,) = trainer.validate(module, dataloaders=loader, verbose=False)
        assert logged["val_qace"] == pytest.approx(sum(e["qace"] for e in expected) / 4, abs=1e-6)
    assert len(built) == 1
    assert shared.shared_reward(models=test_models_dir, device="cpu", variant="ref").device == str(
        module.device
    )


@pytest.mark.gpu
def test_models_load_on_the_metric_device_on_a_gpu(
    test_models_dir: Path, expected: list[dict[str, float]]
) -> None:
    one_process = {"host_workers": 0, "spacy_workers": 0}  # what is tested is where the models load
    metric = QACEScore(models=test_models_dir, **one_process).to("cuda")
    metric.update(CAPTIONS, REFS)
    value = metric.compute()
    reward = shared.shared_reward(
        models=test_models_dir, device=str(metric.device), variant="ref", **one_process
    )
    assert reward.device.startswith("cuda") and str(metric.device).startswith("cuda")
    assert value.item() == pytest.approx(sum(e["qace"] for e in expected) / 4, abs=1e-4)
