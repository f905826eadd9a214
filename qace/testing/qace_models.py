"""Tiny, deterministic, *trained* QG / TQA / Visual-T5 models for tests and offline smoke runs.

Random weights would decode the same token 31 times and never stop, hiding every bug in EOS
handling, padding and bookkeeping. These models are trained for a few seconds on a synthetic
caption world, so their outputs vary across inputs, vary in length, end with EOS early and sometimes
say ``unanswerable``. Their scores mean nothing: every directory carries a marker file and a config
flag so the CLI can warn loudly.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import random
import re
import shutil
import string
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import T5Config, T5ForConditionalGeneration, T5TokenizerFast

from qace.errors import ConfigError
from qace.models.sources import TEST_MODEL_MARKER
from qace.models.visual_inputs import NUM_REGIONS, REGION_DIM, visual_question_inputs
from qace.models.visual_t5 import VisualT5ForConditionalGeneration

logger = logging.getLogger(__name__)

COMPLETE_MARKER = ".qace-test-models-complete"
"""Written last into the output directory, so a half-built directory is never reused."""
ROLES = ("qg", "tqa", "vqa")
BUILD_VERSION = 3
"""Bump when the recipe changes, so cached builds are rebuilt."""
UNANSWERABLE = "unanswerable"

_ADJ = ["young", "old", "little", "tall", "happy", "small"]
_SUBJ = ["girl", "boy", "man", "woman", "dog", "child", "player", "lady"]
_COLOUR = ["red", "blue", "green", "yellow", "white", "black", "brown", "pink"]
_WEAR = ["dress", "shirt", "hat", "jacket", "coat", "helmet"]
_VERB = [("runs", "run"), ("walks", "walk"), ("sits", "sit"), ("plays", "play"), ("jumps", "jump")]
_PLACE = ["beach", "park", "street", "field", "kitchen", "snow", "grass", "road"]
_OBJ = ["ball", "kite", "frisbee", "umbrella", "bike", "bag"]
_EXTRA_WORDS = (
    "two three people group table plate pizza food water ocean surfboard skateboard horse car bus "
    "train truck tree building city sky wave sand mountain room bed chair window wall sign sitting "
    "standing riding holding walking running playing wearing looking eating next near front top "
    "image visual answer question context what who where which how many color colour is are does "
    "Flickr COCO photo picture"
)
_SLOT_WORDS: dict[str, list[str]] = {"subj": _SUBJ, "wear": _COLOUR, "place": _PLACE, "obj": _OBJ}
_CODE_WIDTH = 16
"""Feature dims per word in the synthetic region code (word k lights dims k*16..k*16+15)."""


@dataclass(frozen=True)
class _Scene:
    """One synthetic image/caption: the slots a question can ask about."""

    adj: str
    subj: str
    colour: str
    wear: str
    verb: tuple[str, str]
    place: str
    obj: str | None
    obj_colour: str

    def caption(self) -> str:
        text = f"a {self.adj} {self.subj} in a {self.colour} {self.wear} {self.verb[0]} on the {self.place}"
        return text if self.obj is None else f"{text} with a {self.obj_colour} {self.obj}"

    def qa_pairs(self) -> list[tuple[str, str, str]]:
        """(slot, answer candidate, question) triples, answers as spaCy-like stopword-free chunks."""
        pairs = [
            ("subj", f"{self.adj} {self.subj}", f"who {self.verb[0]} on the {self.place} ?"),
            ("wear", f"{self.colour} {self.wear}", f"what is the {self.subj} wearing ?"),
            ("wear", self.colour, f"what color is the {self.subj}'s {self.wear} ?"),
            ("place", self.place, f"where does the {self.subj} {self.verb[1]} ?"),
        ]
        if self.obj is not None:
            pairs.append(("obj", f"{self.obj_colour} {self.obj}", f"what does the {self.subj} have ?"))
        return pairs

    def slot_value(self, slot: str) -> str | None:
        return {"subj": self.subj, "wear": self.colour, "place": self.place, "obj": self.obj}[slot]


def _random_scene(rng: random.Random) -> _Scene:
    return _Scene(
        adj=rng.choice(_ADJ),
        subj=rng.choice(_SUBJ),
        colour=rng.choice(_COLOUR),
        wear=rng.choice(_WEAR),
        verb=rng.choice(_VERB),
        place=rng.choice(_PLACE),
        obj=rng.choice(_OBJ) if rng.random() < 0.6 else None,
        obj_colour=rng.choice(_COLOUR),
    )


def world_captions(n: int, seed: int = 0) -> list[str]:
    """``n`` captions of the synthetic world the test models were trained on (for pipelines that need
    the test QG/TQA models to find consistent answers, e.g. ``qace vqa-data``)."""
    rng = random.Random(seed)
    return [_random_scene(rng).caption() for _ in range(n)]


def _free_caption(rng: random.Random) -> tuple[str, str, str]:
    """An off-template caption (caption, answer, question), so odd inputs still end in EOS quickly."""
    pool = _EXTRA_WORDS.split() + _SUBJ + _OBJ + _PLACE + _COLOUR
    words = [rng.choice(pool) for _ in range(rng.randint(3, 14))]
    start = rng.randrange(len(words))
    answer = " ".join(words[start : start + rng.randint(1, 2)])
    return " ".join(words), answer, f"what is {rng.choice(['the', 'near the'])} {words[0]} ?"


def _qa_sample(rng: random.Random) -> tuple[str, str, str]:
    """(caption, answer candidate, question) from the template world, or off-template 1 time in 4."""
    if rng.random() < 0.25:
        return _free_caption(rng)
    scene = _random_scene(rng)
    _, answer, question = rng.choice(scene.qa_pairs())
    return scene.caption(), answer, question


def _qg_examples(rng: random.Random, n: int) -> list[tuple[str, str]]:
    """Prompt exactly as the release builds it (spec section 2) -> ``question: ...``."""
    out = []
    for _ in range(n):
        caption, answer, question = _qa_sample(rng)
        out.append((f"answer: {answer}  context: {caption} </s>", f"question: {question}"))
    return out


def _tqa_examples(rng: random.Random, n: int) -> list[tuple[str, str]]:
    """Answer if all the answer's words occur in the context, else ``unanswerable`` (spec section 3)."""
    out = []
    for _ in range(n):
        caption, answer, question = _qa_sample(rng)
        ctx = caption if rng.random() < 0.5 else _qa_sample(rng)[0]
        target = answer if set(answer.split()) <= set(ctx.split()) else UNANSWERABLE
        out.append((f"question: {question}  context: {ctx} </s>", target))
    return out


