"""Offline-first loading of the three QACE models, with errors that say what to do next.

A missing or wrong model is the most common first-run failure, and transformers' own messages
(network retries, random init of missing weights) hide it. Every failure here becomes a
``ModelNotFoundError`` naming the role, what was tried and the fix; a checkpoint that loads but lacks
weights (e.g. a Visual-T5 without ``encoder.img_emb``) is rejected instead of silently random.

Half precision (the default on a GPU) builds the models from their weights with `qace.models.t5_modules`,
without importing transformers' modelling code (2-3.5 s of every run); fp32 loads transformers' classes,
whose forward the fp32 engine and the reference implementation share.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig

from qace.errors import ConfigError, ModelNotFoundError
from qace.models.sources import (
    RAW_STATE_DICT_SUFFIXES,
    TOKENIZER_FILES,
    VQA_BASE,
    hub_offline,
    looks_like_hub_id,
)
from qace.models.t5_modules import T5Settings, read_settings

logger = logging.getLogger(__name__)

WEIGHT_FILE_PATTERNS = ("*.safetensors", "pytorch_model*.bin")
IMG_EMB_KEYS = ("encoder.img_emb.weight", "encoder.img_emb.bias")


def _fix_hint() -> str:
    return (
        "Fix: pass --models DIR (a directory holding qg/, tqa/, vqa/ in Hugging Face layout), "
        "build tiny test models with `qace make-test-models DIR` (their scores mean nothing), "
        "or download the model with `hf download <id>` while online."
    )


def _not_found(role: str, tried: str, why: str) -> ModelNotFoundError:
    return ModelNotFoundError(f"{role.upper()} model: {why} (tried {tried}). {_fix_hint()}")


def _hub_attempts(name: str) -> list[bool]:
    """``local_files_only`` values to try, cache first; online only if HF_HUB_OFFLINE is not set."""
    return [True] if hub_offline() else [True, False]


HALF = (torch.float16, torch.bfloat16)
"""Precisions whose models are built without transformers' modelling code (`qace.models.t5_modules`)."""


def _load_t5(
    source: str,
    role: str,
    *,
    local_files_only: bool,
    dtype: torch.dtype,
    device: str | torch.device,
    visual: bool = False,
    tokenizer: bool = True,
) -> tuple[Any, Any]:
    """Load config, weights and (unless ``tokenizer`` is False: None) tokenizer of one checkpoint; raise
    ModelNotFoundError on anything odd."""
    if dtype in HALF:
        directory = checkpoint_dir(source, local_files_only)
        settings = read_settings(directory / "config.json")
        _check_t5(settings.model_type, role, source)
        model = _build(settings, read_checkpoint(directory), role, source, visual, device, dtype)
    else:
        config = AutoConfig.from_pretrained(source, local_files_only=local_files_only)
        _check_t5(config.model_type, role, source)
        model = _transformers_model(config, source, role, local_files_only, dtype, visual)
    if not tokenizer:
        return model, None
    return model, load_tokenizer(source, "t5", local_files_only=local_files_only)


TOKENIZER_CLASSES = {"t5": "T5Tokenizer", "bert": "BertTokenizer", "roberta": "RobertaTokenizer"}
"""Model type -> the tokenizer class ``AutoTokenizer`` picks for it, loaded by name (`load_tokenizer`)."""


def load_tokenizer(source: str | Path, model_type: str, *, local_files_only: bool, **kwargs: Any) -> Any:
    """The tokenizer ``AutoTokenizer.from_pretrained(source, ...)`` gives, loaded through its own class
    when the checkpoint's ``tokenizer_config.json`` names the class of its family (`TOKENIZER_CLASSES`,
    a ``Fast`` suffix or none at all included), else through ``AutoTokenizer``.

    ``AutoTokenizer``'s module imports transformers' generation code, which in some releases (5.17)
    imports ``torch._dynamo``: 1.8 s of every run that only needed a T5 or BERT tokenizer.
    """
    import transformers
    from transformers.utils.hub import cached_file

    family = TOKENIZER_CLASSES.get(model_type)
    named = None
    if family is not None:
        config = cached_file(
            str(source),
            "tokenizer_config.json",
            local_files_only=local_files_only,
            _raise_exceptions_for_missing_entries=False,
            _raise_exceptions_for_connection_errors=False,
        )
        if config is not None:
            named = json.loads(Path(config).read_text()).get("tokenizer_class")
    if family is not None and (named is None or named.removesuffix("Fast") == family):
        cls = getattr(transformers, family)
    else:
        cls = transformers.AutoTokenizer
    return cls.from_pretrained(str(source), local_files_only=local_files_only, **kwargs)


