"""``qace vqa-train``: Visual-T5 trained on `qace.vqa.data` triples, with Hugging Face's Seq2SeqTrainer.

The model is T5 plus one ``nn.Linear(2054, d_model)`` (`qace.models.visual_t5`), fed the spec's input
layout: ``"visual answer: " + question`` in 64 right-padded slots without EOS, the ``"image :"`` prefix,
36 regions; targets are the answers with EOS, at most 32 tokens (spec section 4). That is the layout the
engine answers with, so the output directory is what ``qace score --variant img --vqa DIR`` loads, and the
score signature names it by the content hash of its weights and tokenizer.

Defaults are the paper's: 5 epochs, batch 128, from ``t5-small`` (or an ``--init`` directory: a
Visual-T5 continues, a plain T5 gets a new projection). bf16 autocast on a GPU. Checkpoints go to
``DIR/checkpoints`` every ``save_steps`` steps, and ``--resume`` continues from the last one. Region
features are read in place from any store ``qace score`` reads (`qace.features.stores`), by worker
processes that each open the store themselves. Progress lines carry an ETA (`qace.progress`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from qace.errors import ConfigError, FeatureError, ModelNotFoundError, ResumeError
from qace.models.visual_inputs import IMAGE_PREFIX_TEXT, visual_question_inputs
from qace.models.visual_t5 import VisualT5ForConditionalGeneration

logger = logging.getLogger(__name__)

MAX_ANSWER_TOKENS = 32
"""Target length cap, EOS included (the engine generates at most 31 tokens after the start token)."""
METRICS_FILE = "training.json"
"""Written into the output directory: settings, losses, throughput and the validation metrics."""
PROJECTION_KEYS = ("encoder.img_emb.weight", "encoder.img_emb.bias")
"""The region projection's weights: what a plain T5 ``--init`` lacks, and gets freshly initialised."""


@dataclass(frozen=True)
class TrainSettings:
    """The training run's settings (paper defaults)."""

    init: str = "t5-small"
    epochs: float = 5.0
    batch_size: int = 128
    learning_rate: float = 5e-5
    """Hugging Face's default, which the release's script kept."""
    save_steps: int = 5000
    """The release's ``--save_steps``."""
    logging_steps: int = 50
    seed: int = 42
    bf16: bool = True
    """bf16 autocast where the GPU has it (fp32 master weights); False trains in fp32 everywhere."""
    workers: int = 4
    """DataLoader processes reading region features (0 reads them in the training process)."""
    max_train: int | None = None
    """Use only the first N training triples (smoke runs)."""

    def __post_init__(self) -> None:
        for name in ("batch_size", "save_steps", "logging_steps"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if self.epochs <= 0 or self.learning_rate <= 0 or self.workers < 0:
            raise ConfigError("--epochs and --learning-rate must be positive and --workers at least 0")


class TripleDataset(torch.utils.data.Dataset):
    """Triples as model inputs: question slots tokenised up front, region features read per item from
    the store at ``features`` (opened in each process on first use, so DataLoader workers never share a
    file handle)."""

    def __init__(self, table: Any, tokenizer: Any, features: str) -> None:
        questions = table.column("question").to_pylist()
        self.ids, self.mask, truncated = visual_question_inputs(tokenizer, questions)
        if any(truncated):
            logger.warning("%d question(s) longer than the 64 slots were cut", sum(truncated))
        answers = table.column("answer").to_pylist()
        encoded = tokenizer(answers, max_length=MAX_ANSWER_TOKENS, truncation=True)["input_ids"]
        self.labels = [np.asarray(x, dtype=np.int64) for x in encoded]
        self.images = table.column("image_id").to_pylist()
        self.features = features
        self._store: Any = None

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, i: int) -> dict[str, Any]:
        if self._store is None:
            from qace.features.stores import open_feature_store

            self._store = open_feature_store(self.features)
        return {
            "input_ids": self.ids[i],
            "attention_mask": self.mask[i],
            "region_features": torch.from_numpy(
                np.asarray(self._store.get(self.images[i]), dtype=np.float32)
            ),
            "labels": self.labels[i],
        }


