"""ONNX Runtime runner: greedy decoding of exported graphs (`qace.onnx_format`), on the CPU or CUDA.

Same contract as :class:`qace.engine.torch_runner.TorchRunner`: encoder once per batch, first decoder
step through ``decoder_init`` (which also returns the cross-attention K/V), answerability from the first
step's logits, stop when every row has emitted EOS. Two ways to decode the later steps, one per device
by default (``static_cache``):

- CPU: the engine's greedy loop (`qace.engine.greedy`) on ``decoder`` with the past K/V fed back, one
  position longer each step; finished rows are dropped on the device by the ``compact`` graph once at
  most half the rows are still running (as the PyTorch runner does: each drop copies the K/V, so it is
  amortised). Cheapest on a CPU, where a step costs its arithmetic, not its launches.
- CUDA: ``decoder_static`` over a static cache, replayed from CUDA graphs (`qace.engine.onnx_static`).

Either way decoding stays on the session's device: every graph runs through IO binding, the encoder
states and K/V are ``OrtValue``s on that device fed from one step to the next, and the only values
copied to the host per step are one token id per row (the argmax is taken inside the graph) and, at the
first step, ``answerability``: never the logits.

Runtime needs only numpy and onnxruntime; torch is touched only to mirror its thread count.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from qace.engine import instrument
from qace.engine.batches import Generated, TextBatch, VisualBatch, cut_at_eos
from qace.engine.greedy import NumpyArrays, greedy_decode
from qace.engine.onnx_static import StaticDecoder, bind_feeds
from qace.errors import BackendUnavailableError, ConfigError
from qace.onnx_format import (
    ENCODER_INPUTS,
    ENCODER_OUTPUTS,
    FEATURES,
    LOOP_GRAPHS,
    STATIC_GRAPHS,
    GraphInfo,
    compact_input_names,
    compact_output_names,
    decoder_input_names,
    decoder_output_names,
    init_input_names,
    init_output_names,
    merge_past,
)

logger = logging.getLogger(__name__)

GPU_INSTALL = "pip uninstall -y onnxruntime && pip install 'qace[onnx-gpu]'"
"""What makes ``--backend onnx --device cuda`` work (the CPU and GPU wheels both provide ``onnxruntime``)."""


def import_ort() -> Any:
    """onnxruntime, or a BackendUnavailableError that says how to install it."""
    try:
        import onnxruntime
    except ImportError as exc:
        raise BackendUnavailableError(
            "the ONNX backend needs onnxruntime: pip install 'qace[onnx]' (or 'qace[onnx-gpu]' for CUDA)"
        ) from exc
    return onnxruntime


def check_device(device: str) -> None:
    """Raise before anything loads when the ONNX backend cannot run on ``device``.

    ``cpu`` and ``cuda[:N]`` are the devices; CUDA needs the ``CUDAExecutionProvider`` of
    ``onnxruntime-gpu`` (the error gives the install line).
    """
    ort = import_ort()
    if device.startswith("cuda"):
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise BackendUnavailableError(
                f"device {device!r} asks for CUDA but this onnxruntime ({ort.__version__}) has no "
                f"CUDAExecutionProvider; install the GPU build: {GPU_INSTALL} (or use --device cpu)"
            )
        _device_id(device)
    elif device != "cpu":
        raise ConfigError(f"the ONNX backend runs on 'cpu' or 'cuda[:N]', not {device!r}")


def _default_threads() -> int:
    """Mirror PyTorch's intra-op thread count when it is loaded (tests pin it to 1); else ORT's default."""
    torch = sys.modules.get("torch")
    return int(torch.get_num_threads()) if torch is not None else 0


def _device_id(device: str) -> int:
    index = device.split(":", 1)[1] if ":" in device else "0"
    if not index.isdigit():
        raise ConfigError(f"device {device!r}: write cuda or cuda:N with N a GPU index")
    return int(index)


def make_session(
    path: Path, *, device: str = "cpu", threads: int | None = None, cuda_graph: bool = False
) -> Any:
    """An InferenceSession with full graph optimisation on the provider matching ``device``;
    ``cuda_graph``: the CUDA provider captures and replays its runs (``enable_cuda_graph``)."""
    ort = import_ort()
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = _default_threads() if threads is None else threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    check_device(device)
    providers: list[Any] = ["CPUExecutionProvider"]
    if device.startswith("cuda"):
        # TF32 matmuls (ORT's default on Ampere and later) would make fp32 graphs lossy
        # the arena grows by what a run asks for, not to the next power of two: a fp16 T5-base batch of
        # 2,048 rows would otherwise reserve up to twice its working memory in each session
        cuda = {
            "device_id": _device_id(device),
            "use_tf32": 0,
            "enable_cuda_graph": int(cuda_graph),
            "arena_extend_strategy": "kSameAsRequested",
        }
        providers.insert(0, ("CUDAExecutionProvider", cuda))
    return ort.InferenceSession(str(path), sess_options=options, providers=providers)


class OnnxRunner:
    """Runs one exported seq2seq model (T5 or Visual-T5) on batches planned by the scheduler."""

    def __init__(
        self,
        export_dir: str | Path,
        *,
        device: str = "cpu",
        threads: int | None = None,
        static_cache: bool | None = None,
        max_batch: tuple[int, int] | None = None,
    ) -> None:
        """``static_cache``: decode over ``decoder_static`` (default on CUDA, where it runs as CUDA
        graphs) rather than the growing-past loop (default on the CPU); see the module docstring.
        ``max_batch``: the scheduler's (rows, tokens) batch limits, which size the static cache's
        buffers once (`qace.engine.onnx_static`)."""
        self.export_dir = Path(export_dir)
        self.info = GraphInfo.read(self.export_dir)
        self.device = device
        cuda = device.startswith("cuda")
        self.static_cache = cuda if static_cache is None else static_cache
        self.sessions = {
            name: make_session(
                self.export_dir / f"{name}.onnx",
                device=device,
                threads=threads,
                cuda_graph=cuda and name == "decoder_static",
            )
            for name in (STATIC_GRAPHS if self.static_cache else LOOP_GRAPHS)
        }
        self._where = ("cuda", _device_id(device)) if cuda else ("cpu", 0)
        self.static = (
            StaticDecoder(self.sessions, self.info, self._where, capture=cuda, max_batch=max_batch)
            if self.static_cache
            else None
        )
        layers = self.info.layers
        self._init_outputs = init_output_names(layers)[1:]  # the logits stay in the graph
        self._step_inputs = decoder_input_names(layers)
        self._step_outputs = decoder_output_names(layers)[1:]
        self._compact_inputs = compact_input_names(layers)
        self._compact_outputs = compact_output_names(layers)

    def generate(
        self, batch: TextBatch | VisualBatch, *, max_new_tokens: int, unanswerable_id: int | None = None
    ) -> Generated:
        """Greedy-decode every row of ``batch``."""
        inputs = (batch.input_ids, batch.attention_mask)
        feeds: dict[str, Any] = {
            name: np.ascontiguousarray(value, dtype=np.int64)
            for name, value in zip(ENCODER_INPUTS, inputs, strict=True)
        }
        if isinstance(batch, VisualBatch) != self.info.visual:
            raise ConfigError(f"{self.export_dir}: batch kind does not match the exported model")
        if isinstance(batch, VisualBatch):
            feeds[FEATURES] = np.ascontiguousarray(batch.features, dtype=np.float32)
        hidden, mask = self._run("encoder", feeds, ENCODER_OUTPUTS)
        force = instrument.of(self).force_tokens
        forced = None if force is None else np.asarray(force(batch, max_new_tokens), dtype=np.int64)
        if self.static is not None:
            out, answerability = self.static.decode(
                hidden, mask, max_new_tokens=max_new_tokens, unanswerable_id=unanswerable_id, forced=forced
            )
        else:
            out, answerability = greedy_decode(
                _OnnxSteps(self, hidden, mask, unanswerable_id),
                len(batch.input_ids),
                start_id=self.info.start_id,
                eos_id=self.info.eos_id,
                max_new_tokens=max_new_tokens,
                unanswerable_id=unanswerable_id,
                forced=forced,
            )
        return Generated(tokens=cut_at_eos(out, self.info.eos_id), answerability=answerability)

    def _run(
        self, graph: str, feeds: dict[str, Any], outputs: Sequence[str], host: Sequence[str] = ()
    ) -> list[Any]:
        """Run ``graph`` through IO binding: numpy ``feeds`` are uploaded, OrtValues used where they are;
        ``outputs`` come back as OrtValues on the session's device, except the names in ``host``, which
        are copied to the host and returned as numpy arrays."""
        binding = self.sessions[graph].io_binding()
        bind_feeds(binding, feeds)
        for name in outputs:
            binding.bind_output(name, *(("cpu", 0) if name in host else self._where))
        self.sessions[graph].run_with_iobinding(binding)
        values = binding.get_outputs()
        return [v.numpy() if name in host else v for name, v in zip(outputs, values, strict=True)]


class _OnnxSteps:
    """One batch's decoding steps for `greedy_decode` on the exported graphs: ``decoder_init`` first (it
    also returns the cross-attention K/V and the answerability), then ``decoder`` with the past K/V fed
    back; dropped rows leave the K/V on the device (``compact``). A step's output is ``(next_token,
    answerability)``, both on the host (the argmax is taken inside the graph)."""

    arrays = NumpyArrays()

    def __init__(self, runner: OnnxRunner, hidden: Any, mask: Any, unanswerable_id: int | None) -> None:
        self.runner, self.hidden, self.mask = runner, hidden, mask
        self.unanswerable_id = unanswerable_id
        self.past: list[Any] = []

    def step(self, step: int, token: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        runner, token = self.runner, token[:, None]
        if step == 0:
            unanswerable = np.array([self.unanswerable_id or 0], dtype=np.int64)
            values = (token, self.hidden, self.mask, unanswerable)
            feeds = dict(zip(init_input_names(), values, strict=True))
            host = runner._init_outputs[:2]  # next_token, answerability
            best, answer, *self.past = runner._run("decoder_init", feeds, runner._init_outputs, host)
            return best, answer
        feeds = dict(zip(runner._step_inputs, (token, self.mask, *self.past), strict=True))
        best, *self_kv = runner._run("decoder", feeds, runner._step_outputs, runner._step_outputs[:1])
        self.past = merge_past(self_kv, self.past)
        return best, None

    def choose(self, output: tuple[np.ndarray, np.ndarray | None]) -> np.ndarray:
        return output[0]

    def answerability(self, output: tuple[np.ndarray, np.ndarray | None], unanswerable_id: int) -> Any:
        return output[1]

    def keep(self, rows: np.ndarray) -> None:
        runner = self.runner
        feeds = dict(zip(runner._compact_inputs, (rows, self.mask, *self.past), strict=True))
        self.mask, *self.past = runner._run("compact", feeds, runner._compact_outputs)
