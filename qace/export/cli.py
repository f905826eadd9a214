"""``qace export MODEL_DIR [OUT_DIR]``: export QG/TQA/Visual-T5 checkpoints to validated ONNX graphs.

Registered by ``qace.cli`` when the ``onnx`` extra (onnx, onnxruntime) is installed; without it, ``qace
export`` answers with the line that installs it.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from qace.errors import ModelNotFoundError
from qace.export.exporter import VARIANTS

ROLES = ("qg", "tqa", "vqa")


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``qace export`` (`qace.cli` calls this only where the ``onnx`` extra is installed)."""
    p = subparsers.add_parser(
        "export", description="Export QG/TQA/Visual-T5 to ONNX graphs, validated against PyTorch."
    )
    p.add_argument(
        "model_dir",
        help="one checkpoint directory (or Visual-T5 state-dict file), "
        "or a directory holding qg/, tqa/, vqa/",
    )
    p.add_argument(
        "out_dir",
        nargs="?",
        help="output directory (default: MODEL_DIR/onnx, where --backend onnx "
        "looks first); gets <variant>/ or <role>/<variant>/ inside",
    )
    p.add_argument(
        "--variant",
        nargs="+",
        default=["fp32"],
        choices=VARIANTS,
        help="fp32 (exact), fp16 (for CUDA), int8 (dynamic quantization, for CPU)",
    )
    p.add_argument(
        "--kind",
        default="auto",
        choices=["auto", "text", "visual"],
        help="text = QG/TQA T5, visual = Visual-T5 (auto: looks for encoder.img_emb weights)",
    )
    p.add_argument("--device", default="cpu", help="where the exported graphs are validated (cpu or cuda)")
    p.add_argument(
        "--no-validate", action="store_true", help="measure and record, but do not fail on differences"
    )
    p.set_defaults(func=cmd_export)


def _load(path: Path, kind: str) -> Any:
    from qace.models.loading import is_visual_t5_checkpoint, load_seq2seq, load_visual_t5

    visual = (path.is_file() or is_visual_t5_checkpoint(path)) if kind == "auto" else kind == "visual"
    return load_visual_t5(path)[0] if visual else load_seq2seq(str(path), role="qg")[0]


def _targets(model_dir: Path, out_dir: Path) -> list[tuple[Path, Path]]:
    """(checkpoint, output) pairs: the directory itself, or each of its qg/tqa/vqa subdirectories."""
    if model_dir.is_file() or (model_dir / "config.json").is_file():
        return [(model_dir, out_dir)]
    found = [
        (model_dir / role, out_dir / role) for role in ROLES if (model_dir / role / "config.json").is_file()
    ]
    if not found:
        raise ModelNotFoundError(
            f"{model_dir}: neither a checkpoint (config.json) nor a directory with "
            "qg/, tqa/ or vqa/ checkpoints; pass one of those"
        )
    return found


def cmd_export(args: argparse.Namespace) -> int:
    from qace.export.exporter import export_model
    from qace.models.loading import checkpoint_fingerprint
    from qace.progress import track

    model_dir = Path(args.model_dir).expanduser()
    if not model_dir.exists():
        raise ModelNotFoundError(f"{model_dir} does not exist")
    base_out = (
        Path(args.out_dir).expanduser()
        if args.out_dir
        else (model_dir.parent / f"{model_dir.stem}-onnx" if model_dir.is_file() else model_dir / "onnx")
    )
    targets = _targets(model_dir, base_out)
    bar = track("exporting", total=len(targets) * len(args.variant), unit="model")
    for source, out in targets:
        if args.out_dir is None and source != model_dir:
            out = source / "onnx"
        model = _load(source, args.kind)
        fingerprint = checkpoint_fingerprint(source)
        for variant in args.variant:
            result = export_model(
                model,
                out / variant,
                variant=variant,
                fingerprint=fingerprint,
                source=str(source),
                validate=not args.no_validate,
                validation_device=args.device,
            )
            report = result.validation
            print(
                f"{source} -> {result.out_dir} [{variant}]: max |logit diff| {report.max_abs_diff:.3g}, "
                f"identical greedy outputs {report.token_agreement:.0%} of {report.rows} rows "
                f"({report.static_token_agreement:.0%} over the static cache), {result.seconds:.1f} s"
            )
            bar.update(1)
    bar.close()
    return 0