def collate(items: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Stack a batch; labels right-padded with -100 (ignored by the loss) to the longest answer."""
    width = max(len(x["labels"]) for x in items)
    labels = torch.full((len(items), width), -100, dtype=torch.long)
    for row, item in enumerate(items):
        labels[row, : len(item["labels"])] = torch.from_numpy(item["labels"])
    return {
        "input_ids": torch.stack([x["input_ids"] for x in items]),
        "attention_mask": torch.stack([x["attention_mask"] for x in items]),
        "region_features": torch.stack([x["region_features"] for x in items]),
        "labels": labels,
    }


def read_triples(path: str | Path, split: str) -> Any:
    """The triples of one split (``train`` or ``val``) of a `qace vqa-data` Parquet file."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"triples file {str(path)!r} does not exist; build it with `qace vqa-data`")
    table = pq.read_table(path)
    needed = {"question", "answer", "image_id", "split", "answerable"}
    if not needed <= set(table.column_names):
        raise ConfigError(
            f"{path} lacks columns {sorted(needed - set(table.column_names))}: not a `qace vqa-data` output"
        )
    return table.filter(pc.equal(table["split"], split))


def check_features(features: str, image_ids: list[str]) -> None:
    """Every image of the triples is in the store, checked before any model loads."""
    from qace.features.stores import open_feature_store

    store = open_feature_store(features)
    missing = [i for i in dict.fromkeys(image_ids) if i not in store]
    getattr(store, "close", lambda: None)()  # the DataLoader's workers open their own
    if missing:
        raise FeatureError(
            f"{len(missing)} image(s) of the triples have no region features in {store.signature} "
            f"(first: {missing[:5]}); extract them with `qace features extract` or point --features at "
            "the store that holds them"
        )


def load_init(source: str) -> tuple[VisualT5ForConditionalGeneration, Any]:
    """The starting model: a Visual-T5 checkpoint as it is, or a T5 (hub id or directory) with a new
    region projection; its tokenizer. Any other missing weight is an error."""
    from transformers import AutoTokenizer
    from transformers.utils import logging as transformers_logging

    verbosity = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()  # its load report would list the projection a T5 lacks
    try:
        model, info = VisualT5ForConditionalGeneration.from_pretrained(source, output_loading_info=True)
        tokenizer = AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as exc:
        raise ModelNotFoundError(
            f"cannot load --init {source!r} ({type(exc).__name__}: {str(exc).splitlines()[0]}); give a "
            "T5 or Visual-T5 directory, or a hub id while online (t5-small is the paper's)"
        ) from exc
    finally:
        transformers_logging.set_verbosity(verbosity)
    missing = sorted(set(info["missing_keys"]) - set(PROJECTION_KEYS))
    if missing:
        raise ModelNotFoundError(f"--init {source!r} lacks weights {missing[:5]}: not a T5 checkpoint")
    if info["unexpected_keys"]:
        logger.warning(
            "--init %r: weights a Visual-T5 has no use for, ignored: %s", source, info["unexpected_keys"][:5]
        )
    if set(PROJECTION_KEYS) & set(info["missing_keys"]):
        logger.info(
            "--init %s is a T5: its region projection (encoder.img_emb) starts from random weights", source
        )
    prefix = tuple(tokenizer(IMAGE_PREFIX_TEXT, add_special_tokens=False)["input_ids"])
    if getattr(model.config, "image_prefix_ids", None) is None and prefix != model.prefix_ids:
        model.config.image_prefix_ids = list(
            prefix
        )  # this vocabulary's "image :" (t5-small's is the default)
    model.generation_config.max_length = MAX_ANSWER_TOKENS
    return model, tokenizer


def _arguments(out: Path, settings: TrainSettings, device: str) -> Any:
    from transformers import Seq2SeqTrainingArguments

    cuda = device.startswith("cuda")
    return Seq2SeqTrainingArguments(
        output_dir=str(out / "checkpoints"),
        num_train_epochs=settings.epochs,
        per_device_train_batch_size=settings.batch_size,
        learning_rate=settings.learning_rate,
        bf16=settings.bf16 and cuda and torch.cuda.is_bf16_supported(),
        use_cpu=not cuda,
        save_strategy="steps",
        save_steps=settings.save_steps,
        save_total_limit=2,
        logging_steps=settings.logging_steps,
        logging_first_step=True,
        eval_strategy="no",
        report_to=[],
        disable_tqdm=True,
        seed=settings.seed,
        dataloader_num_workers=settings.workers,
        dataloader_persistent_workers=settings.workers > 0,
        remove_unused_columns=False,
    )


def _trainer_class() -> Any:
    """Seq2SeqTrainer whose loss reads the region features: the encoder input is the 102-position
    layout (`VisualT5ForConditionalGeneration.visual_embeds`), the rest is T5's own forward and loss."""
    from transformers import Seq2SeqTrainer

    class VisualT5Trainer(Seq2SeqTrainer):
        def compute_loss(
            self, model: Any, inputs: dict[str, Any], return_outputs: bool = False, **kwargs: Any
        ) -> Any:
            core = self.accelerator.unwrap_model(model)
            embeds, mask = core.visual_embeds(
                inputs["input_ids"], inputs["attention_mask"], inputs["region_features"]
            )
            outputs = model(inputs_embeds=embeds, attention_mask=mask, labels=inputs["labels"])
            return (outputs.loss, outputs) if return_outputs else outputs.loss

        def _issue_warnings_after_load(self, load_result: Any) -> None:
            """After a checkpoint's weights are loaded to resume: T5's tied embeddings are saved once
            (``shared.weight``), so their other names come back as missing keys although they are loaded,
            which the Trainer would warn about. Any other missing or unexpected weight is an error."""
            params = dict(self.model.named_parameters(remove_duplicate=False))
            missing = set(load_result.missing_keys)
            loaded = {id(p) for name, p in params.items() if name not in missing}
            lost = sorted(k for k in missing if k not in params or id(params[k]) not in loaded)
            if lost or load_result.unexpected_keys:
                raise ResumeError(
                    f"the checkpoint being resumed lacks weights {lost[:5]} or holds unknown ones "
                    f"{list(load_result.unexpected_keys)[:5]}: delete it to resume from the one before"
                )

    return VisualT5Trainer


def _progress_callback() -> Any:
    from transformers import TrainerCallback

    from qace.progress import track

    class Progress(TrainerCallback):
        """Training steps as a `qace.progress` task (a bar, or lines with an ETA), losses in the log."""

        tracker: Any = None

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step:  # a resumed run starts part way, with the checkpoint's weights loaded
                logger.info("resumed from checkpoint-%d", state.global_step)
            self.tracker = track("vqa-train", total=state.max_steps, unit="step")
            self.tracker.update(state.global_step)

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.tracker.update(1)

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            if logs and "loss" in logs:
                logger.info("step %d/%d: loss %.4f", state.global_step, state.max_steps, logs["loss"])

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.tracker.close()

    return Progress()


def train_visual_t5(
    triples: str | Path,
    features: str,
    out_dir: str | Path,
    *,
    settings: TrainSettings = TrainSettings(),
    device: str = "cpu",
    resume: bool = False,
    callbacks: Sequence[Any] = (),
) -> dict[str, Any]:
    """Train, save the model into ``out_dir``, validate it on the engine, and return (and write to
    ``out_dir/training.json``) the run's record. ``callbacks``: more ``transformers.TrainerCallback``s."""
    from transformers import PrinterCallback
    from transformers.trainer_utils import get_last_checkpoint

    from qace.models.loading import checkpoint_fingerprint
    from qace.models.sources import TEST_MODEL_MARKER, is_test_model
    from qace.vqa.evaluate import validate

    out = Path(out_dir).expanduser()
    last = get_last_checkpoint(str(out / "checkpoints")) if (out / "checkpoints").is_dir() else None
    if last is not None and not resume:
        raise ResumeError(
            f"{out} holds checkpoints of an earlier run; pass --resume to continue, or use another DIR"
        )
    train, val = read_triples(triples, "train"), read_triples(triples, "val")
    if settings.max_train is not None:
        train = train.slice(0, settings.max_train)
    if train.num_rows == 0:
        raise ConfigError(f"{triples} has no training triples")
    check_features(features, train.column("image_id").to_pylist() + val.column("image_id").to_pylist())
    model, tokenizer = load_init(settings.init)
    dataset = TripleDataset(train, tokenizer, features)
    trainer = _trainer_class()(
        model=model,
        args=_arguments(out, settings, device),
        train_dataset=dataset,
        data_collator=collate,
        callbacks=[_progress_callback(), *callbacks],
    )
    trainer.remove_callback(PrinterCallback)  # losses go to the log, progress to `qace.progress`
    result = trainer.train(resume_from_checkpoint=last)
    model = trainer.model
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    if is_test_model(settings.init):  # grown from a test model, it scores nothing meaningful either
        (out / TEST_MODEL_MARKER).write_text(
            f"qace test model: trained by qace vqa-train from {settings.init}\n"
        )
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    record = {
        "settings": asdict(settings) | {"device": device, "bf16": trainer.args.bf16},
        "resumed_from": None if last is None else Path(last).name,
        "train_triples": train.num_rows,
        "val_triples": val.num_rows,
        "steps": trainer.state.global_step,
        "losses": losses,
        "train_samples_per_second": result.metrics.get("train_samples_per_second"),
        "train_seconds": result.metrics.get("train_runtime"),
        "validation": validate(model.eval(), tokenizer, val, features, device=device),
        "checkpoint": checkpoint_fingerprint(out),
    }
    (out / METRICS_FILE).write_text(json.dumps(record, indent=1) + "\n")
    return record
