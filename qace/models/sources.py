"""Where the QACE models come from, answered without loading one (nothing heavy is imported here).

The paper's QG and TQA are Hugging Face hub ids; its Visual-T5 is the authors' checkpoint, which is not on
the hub (`DEFAULT_VQA`). These functions say which source each role takes, whether a hub model is in the
local cache, and whether the hub can be asked at all, so that a command can list everything it lacks
before it loads a model or waits on the network (`qace models check`).
"""

from __future__ import annotations

import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

TEST_MODEL_MARKER = "QACE_TEST_MODEL"
"""File in every test-model directory (`qace.testing`); its presence means "scores from this model mean
nothing"."""
DEFAULT_QG = "mrm8488/t5-base-finetuned-question-generation-ap"
"""Question generation model of the release (spec section 2)."""
DEFAULT_TQA = "valhalla/t5-base-qa-qg-hl"
"""Text QA model of the release (spec section 3)."""
DEFAULT_VQA = "~/.cache/qace/visual-t5"
"""Where the Visual-T5 checkpoint is looked for (env ``QACE_VQA`` overrides): no hub id exists for
the release, so this is a directory in our layout or the release's raw state-dict file (spec section 4)."""
VQA_CHECKPOINT_URL = "https://vqamodel.s3.us-east-2.amazonaws.com/t5vqa/ckpt.zip"
"""The authors' Visual-T5 checkpoint, as their release (github.com/hwanheelee1993/QACE) links it."""
VQA_BASE = "t5-small"
"""Config and tokenizer used with a raw Visual-T5 state dict (the release trained from t5-small)."""
TOKENIZER_FILES = ("tokenizer.json", "spiece.model", "tokenizer_config.json", "special_tokens_map.json")
"""Tokenizer files that change token ids, and so scores, as much as the weights do."""
RAW_STATE_DICT_SUFFIXES = (".bin", ".pt", ".pth", ".safetensors")
"""A Visual-T5 file with one of these suffixes is a raw state dict (t5-small's config and tokenizer)."""
HUB_WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json",
                    "pytorch_model.bin.index.json")  # fmt: skip
"""A hub model is cached when its ``config.json`` and one of these are."""
HUB_TOKENIZER_FILES = ("tokenizer.json", "spiece.model")
"""A hub tokenizer is cached when one of these is."""


def is_test_model(path: str | Path) -> bool:
    """True for directories written by ``make_test_models``: the CLI must warn that scores mean nothing."""
    return (Path(path).expanduser() / TEST_MODEL_MARKER).is_file()


def default_sources() -> dict[str, str]:
    """The models used when no directory is given (QACE_VQA overrides the Visual-T5 location)."""
    return {"qg": DEFAULT_QG, "tqa": DEFAULT_TQA, "vqa": os.environ.get("QACE_VQA", DEFAULT_VQA)}


def model_sources(
    models_dir: str | Path | None,
    explicit: Mapping[str, str | Path | None],
    roles: Sequence[str],
) -> dict[str, str]:
    """The source of each of ``roles``: its ``explicit`` one (``--qg``/``--tqa``/``--vqa``), else
    ``models_dir/<role>``, else the paper's (`default_sources`). Nothing is checked here."""
    defaults = default_sources()
    base = Path(models_dir).expanduser() if models_dir is not None else None
    return {role: str(explicit.get(role) or (base / role if base else defaults[role])) for role in roles}


def hub_offline() -> bool:
    """Whether ``HF_HUB_OFFLINE`` forbids asking the Hugging Face hub."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


def looks_like_hub_id(name: str) -> bool:
    """``owner/name`` or ``name``, not a filesystem path (``./x``, ``/x``, ``~/x``, ``x/y/z``, or
    ``DIR/x`` where ``DIR`` is a local folder: a path's name is never taken for a hub id, since whoever
    owns the hub user ``DIR`` would then supply the model)."""
    if name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name:
        return False
    owner = name.partition("/")[0] if "/" in name else ""
    return not (owner and Path(owner).exists())


def hub_cached(hub_id: str, *, tokenizer_only: bool = False) -> bool:
    """Whether the Hugging Face cache holds ``hub_id``'s config and weights (with ``tokenizer_only``: its
    config and tokenizer), so that it loads with the network off. Reads the cache only."""
    from huggingface_hub import try_to_load_from_cache

    def has(names: Sequence[str]) -> bool:
        return any(isinstance(try_to_load_from_cache(hub_id, name), str) for name in names)

    return has(("config.json",)) and has(HUB_TOKENIZER_FILES if tokenizer_only else HUB_WEIGHT_FILES)


def hub_endpoint() -> str:
    """The Hugging Face hub's address (``HF_ENDPOINT`` where set)."""
    from huggingface_hub import constants

    return str(constants.ENDPOINT)


PROBE_TIMEOUT_S = 1.5
"""How long `reachable` waits for any answer."""


def reachable(urls: Sequence[str], timeout_s: float = PROBE_TIMEOUT_S) -> dict[str, bool]:
    """Whether each of ``urls`` answers a ``HEAD`` request (any HTTP status counts) within ``timeout_s``,
    all asked at once, each once. Each request runs in its own daemon thread that the caller waits on
    only until the deadline, so a name lookup that hangs cannot hold it (``urlopen``'s timeout does not
    cover the lookup). Proxies set in the environment are used, as the downloads themselves use them."""
    answers: dict[str, bool] = {}

    def probe(url: str) -> None:
        try:
            urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout_s).close()
            answers[url] = True
        except urllib.error.HTTPError:  # an answer, whatever its status
            answers[url] = True
        except (OSError, ValueError):
            answers[url] = False

    threads = [threading.Thread(target=probe, args=(url,), daemon=True) for url in dict.fromkeys(urls)]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout_s
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return {url: answers.get(url, False) for url in urls}