def _check_t5(model_type: str, role: str, source: str) -> None:
    if model_type != "t5":
        raise _not_found(role, source, f"checkpoint has model_type {model_type!r}, not a T5 model")


def _transformers_model(
    config: Any, source: str, role: str, local_files_only: bool, dtype: torch.dtype, visual: bool
) -> Any:
    """transformers' ``T5ForConditionalGeneration`` (or our Visual-T5 subclass of it), checked for
    missing weights."""
    from transformers import T5ForConditionalGeneration

    cls: type[T5ForConditionalGeneration] = T5ForConditionalGeneration
    if visual:
        from qace.models.visual_t5 import VisualT5ForConditionalGeneration

        cls = VisualT5ForConditionalGeneration
    model, info = cls.from_pretrained(
        source, config=config, dtype=dtype, local_files_only=local_files_only, output_loading_info=True
    )
    missing = sorted(set(info.get("missing_keys", ())))
    _warn_unexpected(role, source, info.get("unexpected_keys", ()))
    _check_missing(role, source, missing, visual)
    return model


def _check_missing(role: str, source: str, missing: Sequence[str], visual: bool) -> None:
    absent = [k for k in IMG_EMB_KEYS if visual and k in missing]
    if absent:
        raise _not_found(role, source, f"not a Visual-T5 checkpoint: weights {absent} are missing")
    if missing:
        raise _not_found(role, source, f"checkpoint lacks weights {list(missing)[:5]} (wrong architecture?)")


def _build(
    config: T5Settings,
    weights: dict[str, torch.Tensor],
    role: str,
    source: str,
    visual: bool,
    device: str | torch.device,
    dtype: torch.dtype,
) -> Any:
    """The half-precision model of ``weights`` (`qace.models.t5_modules.build_t5`), checked like
    transformers' loading is."""
    from qace.models.t5_modules import build_t5

    try:
        model, missing, unexpected = build_t5(config, weights, visual=visual, device=device, dtype=dtype)
    except ValueError as exc:  # an activation or layout these modules do not build
        raise _not_found(role, source, str(exc)) from exc
    _warn_unexpected(role, source, unexpected)
    _check_missing(role, source, missing, visual)
    return model


def checkpoint_dir(source: str, local_files_only: bool) -> Path:
    """A local checkpoint directory as it is; a hub id's snapshot in the Hugging Face cache (downloaded
    first unless ``local_files_only``): config, tokenizer and safetensors weights, else the legacy
    ``pytorch_model*.bin``."""
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    from huggingface_hub import snapshot_download

    patterns = ["*.json", "*.model", "*.safetensors"]
    directory = Path(snapshot_download(source, allow_patterns=patterns, local_files_only=local_files_only))
    if not any(directory.glob("*.safetensors")):
        legacy = ["pytorch_model*.bin", "pytorch_model.bin.index.json"]
        directory = Path(snapshot_download(source, allow_patterns=legacy, local_files_only=local_files_only))
    return directory


def read_checkpoint(directory: Path) -> dict[str, torch.Tensor]:
    """Every weight of a checkpoint directory: ``model.safetensors``, a sharded safetensors or
    ``pytorch_model.bin`` checkpoint (its index's files), or the legacy ``pytorch_model.bin``."""
    for single, index in (
        ("model.safetensors", "model.safetensors.index.json"),
        ("pytorch_model.bin", "pytorch_model.bin.index.json"),
    ):
        if (directory / single).is_file():
            return _read_state_dict(directory / single)
        if (directory / index).is_file():
            shards = sorted(set(json.loads((directory / index).read_text())["weight_map"].values()))
            weights: dict[str, torch.Tensor] = {}
            for shard in shards:
                weights.update(_read_state_dict(directory / shard))
            return weights
    raise FileNotFoundError(f"{directory} holds no model.safetensors or pytorch_model.bin weights")