def _stopwords() -> list[str]:
    """The package's stopword list, so common function words are single pieces too."""
    path = Path(__file__).resolve().parent.parent / "metric" / "data" / "stopwords_en.txt"
    return path.read_text().split() if path.exists() else []


def _word_code() -> dict[str, int]:
    words = sorted({w for ws in _SLOT_WORDS.values() for w in ws})
    return {w: i for i, w in enumerate(words)}


def _scene_features(scene: _Scene, rng: random.Random, code: dict[str, int]) -> np.ndarray:
    """36x2054 non-negative features, scale like BUTD ones; slot words light fixed dim blocks."""
    feats = np.abs(np.asarray([rng.gauss(0.0, 0.3) for _ in range(NUM_REGIONS * 8)], dtype=np.float32))
    out = np.zeros((NUM_REGIONS, REGION_DIM), dtype=np.float32)
    out[:, :8] = feats.reshape(NUM_REGIONS, 8)
    regions = rng.sample(range(NUM_REGIONS), 4)
    for region, slot in zip(regions, ("subj", "wear", "place", "obj"), strict=True):
        word = scene.slot_value(slot)
        if word is not None:
            start = 8 + code[word] * _CODE_WIDTH
            out[region, start : start + _CODE_WIDTH] = 3.0
            out[region, 2048:] = [rng.random() for _ in range(6)]
    return out


def _vqa_examples(rng: random.Random, n: int) -> list[tuple[str, np.ndarray, str]]:
    """(question, features, answer): the answer is the scene's slot word, ``unanswerable`` if absent."""
    code = _word_code()
    out = []
    for _ in range(n):
        scene = _random_scene(rng)
        slot, _, question = rng.choice(
            _random_scene(rng).qa_pairs() + [("obj", "", "what is on the table ?")]
        )
        answer = scene.slot_value(slot) or UNANSWERABLE
        out.append((question, _scene_features(scene, rng, code), answer))
    return out


