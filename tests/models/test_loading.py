"""Loading: offline-first, every failure a ModelNotFoundError that names role and fix."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from qace.config import QACEConfig
from qace.errors import ConfigError, ModelNotFoundError
from qace.metric.runners import build_models
from qace.models.loading import (
    checkpoint_fingerprint,
    load_seq2seq,
    load_visual_t5,
)
from qace.models.sources import is_test_model
from qace.models.visual_t5 import VisualT5ForConditionalGeneration


@pytest.fixture(autouse=True)
def _offline(monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # never wait on network retries in tests


def test_build_models_from_dir(test_models_dir) -> None:
    models, fingerprints, test_models = build_models(QACEConfig(variant="img"), models_dir=test_models_dir)
    assert set(fingerprints) == {"qg", "tqa", "vqa"} and test_models
    assert isinstance(models.vqa.model, VisualT5ForConditionalGeneration)
    for runner, tokenizer in (
        (models.qg, models.qg_tokenizer),
        (models.tqa, models.tqa_tokenizer),
        (models.vqa, models.vqa_tokenizer),
    ):
        assert not runner.model.training
        assert tokenizer.eos_token_id == 1
    for fingerprint in fingerprints.values():
        assert fingerprint.startswith("sha256-") and len(fingerprint) == 19


def test_qace_ref_skips_visual_t5(test_models_dir) -> None:
    models, fingerprints, _ = build_models(QACEConfig(variant="ref"), models_dir=test_models_dir)
    assert set(fingerprints) == {"qg", "tqa"} and models.vqa is None


def test_missing_dir_names_role_and_fix(tmp_path) -> None:
    with pytest.raises(ModelNotFoundError, match="QG model") as err:
        load_seq2seq(str(tmp_path / "nope"), role="qg")
    assert "make-test-models" in str(err.value) and "--models" in str(err.value)
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        build_models(QACEConfig(), models_dir=tmp_path / "nope")


def test_dir_without_config_is_rejected(tmp_path) -> None:
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        load_seq2seq(str(tmp_path), role="tqa")


def test_non_t5_dir_is_rejected(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(ModelNotFoundError, match="not a T5 model"):
        load_seq2seq(str(tmp_path), role="tqa")


def test_t5_dir_without_weights_is_rejected(tmp_path, test_models_dir) -> None:
    shutil.copy(test_models_dir / "qg" / "config.json", tmp_path / "config.json")
    with pytest.raises(ModelNotFoundError, match="QG model"):
        load_seq2seq(str(tmp_path), role="qg")


def test_vqa_dir_without_img_emb_is_rejected(test_models_dir) -> None:
    with pytest.raises(ModelNotFoundError, match="img_emb"):
        load_visual_t5(test_models_dir / "qg")


def test_raw_state_dict(tmp_path, test_models_dir) -> None:
    model = VisualT5ForConditionalGeneration.from_pretrained(test_models_dir / "vqa")
    state = {k: v for k, v in model.state_dict().items() if "img_emb" not in k}
    torch.save(state, tmp_path / "plain.bin")
    with pytest.raises(ModelNotFoundError, match="img_emb"):
        load_visual_t5(tmp_path / "plain.bin")
    torch.save({"module." + k: v for k, v in model.state_dict().items()}, tmp_path / "visual.pt")
    try:  # with t5-small in the HF cache this loads; offline without it, the error names t5-small
        loaded, _ = load_visual_t5(tmp_path / "visual.pt")
    except ModelNotFoundError as exc:
        assert "t5-small" in str(exc)
    else:
        assert isinstance(loaded, VisualT5ForConditionalGeneration)


def test_hub_id_offline_fails_fast_with_hint() -> None:
    with pytest.raises(ModelNotFoundError, match="HF_HUB_OFFLINE") as err:
        load_seq2seq("qace-nonexistent/t5-model", role="tqa")
    assert "TQA model" in str(err.value) and "hf download" in str(err.value)
    assert "as a Hugging Face hub id, since no local path has that name" in str(err.value)


@pytest.fixture()
def hub_calls(monkeypatch, tmp_path) -> list:
    """Names transformers is asked to load, from the working directory ``tmp_path``, online allowed."""
    from qace.models import loading

    calls: list = []

    def from_pretrained(name, **kwargs):
        calls.append(name)
        raise OSError(f"{name} is not on the hub")

    monkeypatch.setattr(loading.AutoConfig, "from_pretrained", from_pretrained)
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.chdir(tmp_path)
    return calls


def test_relative_models_dir_without_a_role_never_asks_the_hub(hub_calls, tmp_path) -> None:
    (tmp_path / "mymodels" / "tqa").mkdir(parents=True)
    with pytest.raises(ModelNotFoundError, match=r"models directory mymodels has no qg/ \(it holds: tqa\)"):
        build_models(QACEConfig(), models_dir="mymodels")
    assert hub_calls == []  # not even "mymodels/qg" as a hub id


def test_a_local_folder_name_is_never_taken_for_a_hub_user(hub_calls, tmp_path) -> None:
    (tmp_path / "owner").mkdir()
    with pytest.raises(ModelNotFoundError, match="no such model directory"):
        load_seq2seq("owner/t5", role="qg")
    assert hub_calls == []
    with pytest.raises(ModelNotFoundError, match="as a Hugging Face hub id"):
        load_seq2seq("other-owner/t5", role="qg")  # nothing local matches: the hub is asked
    assert hub_calls == ["other-owner/t5", "other-owner/t5"]  # the cache, then online


def test_load_seq2seq_rejects_unknown_role(test_models_dir) -> None:
    with pytest.raises(ConfigError):
        load_seq2seq(str(test_models_dir / "qg"), role="vqa")


def test_checkpoint_fingerprint(tmp_path, test_models_dir) -> None:
    assert checkpoint_fingerprint("valhalla/t5-base-qa-qg-hl") == "valhalla/t5-base-qa-qg-hl"
    qg = checkpoint_fingerprint(test_models_dir / "qg")
    assert qg == checkpoint_fingerprint(str(test_models_dir / "qg"))
    assert qg != checkpoint_fingerprint(test_models_dir / "tqa")
    copy = tmp_path / "qg"
    shutil.copytree(test_models_dir / "qg", copy)
    assert checkpoint_fingerprint(copy) == qg  # content, not path
    with pytest.raises(ModelNotFoundError):
        checkpoint_fingerprint(tmp_path)  # a directory without weights


def test_is_test_model(tmp_path, test_models_dir) -> None:
    assert is_test_model(test_models_dir / "tqa")
    assert not is_test_model(tmp_path)


def test_tokenizers_load_by_their_family_class_unless_the_checkpoint_names_another(
    tmp_path, test_models_dir
) -> None:
    """`load_tokenizer` gives what AutoTokenizer gives; it names the class itself only where the
    checkpoint's tokenizer_config.json names its family's (or nothing)."""
    from transformers import AutoTokenizer

    from qace.models.loading import load_tokenizer

    texts = ["A girl in a red dress running on the beach.", "question: who runs ?  context: a dog </s>"]
    want = AutoTokenizer.from_pretrained(test_models_dir / "qg")
    shutil.copytree(test_models_dir / "qg", tmp_path / "qg")
    config_path = tmp_path / "qg" / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    for named, expected in (
        ("T5TokenizerFast", "T5Tokenizer"),
        (None, "T5Tokenizer"),
        ("PreTrainedTokenizerFast", None),
    ):
        if named is None:
            config.pop("tokenizer_class", None)
        else:
            config["tokenizer_class"] = named
        config_path.write_text(json.dumps(config))
        got = load_tokenizer(tmp_path / "qg", "t5", local_files_only=True)
        assert got(texts)["input_ids"] == want(texts)["input_ids"]
        assert type(got).__name__ == (
            expected or type(AutoTokenizer.from_pretrained(tmp_path / "qg")).__name__
        )
    assert type(got).__name__ != "T5Tokenizer"  # another class named: AutoTokenizer's choice
