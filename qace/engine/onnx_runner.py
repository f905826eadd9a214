"""ONNX Runtime runner: the PyTorch runner's greedy loop on exported graphs (``qace.export``).

Same contract as :class:`qace.engine.torch_runner.TorchRunner`: encoder once per batch, first decoder
step through ``decoder_init`` (which also returns the cross-attention K/V), later steps through
``decoder`` with the past K/V fed back; answerability from the first step's logits; stop when every
row has emitted EOS. On CPU, finished rows are dropped once at most half are still running (as the
PyTorch runner does: each drop copies the K/V, so it is amortised).
With the CUDA provider the K/V stay on the GPU through IO binding and only the logits are copied to
the host; rows are then not dropped (that would need a device-side gather), they keep decoding and
their extra tokens are ignored, so the outputs are the same. The CUDA path is written but untested.

Runtime needs only numpy and onnxruntime; torch is touched only to mirror its thread count.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from qace.engine.batches import Generated, TextBatch, VisualBatch, cut_at_eos
from qace.errors import BackendUnavailableError, ConfigError

logger = logging.getLogger(__name__)

GRAPHS = ("encoder", "decoder_init", "decoder")
MANIFEST = "manifest.json"


def import_ort() -> Any:
    """onnxruntime, or a BackendUnavailableError that says how to install it."""
    try:
        import onnxruntime
    except ImportError as exc:
        raise BackendUnavailableError(
            "the ONNX backend needs onnxruntime: pip install 'qace[onnx]' (or onnxruntime-gpu for CUDA)"
        ) from exc
    return onnxruntime


@dataclass(frozen=True)
class GraphInfo:
    """What the runner reads from an export's manifest."""

    layers: int
    visual: bool
    start_id: int
    eos_id: int
    float_dtype: str

    @classmethod
    def read(cls, export_dir: Path) -> GraphInfo:
        path = export_dir / MANIFEST
        try:
            info = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{path}: not a qace ONNX export ({exc}); re-run `qace export`") from exc
        return cls(
            int(info["layers"]),
            bool(info["visual"]),
            int(info["decoder_start_token_id"]),
            int(info["eos_token_id"]),
            "float16" if info["precision"] == "fp16" else "float32",
        )


def _default_threads() -> int:
    """Mirror PyTorch's intra-op thread count when it is loaded (tests pin it to 1); else ORT's default."""
    torch = sys.modules.get("torch")
    return int(torch.get_num_threads()) if torch is not None else 0


def _device_id(device: str) -> int:
    return int(device.split(":", 1)[1]) if ":" in device else 0


def make_session(path: Path, *, device: str = "cpu", threads: int | None = None) -> Any:
    """An InferenceSession with full graph optimisation on the provider matching ``device``."""
    ort = import_ort()
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = _default_threads() if threads is None else threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    if device.startswith("cuda"):
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise BackendUnavailableError(
                f"device {device!r} asks for CUDA but this onnxruntime has no CUDAExecutionProvider; "
                "install onnxruntime-gpu or use --device cpu"
            )
        providers: list[Any] = [
            ("CUDAExecutionProvider", {"device_id": _device_id(device)}),
            "CPUExecutionProvider",
        ]
    elif device == "cpu":
        providers = ["CPUExecutionProvider"]
    else:
        raise ConfigError(f"the ONNX backend runs on 'cpu' or 'cuda[:N]', not {device!r}")
    return ort.InferenceSession(str(path), sess_options=options, providers=providers)