def build_tokenizer(corpus: Sequence[str]) -> T5TokenizerFast:
    """A T5-style Unigram tokenizer: <pad>=0, </s>=1, <unk>=2, ``unanswerable`` one piece.

    Built, not trained: the ``tokenizers`` Unigram trainer is not deterministic (its scores and tie order
    change from run to run, even on one thread), and test models must be identical wherever they are
    built. Every corpus word is a whole piece and punctuation is split off, as T5 does for common English;
    anything else falls back to single characters, so unseen words still tokenise.
    """
    words = {w for line in corpus for w in re.findall(r"\w+", line)} | {UNANSWERABLE, "image"}
    chars = sorted(
        set(string.ascii_letters + string.digits) | {c for line in corpus for c in re.findall(r"\w", line)}
    )
    vocab: list[tuple[str, float]] = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -3.0)]
    vocab += [(f"▁{w}", -2.0) for w in sorted(words)]
    vocab += [(p, -2.0) for p in string.punctuation] + [(f"▁{p}", -2.0) for p in string.punctuation]
    vocab += [(c, -10.0) for c in chars]
    tokenizer = T5TokenizerFast(vocab=vocab, extra_ids=0)
    unanswerable_ids = tokenizer(UNANSWERABLE, add_special_tokens=False)["input_ids"]
    if len(unanswerable_ids) != 1:
        raise ConfigError(f"test tokenizer splits {UNANSWERABLE!r} into {unanswerable_ids}")
    return tokenizer


def _tiny_config(vocab_size: int, **extra: object) -> T5Config:
    return T5Config(
        vocab_size=vocab_size,
        d_model=64,
        d_kv=16,
        d_ff=128,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=4,
        dropout_rate=0.0,
        feed_forward_proj="relu",
        decoder_start_token_id=0,
        eos_token_id=1,
        pad_token_id=0,
        qace_test_model=True,
        **extra,
    )