def _load_source(
    name_or_path: str,
    role: str,
    dtype: torch.dtype,
    device: str | torch.device,
    visual: bool = False,
    tokenizer: bool = True,
) -> tuple[Any, Any]:
    """Local directory directly; hub id from the HF cache first, then online unless HF_HUB_OFFLINE=1.

    An existing path is local only; a name is taken for a hub id only when no local path matches it
    (`_looks_like_hub_id`), and the log and any error say so.
    """
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise _not_found(role, str(path), "directory has no config.json, so it is not a T5 checkpoint")
        attempts = [True]
        source = str(path)
    elif path.exists() or not looks_like_hub_id(name_or_path):
        raise _not_found(role, str(path), "no such model directory")
    else:
        attempts = _hub_attempts(name_or_path)
        source = name_or_path
        logger.info("%s model: no local path %r, so it is a Hugging Face hub id", role.upper(), source)
    errors: list[str] = []
    for local_only in attempts:
        try:
            return _load_t5(
                source,
                role,
                local_files_only=local_only,
                dtype=dtype,
                device=device,
                visual=visual,
                tokenizer=tokenizer,
            )
        except ModelNotFoundError:
            raise
        except (OSError, ValueError, KeyError) as exc:
            where = "local files" if local_only else "the Hugging Face hub"
            errors.append(f"{where}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            logger.debug("loading %s model from %s failed", role, where, exc_info=True)
    hub = "" if path.exists() else " as a Hugging Face hub id, since no local path has that name"
    offline = " (HF_HUB_OFFLINE=1, so the hub was not asked)" if hub_offline() and not path.exists() else ""
    raise _not_found(role, source, "could not load it" + hub + offline + "; " + "; ".join(errors))


def _finish(model: Any, device: str | torch.device, dtype: torch.dtype) -> Any:
    return model.to(device=device, dtype=dtype).eval()


def load_seq2seq(
    name_or_path: str, *, role: str, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> tuple[Any, Any]:
    """Load the QG or TQA T5 model (hub id or local directory) in eval mode, with its tokenizer."""
    if role.lower() not in {"qg", "tqa"}:
        raise ConfigError(f"load_seq2seq role must be 'qg' or 'tqa', got {role!r}")
    model, tokenizer = _load_source(str(name_or_path), role, dtype, device)
    return _finish(model, device, dtype), tokenizer


def load_visual_t5(
    name_or_path: str | Path, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> tuple[Any, Any]:
    """Load Visual-T5 from a checkpoint directory (Hugging Face layout; the release's ``ckpt/``, which
    has no tokenizer files, takes t5-small's tokenizer as the release did) or a raw state-dict file
    (t5-small's config and tokenizer)."""
    path = Path(name_or_path).expanduser()
    if path.is_file() and path.suffix in RAW_STATE_DICT_SUFFIXES:
        model, tokenizer = _load_raw_state_dict(path, dtype, device)
    else:
        _precheck_img_emb(path)
        own = not path.is_dir() or any((path / name).is_file() for name in TOKENIZER_FILES)
        model, tokenizer = _load_source(str(name_or_path), "vqa", dtype, device, visual=True, tokenizer=own)
        if not own:
            tokenizer = _from_base(_t5_tokenizer, "tokenizer", path)
    return _finish(model, device, dtype), tokenizer


def config_file(source: str, local_files_only: bool) -> Path:
    """The ``config.json`` of a local checkpoint directory or a hub id (from the cache, or downloaded
    unless ``local_files_only``), without loading it through transformers' config classes."""
    from transformers.utils.hub import cached_file

    return Path(str(cached_file(source, "config.json", local_files_only=local_files_only)))


def _t5_tokenizer(source: str, local_files_only: bool) -> Any:
    return load_tokenizer(source, "t5", local_files_only=local_files_only)


def _from_base(loader: Any, what: str, path: Path) -> Any:
    """``loader(VQA_BASE, local_files_only)`` (a config or tokenizer), from the cache first, then the hub
    unless HF_HUB_OFFLINE=1, for the Visual-T5 checkpoint at ``path`` that lacks its own."""
    errors: list[str] = []
    for local_only in _hub_attempts(VQA_BASE):
        try:
            return loader(VQA_BASE, local_only)
        except (OSError, ValueError) as exc:
            errors.append(f"{VQA_BASE} ({'cache' if local_only else 'hub'}): {type(exc).__name__}")
    raise _not_found("vqa", f"{path} + {VQA_BASE}", f"cannot load the t5-small {what}; " + "; ".join(errors))


def _warn_unexpected(role: str, source: str, unexpected: Sequence[str]) -> None:
    """Weights a checkpoint has and the model class does not use are dropped by the loader: say so."""
    if unexpected:
        logger.warning(
            "%s model %s: %d weight(s) the model does not use were dropped: %s",
            role.upper(),
            source,
            len(unexpected),
            sorted(unexpected)[:5],
        )


def weight_names(path: str | Path) -> set[str] | None:
    """The weight names of a checkpoint directory's single weight file (``model.safetensors`` or the
    release's ``pytorch_model.bin``) or of a raw state-dict file, read without loading a model; None
    where there is no single such file (sharded or absent)."""
    path = Path(path).expanduser()
    if path.is_file():
        return set(_read_state_dict(path))
    safetensors, legacy = path / "model.safetensors", path / "pytorch_model.bin"
    if safetensors.is_file():
        from safetensors import safe_open

        with safe_open(str(safetensors), framework="pt") as handle:
            return set(handle.keys())
    if legacy.is_file():
        return set(_read_state_dict(legacy))
    return None


def is_visual_t5_checkpoint(path: str | Path) -> bool:
    """True where the checkpoint's weights include the region projection ``encoder.img_emb``."""
    names = weight_names(path)
    return names is not None and all(k in names for k in IMG_EMB_KEYS)


def _precheck_img_emb(path: Path) -> None:
    """Reject a plain T5 directory before transformers loads it and random-initialises img_emb."""
    names = weight_names(path) if path.is_dir() else None
    absent = [k for k in IMG_EMB_KEYS if names is not None and k not in names]
    if absent:
        raise _not_found("vqa", str(path), f"not a Visual-T5 checkpoint: weights {absent} are missing")


def _read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    state = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise ValueError(f"{path} holds a {type(state).__name__}, not a state dict")
    for prefix in ("module.", "model."):  # DataParallel / Lightning wrappers
        if state and all(k.startswith(prefix) for k in state):
            state = {k[len(prefix) :]: v for k, v in state.items()}
    return state


def _load_raw_state_dict(path: Path, dtype: torch.dtype, device: str | torch.device) -> tuple[Any, Any]:
    """The release ships ``torch.save(model.state_dict())``: pair it with t5-small's config/tokenizer."""
    try:
        state = _read_state_dict(path)
    except (OSError, ValueError, RuntimeError) as exc:
        raise _not_found("vqa", str(path), f"cannot read the state dict: {exc}") from exc
    absent = [k for k in IMG_EMB_KEYS if k not in state]
    if absent:
        raise _not_found("vqa", str(path), f"not a Visual-T5 checkpoint: weights {absent} are missing")
    tokenizer = _from_base(_t5_tokenizer, "tokenizer", path)
    d_model = int(state["encoder.img_emb.weight"].shape[0])
    if dtype in HALF:
        import dataclasses

        settings = read_settings(_from_base(config_file, "config", path))
        settings = dataclasses.replace(settings, d_model=d_model)
        return _build(settings, state, "vqa", str(path), True, device, dtype), tokenizer
    from qace.models.visual_t5 import VisualT5ForConditionalGeneration

    config = _from_base(
        lambda name, local: AutoConfig.from_pretrained(name, local_files_only=local), "config", path
    )
    config.d_model = d_model

    model = VisualT5ForConditionalGeneration(config)
    result = model.load_state_dict(state, strict=False)
    _warn_unexpected("vqa", str(path), result.unexpected_keys)
    tied = {"encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "lm_head.weight"}
    missing = sorted(set(result.missing_keys) - tied)
    if missing:
        raise _not_found("vqa", str(path), f"state dict lacks weights {missing[:5]}")
    model.tie_weights()
    return model.to(dtype), tokenizer


def _weight_files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted({f for pattern in WEIGHT_FILE_PATTERNS for f in path.glob(pattern)})


def checkpoint_fingerprint(model_dir_or_id: str | Path) -> str:
    """Hub id for hub models; ``sha256-<12 hex>`` of the weight and tokenizer files for local checkpoints.

    Feeds the score signature: two local directories with the same name but other weights or another
    tokenizer must not produce comparable-looking scores.
    """
    path = Path(model_dir_or_id).expanduser()
    if not path.exists():
        return str(model_dir_or_id)
    weights = _weight_files(path)
    if not weights:
        raise ModelNotFoundError(
            f"{path}: no weight files ({', '.join(WEIGHT_FILE_PATTERNS)}) to fingerprint"
        )
    tokenizer = [path / name for name in TOKENIZER_FILES if path.is_dir() and (path / name).is_file()]
    files = weights + tokenizer
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.name.encode() + b"\0")
        with file.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return f"sha256-{digest.hexdigest()[:12]}"
