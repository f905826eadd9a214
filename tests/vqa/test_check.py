"""``qace models check``: the authors' demo example on the models at hand, and the `real_models` marker."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from qace.cli import main
from qace.errors import FeatureError
from qace.models.sources import DEFAULT_QG, DEFAULT_TQA, VQA_CHECKPOINT_URL
from qace.vqa import check
from qace.vqa.check import TEXT_PAIRS, VISUAL_PAIRS, CheckResult, StageCheck
from tests.helpers import SHARED_DATA, random_regions


def write_npz(path, seed: int = 0):
    features, boxes = random_regions(seed)
    np.savez(path, features=features, norm_bb=boxes)
    return path


def result(text=TEXT_PAIRS, visual=VISUAL_PAIRS, precision="fp32", hints=(), test_models=()) -> CheckResult:
    stages = [StageCheck("QG+TQA on the caption", TEXT_PAIRS, list(text))]
    stages.append(StageCheck("Visual-T5 on butd_sample.npz", VISUAL_PAIRS, list(visual)))
    return CheckResult(stages, ["two men", "horses", "ground"], precision, list(hints), test_models)


@pytest.mark.real_models
def test_the_papers_models_reproduce_the_authors_demo(monkeypatch) -> None:
    shared = SHARED_DATA / "region_features" / "butd_sample.npz"
    features = shared if shared.is_file() else check.SAMPLE_FEATURES
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    missing = check.missing_pieces(features=features)
    if missing:
        pytest.skip("real models absent: " + "; ".join(x.line() for x in missing))
    outcome = check.check_models(features=features)
    assert outcome.ok, check.report(outcome)


def test_pairs_compare_as_sets_in_any_order() -> None:
    outcome = result(text=reversed(TEXT_PAIRS), visual=reversed(VISUAL_PAIRS))
    assert outcome.ok and outcome.causes() == []
    assert outcome.verdict().startswith("verdict: MATCH")


def test_each_mismatch_names_its_likely_cause() -> None:
    other_questions = [("Who rides?", "men"), *TEXT_PAIRS[1:]]
    assert "wrong QG checkpoint" in result(text=other_questions).verdict()
    other_answer = [*TEXT_PAIRS[:2], ("Where are the horses?", "field")]
    verdict = result(text=other_answer).verdict()
    assert "wrong TQA checkpoint" in verdict and "QG" not in verdict
    other_visual = [*VISUAL_PAIRS[:2], ("Where are the horses?", "ground")]
    verdict = result(visual=other_visual, precision="bf16").verdict()
    assert "wrong Visual-T5 checkpoint" in verdict and "precision bf16" in verdict
    assert "TQA" not in verdict
    lines = result(visual=other_visual).stages[1].lines()
    assert any("'field'" in line and "'ground'" in line and "differs" in line for line in lines)


def test_test_models_are_named_as_such_not_blamed_on_the_tokenizer(
    test_models_dir, tmp_path, capsys, monkeypatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    features = write_npz(tmp_path / "butd_sample.npz")
    assert main(["models", "check", str(test_models_dir), "--features", str(features)]) == 1
    out = capsys.readouterr().out
    assert "Two men are riding horses on the ground" in out
    for question, answer in TEXT_PAIRS + VISUAL_PAIRS:
        assert f"{question!r}: expected {answer!r}" in out
    verdict = out.strip().splitlines()[-1]
    assert verdict.startswith("verdict: TEST MODELS: these are the test models")
    assert "MISMATCH" not in out and "tokenizer" not in out and "wrong" not in out
    assert out.count("test models (random outputs)") == 2


def test_a_test_model_among_real_ones_is_named() -> None:
    verdict = result(visual=VISUAL_PAIRS[:2], test_models=("vqa",)).verdict()
    assert verdict.startswith("verdict: TEST MODELS: Visual-T5 is a test model") and "wrong" not in verdict
    assert not result(test_models=("qg", "tqa")).ok  # pairs that happen to match still prove nothing
    assert "QG and TQA are test models" in result(test_models=("qg", "tqa")).verdict()


@pytest.fixture
def bare_machine(tmp_path, monkeypatch) -> Path:
    """Nothing cached, no Visual-T5, no sample features, no proxy."""
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setattr(check, "SAMPLE_FEATURES", tmp_path / "cache" / "butd_sample.npz")
    monkeypatch.setenv("QACE_VQA", str(tmp_path / "no-visual-t5"))
    for proxy in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(proxy, raising=False)
    return tmp_path


@pytest.fixture
def network(monkeypatch) -> dict[str, list]:
    """Name lookups fail, as without a network; the hosts of lookups and connections, and sleeps, are
    recorded."""
    calls: dict[str, list] = {"hosts": [], "sleeps": []}

    def lookup(host, *args, **kwargs):
        calls["hosts"].append(host)
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    def connect(address, *args, **kwargs):
        lookup(address[0])

    monkeypatch.setattr(socket, "getaddrinfo", lookup)
    monkeypatch.setattr(socket, "create_connection", connect)
    monkeypatch.setattr(time, "sleep", lambda seconds: calls["sleeps"].append(seconds))
    return calls


def no_model_loads(*args, **kwargs):
    raise AssertionError("a model was loaded")


def test_offline_every_missing_piece_is_listed_at_once_without_the_network(
    bare_machine, network, capsys, monkeypatch
) -> None:
    """HF_HUB_OFFLINE: QG, TQA, Visual-T5 and the sample features, each with how to get it, in one error
    before any model loads, and the network is never asked."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("qace.metric.runners.build_models", no_model_loads)
    assert main(["models", "check"]) == 2
    err = capsys.readouterr().err
    assert "4 piece(s)" in err
    for piece in (
        f"QG model {DEFAULT_QG}",
        f"TQA model {DEFAULT_TQA}",
        "Visual-T5: nothing at",
        "sample features",
    ):
        assert piece in err
    assert f"`hf download {DEFAULT_QG}`" in err and f"`hf download {DEFAULT_TQA}`" in err
    assert VQA_CHECKPOINT_URL in err and "QACE_VQA" in err and check.SAMPLE_FEATURES_URL in err
    assert "huggingface-cli" not in err and err.count("HF_HUB_OFFLINE is set") == 3
    assert network == {"hosts": [], "sleeps": []}