class OnnxRunner:
    """Runs one exported seq2seq model (T5 or Visual-T5) on batches planned by the scheduler."""

    def __init__(self, export_dir: str | Path, *, device: str = "cpu", threads: int | None = None) -> None:
        self.export_dir = Path(export_dir)
        self.info = GraphInfo.read(self.export_dir)
        self.device = device
        self.sessions = {
            name: make_session(self.export_dir / f"{name}.onnx", device=device, threads=threads)
            for name in GRAPHS
        }
        self._bound = device.startswith("cuda")
        self._float = np.dtype(self.info.float_dtype)
        self._past_names = [i.name for i in self.sessions["decoder"].get_inputs()][2:]
        self._init_outputs = [o.name for o in self.sessions["decoder_init"].get_outputs()]
        self._step_outputs = [o.name for o in self.sessions["decoder"].get_outputs()]
        self.force: Callable[[TextBatch | VisualBatch, int], Any] | None = None
        """Benchmarks only: ``(batch, steps) -> (B, steps)`` tokens that replace each step's argmax, as
        ``TorchRunner.force``."""

    @classmethod
    def for_model(
        cls,
        model: Any,
        source: str,
        *,
        precision: str = "fp32",
        device: str = "cpu",
        fingerprint: str | None = None,
        threads: int | None = None,
    ) -> OnnxRunner:
        """Runner for a loaded model, exporting and validating it on first use (``qace.export.cache``).

        ``precision``: ``fp32`` (exact), ``fp16`` (meant for CUDA) or ``int8`` (dynamic quantization, CPU).
        """
        if precision not in ("fp32", "fp16", "int8"):
            raise ConfigError(
                f"the ONNX backend runs fp32, fp16 or int8, not {precision!r}; use --backend torch for bf16"
            )
        import_ort()
        from qace.export.cache import ensure_export

        export_dir = ensure_export(source, model, precision, fingerprint=fingerprint, device=device)
        return cls(export_dir, device=device, threads=threads)

    def generate(
        self, batch: TextBatch | VisualBatch, *, max_new_tokens: int, unanswerable_id: int | None = None
    ) -> Generated:
        """Greedy-decode every row of ``batch``."""
        feeds: dict[str, Any] = {
            "input_ids": np.ascontiguousarray(batch.input_ids, dtype=np.int64),
            "attention_mask": np.ascontiguousarray(batch.attention_mask, dtype=np.int64),
        }
        if isinstance(batch, VisualBatch) != self.info.visual:
            raise ConfigError(f"{self.export_dir}: batch kind does not match the exported model")
        if isinstance(batch, VisualBatch):
            feeds["features"] = np.ascontiguousarray(batch.features, dtype=np.float32)
        hidden, mask = self._run("encoder", feeds, ["encoder_hidden_states", "encoder_attention_mask"])
        forced = None if self.force is None else np.asarray(self.force(batch, max_new_tokens), dtype=np.int64)
        return self._greedy(hidden, mask, max_new_tokens, unanswerable_id, forced)

    def _greedy(
        self,
        hidden: Any,
        mask: Any,
        max_new_tokens: int,
        unanswerable_id: int | None,
        forced: np.ndarray | None,
    ) -> Generated:
        rows = len(self._host(mask))
        alive = np.arange(rows)
        finished = np.zeros(rows, dtype=bool)
        token = np.full((rows, 1), self.info.start_id, dtype=np.int64)
        out = np.full((rows, max_new_tokens), -1, dtype=np.int64)
        answerability = None
        past: list[Any] = []
        for step in range(max_new_tokens):
            if step == 0:
                feeds = {
                    "decoder_input_ids": token,
                    "encoder_hidden_states": hidden,
                    "encoder_attention_mask": mask,
                }
                logits, *past = self._run("decoder_init", feeds, self._init_outputs)
            else:
                feeds = {
                    "decoder_input_ids": token,
                    "encoder_attention_mask": mask,
                    **dict(zip(self._past_names, past, strict=True)),
                }
                logits, *self_kv = self._run("decoder", feeds, self._step_outputs)
                past = merge_past(self_kv, past)
            logits = self._host(logits)
            if step == 0 and unanswerable_id is not None:
                answerability = 1.0 - _softmax_at(logits, unanswerable_id)
            next_token = logits.argmax(axis=-1).astype(np.int64) if forced is None else forced[alive, step]
            out[alive, step] = np.where(finished, -1, next_token)
            finished |= next_token == self.info.eos_id
            token = np.where(finished, self.info.eos_id, next_token)[:, None]  # ended rows idle until dropped
            n_alive = int((~finished).sum())
            if n_alive == 0:
                break
            if n_alive <= len(alive) // 2 and not self._bound:  # compact rarely: each drop copies the K/V
                keep = np.flatnonzero(~finished)
                alive, token, finished, mask = alive[keep], token[keep], finished[keep], mask[keep]
                past = [np.ascontiguousarray(p[keep]) for p in past]
        return Generated(tokens=cut_at_eos(out, self.info.eos_id), answerability=answerability)

    def _run(self, graph: str, feeds: dict[str, Any], outputs: list[str]) -> list[Any]:
        session = self.sessions[graph]
        if not self._bound:
            return session.run(outputs, feeds)
        ort = import_ort()
        device_id = _device_id(self.device)
        binding = session.io_binding()
        for name, value in feeds.items():
            if isinstance(value, np.ndarray):
                value = ort.OrtValue.ortvalue_from_numpy(value, "cuda", device_id)
            binding.bind_ortvalue_input(name, value)
        for name in outputs:
            binding.bind_output(name, "cuda", device_id)
        session.run_with_iobinding(binding)
        return list(binding.get_outputs())

    @staticmethod
    def _host(value: Any) -> np.ndarray:
        return value if isinstance(value, np.ndarray) else value.numpy()


def merge_past(self_kv: list[Any], past: list[Any]) -> list[Any]:
    """Next step's past: each layer's new self-attention K/V with its unchanged cross-attention K/V."""
    return [
        kv
        for i in range(len(self_kv) // 2)
        for kv in (*self_kv[2 * i : 2 * i + 2], *past[4 * i + 2 : 4 * i + 4])
    ]


def _softmax_at(logits: np.ndarray, index: int) -> np.ndarray:
    """softmax(logits)[:, index] in float64-free fp32 arithmetic, like ``torch.softmax`` on fp32 logits."""
    shifted = logits - logits.max(axis=-1, keepdims=True)
    exp = np.exp(shifted)
    return (exp[:, index] / exp.sum(axis=-1)).astype(np.float32)
