"""Reference metrics to compare QACE against: pycocoevalcap's BLEU/ROUGE-L/METEOR/CIDEr, BERTScore.

Scores are per candidate, computed the way the published tables computed them (PTB tokenizer,
CIDEr document frequencies over the evaluated candidates' reference sets), so correlations
reproduce the papers. Everything is cached on disk keyed by the metric, the library version and
a hash of the inputs, because METEOR (a Java process) takes minutes on a few thousand captions.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import logging
import os
import subprocess
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from qace.errors import BackendUnavailableError, ConfigError, InputError
from qace.progress import track

logger = logging.getLogger(__name__)

#: Metrics pycocoevalcap computes here, in report order.
COCO_METRICS = ("bleu1", "bleu2", "bleu3", "bleu4", "rouge_l", "meteor", "cider")
#: Every baseline name accepted by :func:`compute_baselines` (SPICE is recognised but skipped).
BASELINES = (*COCO_METRICS, "bertscore", "spice")
#: Display names for tables.
DISPLAY = {
    "bleu1": "BLEU-1",
    "bleu2": "BLEU-2",
    "bleu3": "BLEU-3",
    "bleu4": "BLEU-4",
    "rouge_l": "ROUGE-L",
    "meteor": "METEOR",
    "cider": "CIDEr",
    "bertscore": "BERTScore",
    "spice": "SPICE",
    "qace-ref": "QACE-Ref",
    "qace-img": "QACE-Img",
    "clip-s": "CLIP-S",
    "refclip-s": "RefCLIP-S",
    "pac-s": "PAC-S",
    "refpac-s": "RefPAC-S",
}
SPICE_SKIP_MESSAGE = (
    "SPICE skipped: it needs Stanford CoreNLP models that pycocoevalcap downloads on first use, "
    "and this machine is offline. Run pycocoevalcap's get_stanford_models once with network access "
    "and compute SPICE yourself, then pass the scores with --scores."
)


#: Environment variable that overrides the default metric-score cache folder.
CACHE_ENV = "QACE_META_CACHE"


def default_cache_dir() -> Path:
    """``$QACE_META_CACHE`` if set, else ``<repo root>/.qace-cache/meta`` (ignored by git)."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / ".qace-cache" / "meta"


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "none"


def _cache_key(metric: str, candidates: Sequence[str], references: Sequence[Sequence[str]]) -> str:
    h = hashlib.sha256()
    h.update(
        json.dumps(
            [metric, _version("pycocoevalcap"), list(candidates), [list(r) for r in references]]
        ).encode()
    )
    return f"{metric}-{h.hexdigest()[:20]}"


def _tokenize(candidates: Sequence[str], references: Sequence[Sequence[str]]) -> tuple[dict, dict]:
    """PTB-tokenize candidates and references in one Java call; returns (gts, res) dicts."""
    try:
        from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer
    except ImportError as exc:
        raise BackendUnavailableError("pycocoevalcap is not installed: pip install 'qace[meta]'") from exc
    batch: dict[str, list[dict[str, str]]] = {}
    for i, (cand, refs) in enumerate(zip(candidates, references, strict=True)):
        batch[f"c{i}"] = [{"caption": cand or "."}]
        batch[f"r{i}"] = [{"caption": r} for r in refs]
    try:
        tok = PTBTokenizer().tokenize(batch)
    except OSError as exc:
        raise BackendUnavailableError(f"the PTB tokenizer needs Java on PATH: {exc}") from exc
    n = len(candidates)
    gts = {i: tok[f"r{i}"] for i in range(n)}
    res = {i: tok[f"c{i}"] for i in range(n)}
    return gts, res


def _coco_scores(metric_names: Sequence[str], gts: dict, res: dict) -> dict[str, np.ndarray]:
    """pycocoevalcap's scores of ``metric_names`` per candidate. METEOR runs in its Java process while
    this thread computes the Python metrics (its thread mostly waits for the jar's lines), so a call
    takes about the longer of the two rather than their sum."""
    out: dict[str, np.ndarray] = {}
    meteor: Future[np.ndarray] | None = None
    with ThreadPoolExecutor(1, thread_name_prefix="qace-meteor") as pool:
        if "meteor" in metric_names:
            meteor = pool.submit(_meteor, gts, res)
        out.update(_python_scores(metric_names, gts, res))
        if meteor is not None:
            out["meteor"] = meteor.result()
    return {m: out[m] for m in metric_names}