def test_an_unreachable_hub_is_asked_once_and_never_retried(
    bare_machine, network, capsys, monkeypatch, tmp_path
) -> None:
    """Without HF_HUB_OFFLINE and without a network: one lookup per host, no retry (huggingface_hub's
    own client backs off for half a minute), every missing piece listed."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr("qace.metric.runners.build_models", no_model_loads)
    features = write_npz(tmp_path / "butd_sample.npz")
    assert main(["models", "check", "--features", str(features)]) == 2
    err = capsys.readouterr().err
    for piece in (f"QG model {DEFAULT_QG}", f"TQA model {DEFAULT_TQA}", "Visual-T5: nothing at"):
        assert piece in err
    assert err.count("huggingface.co does not answer") == 2 and "sample features" not in err
    assert network["hosts"] == ["huggingface.co"] and network["sleeps"] == []
    assert main(["models", "check"]) == 2  # the features too: both hosts asked at once, each once
    assert "raw.githubusercontent.com does not answer" in capsys.readouterr().err
    assert sorted(network["hosts"][1:]) == ["huggingface.co", "raw.githubusercontent.com"]
    assert network["sleeps"] == []


def test_pieces_are_missing_only_where_they_cannot_be_downloaded(bare_machine, monkeypatch) -> None:
    """A hub that answers makes uncached models downloadable; the release's Visual-T5 (no tokenizer files)
    needs t5-small's tokenizer; a --models DIR is local only."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    release = bare_machine / "ckpt"
    release.mkdir()
    (release / "config.json").write_text("{}")
    answers = {"https://huggingface.co": True}
    asked: list[list[str]] = []

    def probe(urls):
        asked.append(list(urls))
        return {url: answers.get(url, False) for url in urls}

    assert check.missing_pieces(vqa=str(release), probe=probe) == [
        check.Missing(
            "sample features",
            f"not at {check.SAMPLE_FEATURES}, and raw.githubusercontent.com does not answer (offline?)",
            check._FEATURES_FIX,
        )
    ]
    assert set(asked[0]) == {"https://huggingface.co", check.SAMPLE_FEATURES_URL}
    answers["https://huggingface.co"] = False
    missing = check.missing_pieces(vqa=str(release), visual=True, features=__file__, probe=probe)
    assert [x.piece for x in missing] == [
        f"QG model {DEFAULT_QG}",
        f"TQA model {DEFAULT_TQA}",
        "t5-small tokenizer",
    ]
    assert "has no tokenizer" in missing[2].why and "`hf download t5-small`" in missing[2].fix
    models = bare_machine / "models"
    (models / "qg").mkdir(parents=True)
    missing = check.missing_pieces(models=models, visual=False, probe=probe)
    assert [x.line() for x in missing] == [
        f"TQA model {models / 'tqa'}: no such directory; get it: pass --tqa DIR, a checkpoint in Hugging "
        "Face layout, or leave it out for the paper's"
    ]


def test_a_failing_check_imports_no_torch(bare_machine) -> None:
    """Everything missing is reported before torch (seconds to import) is: the check fails at once."""
    script = (
        "import json, sys\n"
        "from qace.cli import main\n"
        "rc = main(['models', 'check'])\n"
        "heavy = {name: name in sys.modules for name in ('torch', 'transformers')}\n"
        "print(json.dumps({'rc': rc, **heavy}))\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(bare_machine / "hf-cache"),
           "QACE_VQA": str(bare_machine / "none"), "HOME": str(bare_machine)}  # fmt: skip
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert json.loads(done.stdout.splitlines()[-1]) == {"rc": 2, "torch": False, "transformers": False}
    assert "sample features" in done.stderr and "Visual-T5" in done.stderr


def test_bad_arguments_fail_before_any_model_loads(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["models", "check", str(tmp_path / "nope")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["models", "check", "--features", str(tmp_path / "none.npz")]) == 2
    assert check.SAMPLE_FEATURES_URL in capsys.readouterr().err


def test_sample_features_are_downloaded_once_unless_offline(tmp_path, monkeypatch) -> None:
    source = write_npz(tmp_path / "release.npz", seed=3)
    monkeypatch.setattr(check, "SAMPLE_FEATURES_URL", source.as_uri())
    monkeypatch.setattr(check, "SAMPLE_FEATURES", tmp_path / "cache" / "butd_sample.npz")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FeatureError, match="HF_HUB_OFFLINE"):
        check.sample_features(None)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    regions = check.sample_features(None)
    assert regions.shape == (36, 2054) and (tmp_path / "cache" / "butd_sample.npz").is_file()
    with np.load(source) as data:
        np.testing.assert_allclose(regions[:, :2048], data["features"])
