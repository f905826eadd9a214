"""The metric's models for a config: each loaded and wrapped in a runner of the chosen backend."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from qace.config import QACEConfig
from qace.engine.device_lock import device_lock
from qace.errors import BackendUnavailableError, ModelNotFoundError
from qace.metric.pipeline import ModelRunners
from qace.metric.prompts import unanswerable_id
from qace.precision import torch_dtype


def _runner(model: Any, config: QACEConfig, source: str, fingerprint: str) -> Any:
    """Wrap a loaded model in the configured backend's runner (ONNX exports it on first use)."""
    if config.backend == "torch":
        from qace.families import torch_runner

        return torch_runner(model, device=config.device)
    if config.backend == "onnx":
        from qace.export.cache import runner_for

        return runner_for(
            model,
            source,
            precision=config.precision,
            device=config.device,
            fingerprint=fingerprint,
            max_batch=(config.max_batch_rows, config.max_batch_tokens),
        )
    raise BackendUnavailableError(f"backend {config.backend!r} is not available; use --backend torch or onnx")


def build_models(
    config: QACEConfig,
    *,
    models_dir: str | Path | None = None,
    qg: str | Path | None = None,
    tqa: str | Path | None = None,
    vqa: str | Path | None = None,
) -> tuple[ModelRunners, dict[str, str], bool]:
    """The models of ``config`` (`ModelRunners`), their signature fingerprints, and whether any is a
    test model.

    Explicit ``qg``/``tqa``/``vqa`` win over ``models_dir/<role>``, which wins over the paper's models.
    ``models_dir`` is local only: a role it lacks is a `ModelNotFoundError`, never a hub lookup.
    Visual-T5 is loaded only for QACE-Img.
    """
    from qace.models import loading
    from qace.models.sources import is_test_model, model_sources

    if config.backend == "onnx":  # a missing onnxruntime(-gpu) fails here, before any model loads
        from qace.engine.onnx_runner import check_device

        check_device(config.device)
    base = Path(models_dir).expanduser() if models_dir is not None else None
    if base is not None and not base.is_dir():
        raise ModelNotFoundError(
            f"models directory {base} does not exist; create it with `qace make-test-models "
            f"{base}` (test models) or put qg/, tqa/ and vqa/ checkpoints there"
        )
    explicit = {"qg": qg, "tqa": tqa, "vqa": vqa}
    roles = ("qg", "tqa", "vqa") if config.variant == "img" else ("qg", "tqa")
    absent = [f"{role}/" for role in roles if base and not explicit[role] and not (base / role).exists()]
    if base and absent:  # a models directory is local only: a role missing there is no hub lookup
        held = ", ".join(sorted(p.name for p in base.iterdir())[:10]) or "nothing"
        raise ModelNotFoundError(
            f"models directory {base} has no {' or '.join(absent)} (it holds: {held}); --models is local "
            "only, so point it at a directory with qg/, tqa/ and, for QACE-Img, vqa/, or name single "
            "models with --qg/--tqa/--vqa"
        )
    sources = model_sources(base, explicit, roles)
    # ONNX only needs the torch weights to export them, on the CPU, in fp32
    onnx = config.backend == "onnx"
    dtype = torch.float32 if onnx else torch_dtype(config.precision)
    device = "cpu" if onnx else config.device

    def load(role: str, src: str) -> Any:
        if role == "vqa":
            return loading.load_visual_t5(src, device=device, dtype=dtype)
        return loading.load_seq2seq(src, role=role.upper(), device=device, dtype=dtype)

    # the weight files are hashed for the signature while the models load, each model's in a thread of its
    # own (hashing reads with the interpreter lock released: a local T5-base is about 900 MB, 0.8 s); the
    # models load one after another, since transformers' loading keeps global state (two at once lost
    # their tied weights)
    with ThreadPoolExecutor(len(sources), thread_name_prefix="qace-fingerprint") as pool:
        hashes = {role: pool.submit(loading.checkpoint_fingerprint, src) for role, src in sources.items()}
        loaded = {role: load(role, src) for role, src in sources.items()}
        fingerprints = {role: job.result() for role, job in hashes.items()}
    runners = {
        role: _runner(model, config, sources[role], fingerprints[role]) for role, (model, _) in loaded.items()
    }
    models = ModelRunners(
        qg=runners["qg"],
        qg_tokenizer=loaded["qg"][1],
        tqa=runners["tqa"],
        tqa_tokenizer=loaded["tqa"][1],
        tqa_unanswerable=unanswerable_id(loaded["tqa"][1]),
        device_lock=device_lock(config.device),
    )
    if "vqa" in loaded:
        models.vqa, models.vqa_tokenizer = runners["vqa"], loaded["vqa"][1]
        models.vqa_unanswerable = unanswerable_id(loaded["vqa"][1])
    test_models = any(is_test_model(src) for src in sources.values())
    return models, fingerprints, test_models