def _python_scores(metric_names: Sequence[str], gts: dict, res: dict) -> dict[str, np.ndarray]:
    """pycocoevalcap's BLEU, ROUGE-L and CIDEr of ``metric_names``, per candidate."""
    out: dict[str, np.ndarray] = {}
    bleus = [m for m in metric_names if m.startswith("bleu")]
    if bleus:
        from pycocoevalcap.bleu.bleu import Bleu

        _, per_n = Bleu(4).compute_score(gts, res, verbose=0)
        for m in bleus:
            out[m] = np.asarray(per_n[int(m[-1]) - 1], dtype=float)
    if "rouge_l" in metric_names:
        from pycocoevalcap.rouge.rouge import Rouge

        out["rouge_l"] = np.asarray(Rouge().compute_score(gts, res)[1], dtype=float)
    if "cider" in metric_names:
        from pycocoevalcap.cider.cider import Cider

        out["cider"] = np.asarray(Cider().compute_score(gts, res)[1], dtype=float)
    return out


def _meteor(gts: dict, res: dict) -> np.ndarray:
    """METEOR 1.5 per candidate, driving pycocoevalcap's jar the way its wrapper does.

    The wrapper's own class closes its pipes in ``__del__`` (noisy at interpreter exit), so
    the same protocol is spoken here: one ``SCORE`` line per candidate, then one ``EVAL``.
    Both are stateless in the jar, so one process (:func:`_meteor_process`) serves every call
    of this process: its start (a JVM loading METEOR's paraphrase tables) costs ~10 s. A thread
    writes the ``SCORE`` lines while this one reads the answers, in order, so the jar never
    waits for a round trip per line (the wrapper's way) and neither side fills a pipe the other
    does not drain. A jar that ends mid-call raises `BackendUnavailableError`; the next call
    starts another.
    """
    logger.info("METEOR on %d candidates (Java; this takes a while)", len(res))
    lines = [
        ("SCORE ||| " + " ||| ".join(gts[key]) + " ||| " + res[key][0].replace("|||", "").replace("  ", " "))
        for key in res
    ]
    with _METEOR_LOCK:
        proc = _meteor_process()
        stdin, stdout = proc.stdin, proc.stdout
        if stdin is None or stdout is None:  # pragma: no cover - Popen with PIPE always sets them
            raise BackendUnavailableError("could not open pipes to the METEOR jar")

        def write() -> None:
            with contextlib.suppress(OSError):  # the jar ended: the reader sees its output end
                for line in lines:
                    stdin.write((line + "\n").encode())
                stdin.flush()

        writer = threading.Thread(target=write, name="meteor-writer", daemon=True)
        writer.start()
        try:
            stats = [_meteor_line(stdout) for _ in lines]
            writer.join()
            stdin.write(("EVAL ||| " + " ||| ".join(stats) + "\n").encode())
            stdin.flush()
            scores = [float(_meteor_line(stdout)) for _ in stats]
            _meteor_line(stdout)  # the corpus-level score
        except BaseException:
            # Lines may be left unread in its pipe, which the next call would take for its own;
            # killing the jar also ends a writer still blocked on its input.
            _close_meteor()
            writer.join()
            raise
    return np.asarray(scores, dtype=float)


def _meteor_line(stdout: Any) -> str:
    """The METEOR jar's next output line, stripped; its end raises `BackendUnavailableError`."""
    line = stdout.readline()
    if not line:
        raise BackendUnavailableError("the METEOR process (Java) ended in the middle of a call")
    return line.decode().strip()


#: The METEOR process :func:`_meteor` talks to (started on first use, with the pid that started it),
#: and the lock that keeps one call's lines together.
_METEOR: tuple[subprocess.Popen[bytes], int] | None = None
_METEOR_LOCK = threading.RLock()
_METEOR_ATEXIT = False


def _start_meteor() -> subprocess.Popen[bytes]:
    """A fresh ``meteor-1.5.jar -stdio`` process, as pycocoevalcap's wrapper starts it."""
    import pycocoevalcap.meteor.meteor as meteor_mod

    jar_dir = Path(meteor_mod.__file__).parent
    cmd = ["java", "-jar", "-Xmx2G", "meteor-1.5.jar", "-", "-", "-stdio", "-l", "en", "-norm"]
    logger.info("starting METEOR (Java)")
    return subprocess.Popen(
        cmd, cwd=jar_dir, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )


def _meteor_process() -> subprocess.Popen[bytes]:
    """This process's METEOR, started on first use and again if it has exited (closed at exit)."""
    global _METEOR, _METEOR_ATEXIT
    with _METEOR_LOCK:
        if _METEOR is not None:
            proc, pid = _METEOR
            if pid != os.getpid():  # a forked child: the pipes are the parent's, leave them be
                _METEOR = None
            elif proc.poll() is not None:
                _close_meteor()
        if _METEOR is None:
            _METEOR = (_start_meteor(), os.getpid())
            if not _METEOR_ATEXIT:
                atexit.register(_close_meteor)
                _METEOR_ATEXIT = True
        return _METEOR[0]


def _close_meteor() -> None:
    """Stop this process's METEOR, if it started one; the next call starts another."""
    global _METEOR
    with _METEOR_LOCK:
        if _METEOR is None:
            return
        proc, pid = _METEOR
        _METEOR = None
        if pid != os.getpid():
            return
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        proc.kill()
        proc.wait()


def bertscore_max_f1(candidates: Sequence[str], references: Sequence[Sequence[str]]) -> np.ndarray:
    """BERTScore F1 of each candidate against its best reference, with the offline encoder.

    Uses ``qace.kernels.bertscore.BertScoreMatcher`` (imported lazily: it pulls in torch).
    """
    try:
        from qace.kernels.bertscore import BertScoreMatcher
    except ImportError as exc:
        raise BackendUnavailableError(f"BERTScore needs qace.kernels.bertscore: {exc}") from exc
    flat_c, flat_r, owner = [], [], []
    for i, (cand, refs) in enumerate(zip(candidates, references, strict=True)):
        for r in refs:
            flat_c.append(cand)
            flat_r.append(r)
            owner.append(i)
    f1 = np.asarray(BertScoreMatcher().score(flat_c, flat_r), dtype=float)
    out = np.full(len(candidates), -np.inf)
    np.maximum.at(out, np.asarray(owner, dtype=np.int64), f1)
    return out


def compute_baselines(
    candidates: Sequence[str],
    references: Sequence[Sequence[str]],
    metrics: Sequence[str] = COCO_METRICS,
    cache_dir: Path | str | None = None,
    use_cache: bool = True,
) -> dict[str, np.ndarray]:
    """Per-candidate scores of each named baseline, read from or written to the disk cache.

    ``references[i]`` are candidate ``i``'s references. The CIDEr document frequencies come
    from exactly these reference sets, so pass the whole evaluated set in one call. Metrics
    that cannot run here (SPICE offline) are skipped with a warning, not an error, so a
    report still comes out. ``cache_dir`` defaults to :func:`default_cache_dir`.
    """
    unknown = [m for m in metrics if m not in BASELINES]
    if unknown:
        raise ConfigError(f"unknown baseline metric(s) {unknown}; choose from {list(BASELINES)}")
    if len(candidates) != len(references):
        raise InputError(f"{len(candidates)} candidates but {len(references)} reference lists")
    for i, refs in enumerate(references):
        if not any(r.strip() for r in refs):
            raise InputError(
                f"candidate {i} ({candidates[i][:40]!r}) has no references; reference-based "
                "baselines need at least one per candidate"
            )
    cache = (Path(cache_dir) if cache_dir is not None else default_cache_dir()) if use_cache else None
    out: dict[str, np.ndarray] = {}
    todo = []
    for m in metrics:
        if m == "spice":
            logger.warning(SPICE_SKIP_MESSAGE)
            continue
        path = cache / f"{_cache_key(m, candidates, references)}.npy" if cache else None
        if path is not None and path.exists():
            out[m] = np.load(path)
        else:
            todo.append(m)
    coco = [m for m in todo if m in COCO_METRICS]
    with track("baselines", total=len(todo), unit="metric") as bar:
        if coco:
            gts, res = _tokenize(candidates, references)
            out.update(_coco_scores(coco, gts, res))
            bar.update(len(coco))
        if "bertscore" in todo:
            out["bertscore"] = bertscore_max_f1(candidates, references)
            bar.update(1)
    if cache is not None:
        cache.mkdir(parents=True, exist_ok=True)
        for m in todo:
            np.save(cache / f"{_cache_key(m, candidates, references)}.npy", out[m])
    return {m: out[m] for m in metrics if m in out}
