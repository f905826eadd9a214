"""Load the models a config needs and wrap each in a runner of the chosen backend."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qace.config import QACEConfig
from qace.engine.tokenize import unanswerable_id
from qace.errors import BackendUnavailableError, ModelNotFoundError
from qace.metric.pipeline import Models


def _runner(model: Any, config: QACEConfig) -> Any:
    if config.backend == "torch":
        from qace.engine.torch_runner import TorchRunner

        return TorchRunner(model, device=config.device)
    raise BackendUnavailableError(f"backend {config.backend!r} is not available in this build; use --backend torch")


def build_models(
    config: QACEConfig,
    *,
    models_dir: str | Path | None = None,
    qg: str | Path | None = None,
    tqa: str | Path | None = None,
    vqa: str | Path | None = None,
) -> tuple[Models, dict[str, str], bool]:
    """Models for ``config``: runners, tokenizers, signature fingerprints, and whether any is a test model.

    Explicit ``qg``/``tqa``/``vqa`` win over ``models_dir/<role>``, which wins over the paper's models.
    Visual-T5 is loaded only for QACE-Img.
    """
    from qace.engine.torch_runner import DTYPES
    from qace.models import loading

    base = Path(models_dir).expanduser() if models_dir is not None else None
    if base is not None and not base.is_dir():
        raise ModelNotFoundError(f"models directory {base} does not exist; create it with `qace make-test-models "
                                 f"{base}` (test models) or put qg/, tqa/ and vqa/ checkpoints there")
    defaults = loading.default_sources()
    explicit = {"qg": qg, "tqa": tqa, "vqa": vqa}
    roles = ("qg", "tqa", "vqa") if config.variant == "img" else ("qg", "tqa")
    sources = {role: str(explicit[role] or (base / role if base else defaults[role])) for role in roles}
    dtype = DTYPES[config.precision]
    qg_model, qg_tok = loading.load_seq2seq(sources["qg"], role="QG", device=config.device, dtype=dtype)
    tqa_model, tqa_tok = loading.load_seq2seq(sources["tqa"], role="TQA", device=config.device, dtype=dtype)
    models = Models(
        qg=_runner(qg_model, config), qg_tokenizer=qg_tok,
        tqa=_runner(tqa_model, config), tqa_tokenizer=tqa_tok, tqa_unanswerable=unanswerable_id(tqa_tok),
    )
    if "vqa" in sources:
        vqa_model, vqa_tok = loading.load_visual_t5(sources["vqa"], device=config.device, dtype=dtype)
        models.vqa, models.vqa_tokenizer = _runner(vqa_model, config), vqa_tok
        models.vqa_unanswerable = unanswerable_id(vqa_tok)
    fingerprints = {role: loading.checkpoint_fingerprint(src) for role, src in sources.items()}
    test_models = any(loading.is_test_model(src) for src in sources.values())
    return models, fingerprints, test_models