@contextlib.contextmanager
def _deterministic(seed: int) -> Iterator[None]:
    """One thread and a fixed seed, so two builds on any machine give identical weights."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            yield
    finally:
        torch.set_num_threads(threads)


def _pad(rows: list[list[int]], value: int) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([r + [value] * (width - len(r)) for r in rows], dtype=torch.long)


def _train_text(
    model: T5ForConditionalGeneration,
    tokenizer: T5TokenizerFast,
    examples: list[tuple[str, str]],
    steps: int,
    batch: int,
) -> float:
    src = tokenizer([s for s, _ in examples])["input_ids"]
    tgt = tokenizer([t for _, t in examples])["input_ids"]

    def step(lo: int, hi: int) -> torch.Tensor:
        ids = _pad(src[lo:hi], 0)
        labels = _pad(tgt[lo:hi], -100)
        return model(input_ids=ids, attention_mask=(ids != 0).long(), labels=labels).loss

    return _optimise(model, step, len(examples), steps, batch)


def _train_visual(
    model: VisualT5ForConditionalGeneration,
    tokenizer: T5TokenizerFast,
    examples: list[tuple[str, np.ndarray, str]],
    steps: int,
    batch: int,
) -> float:
    ids, mask, _ = visual_question_inputs(tokenizer, [q for q, _, _ in examples])
    feats = torch.from_numpy(np.stack([f for _, f, _ in examples]))
    tgt = tokenizer([a for _, _, a in examples])["input_ids"]

    def step(lo: int, hi: int) -> torch.Tensor:
        enc, full_mask = model.encode_visual(ids[lo:hi], mask[lo:hi], feats[lo:hi])
        return model(encoder_outputs=enc, attention_mask=full_mask, labels=_pad(tgt[lo:hi], -100)).loss

    return _optimise(model, step, len(examples), steps, batch)


def _optimise(
    model: torch.nn.Module, step: Callable[[int, int], torch.Tensor], n: int, steps: int, batch: int
) -> float:
    """Plain AdamW over the examples in their fixed order, wrapping around."""
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    loss_value = float("nan")
    for i in range(steps):
        lo = (i * batch) % (n - batch + 1)
        loss = step(lo, lo + batch)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss_value = float(loss.detach())
    model.eval()
    return loss_value


def _save(
    model: T5ForConditionalGeneration, tokenizer: T5TokenizerFast, path: Path, role: str, seed: int
) -> None:
    model.generation_config.max_length = 32
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    (path / TEST_MODEL_MARKER).write_text(
        f"qace test model ({role}, seed {seed}): tiny and trained on synthetic captions.\n"
        "Scores computed with it are meaningless; use it only for tests and smoke runs.\n"
    )


def make_test_models(out_dir: str | Path, *, seed: int = 0, force: bool = False) -> Path:
    """Build ``out_dir/{qg,tqa,vqa}`` (Hugging Face layout) unless a complete build is already there.

    Deterministic: the same seed gives byte-identical weights. Takes well under a minute on 2 CPU cores.
    """
    return build_once(
        out_dir, ROLES, _build_all, seed=seed, version=BUILD_VERSION, force=force, what="qace TEST models"
    )


def build_once(
    out_dir: str | Path,
    roles: Sequence[str],
    build: Callable[[Path, int], None],
    *,
    seed: int,
    version: int,
    force: bool,
    what: str,
) -> Path:
    """Run ``build(tmp, seed)`` to make ``out_dir/<role>`` for every role, unless a complete build is there.

    Every test-model builder (QACE's, the judges') goes through here, so all of them are safe to share
    one cache: a build of the same seed and recipe ``version`` is reused; concurrent builders wait on a
    lock; the build happens in a temporary directory and each role is moved into place, with the
    completion marker written last, so an interrupted build is simply redone; and a role directory
    that is not a qace test model (no ``TEST_MODEL_MARKER``) is never replaced.
    """
    out = Path(out_dir).expanduser().resolve()
    if not force and _is_complete(out, seed, version):
        logger.info("reusing %s in %s", what, out)
        return out
    for role in roles:
        existing = out / role
        if existing.exists() and not (existing / TEST_MODEL_MARKER).exists() and not force:
            raise ConfigError(
                f"{existing} exists and is not a qace test model; choose another directory or pass force=True"
            )
    out.mkdir(parents=True, exist_ok=True)
    with _build_lock(out):
        if not force and _is_complete(out, seed, version):  # another process finished while we waited
            return out
        start = time.perf_counter()
        (out / COMPLETE_MARKER).unlink(missing_ok=True)
        with tempfile.TemporaryDirectory(dir=out, prefix=".build-") as tmp_name:
            tmp = Path(tmp_name)
            with _deterministic(seed):
                build(tmp, seed)
            for role in roles:
                if not (tmp / role / TEST_MODEL_MARKER).is_file():
                    raise RuntimeError(f"test-model build wrote no {TEST_MODEL_MARKER} into {role}/")
                shutil.rmtree(out / role, ignore_errors=True)
                (tmp / role).rename(out / role)
        info = {"seed": seed, "build_version": version, "seconds": round(time.perf_counter() - start, 1)}
        (out / COMPLETE_MARKER).write_text(json.dumps(info) + "\n")
    logger.warning("built %s in %s (%.1f s); their scores mean nothing", what, out, info["seconds"])
    return out


def _is_complete(out: Path, seed: int, version: int) -> bool:
    try:
        info = json.loads((out / COMPLETE_MARKER).read_text())
    except (OSError, ValueError):
        return False
    return bool(info.get("seed") == seed and info.get("build_version") == version)


@contextlib.contextmanager
def _build_lock(out: Path) -> Iterator[None]:
    """Serialise concurrent builds into one directory (parallel test sessions share the cache)."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no locking, the temp-dir-then-rename build is still atomic per role
        yield
        return
    with (out / ".build.lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _build_all(tmp: Path, seed: int) -> None:
    rng = random.Random(seed)
    qg = _qg_examples(rng, 1200)
    tqa = _tqa_examples(rng, 1200)
    vqa = _vqa_examples(rng, 1000)
    corpus = [s for pair in qg + tqa for s in pair] + [f"visual answer: {q} image : {a}" for q, _, a in vqa]
    corpus += [_EXTRA_WORDS] * 20 + [" ".join(_stopwords())] * 5
    tokenizer = build_tokenizer(corpus)
    vocab_size = len(tokenizer)

    for role, examples, steps in (("qg", qg, 300), ("tqa", tqa, 300)):
        t0 = time.perf_counter()
        model = T5ForConditionalGeneration(_tiny_config(vocab_size))
        loss = _train_text(model, tokenizer, examples, steps=steps, batch=32)
        logger.info("test %s model: final loss %.3f (%.1f s)", role, loss, time.perf_counter() - t0)
        _save(model, tokenizer, tmp / role, role, seed)

    prefix = tokenizer("image :", add_special_tokens=False)["input_ids"]
    vqa_model = VisualT5ForConditionalGeneration(_tiny_config(vocab_size, image_prefix_ids=prefix))
    t0 = time.perf_counter()
    loss = _train_visual(vqa_model, tokenizer, vqa, steps=150, batch=32)
    logger.info("test vqa model: final loss %.3f (%.1f s)", loss, time.perf_counter() - t0)
    _save(vqa_model, tokenizer, tmp / "vqa", "vqa", seed)


def main(argv: Sequence[str] | None = None) -> int:
    """``qace make-test-models DIR``: build (or reuse) the tiny test models."""
    parser = argparse.ArgumentParser(prog="qace make-test-models", description=main.__doc__)
    parser.add_argument("out_dir", help="directory to write qg/, tqa/ and vqa/ into")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true", help="rebuild even if a complete build exists")
    args = parser.parse_args(argv)
    make_test_models(args.out_dir, seed=args.seed, force=args.force)
    return 0
