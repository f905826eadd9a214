"""What launching a reward-sized encoder batch from Python costs, against replaying it from a CUDA graph.

    python -m benchmarks.encoder_replay --models-dir DIR --out benchmarks/results/encoder_replay_h200.json

The question generator's encoder (`qace.families.t5.encoder.T5Encoder`, bf16, its fused forward) on
batches of ``--shapes`` (rows x positions, every position real, random token ids), each run two ways on
the same inputs:

- ``eager``: as the engine runs an encoder batch, one operator at a time from Python. The host time of
  a call (from the call to its return, the device idle before it, no wait for the device after) and the
  device time of a call (CUDA events), p50 of ``--calls``;
- ``graph``: the same call captured once into a CUDA graph on static inputs. The host time of its first
  replay (a graph's first launch uploads it to the device) and of later ones, and the device time of a
  replay, p50 of ``--calls``; ``equal``: whether the graph's output is bit-equal to the eager call's.

A call's host time above its device time is time the device waits for the host when nothing else is
queued: in a reward call the encoders' batches are small, and the profile's thread sampler put the
model thread in their operators for about 9 ms of a 64-caption QACE-Img call (docs/performance.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.latency import DEFAULT_DATA
from benchmarks.run_info import record, write_result
from benchmarks.workload import half_qg
from qace.families.t5.encoder import T5Encoder


@torch.inference_mode()
def measure(encoder: T5Encoder, vocab: int, rows: int, length: int, calls: int) -> dict[str, Any]:
    """One shape's figures (the module docstring's)."""
    generator = torch.Generator(device="cuda").manual_seed(rows * 1000 + length)
    ids = torch.randint(2, vocab, (rows, length), device="cuda", generator=generator)
    mask = torch.ones(rows, length, device="cuda", dtype=torch.long)

    def run() -> torch.Tensor:
        return encoder(mask, input_ids=ids, kept=length)[0]

    for _ in range(3):  # cuBLAS's choice of kernels, Triton's compilation
        run()
    host, device = [], []
    for _ in range(calls):
        torch.cuda.synchronize()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        start = time.perf_counter()
        run()
        host.append(time.perf_counter() - start)
        end.record()
        torch.cuda.synchronize()
        device.append(begin.elapsed_time(end) / 1000)
    eager_out = run().clone()

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graph_out = run()
    replays, replay_device = [], []
    for _ in range(calls + 1):
        torch.cuda.synchronize()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        start = time.perf_counter()
        graph.replay()
        replays.append(time.perf_counter() - start)
        end.record()
        torch.cuda.synchronize()
        replay_device.append(begin.elapsed_time(end) / 1000)
    return {
        "rows": rows,
        "length": length,
        "eager": {
            "host_ms": 1000 * statistics.median_high(host),
            "device_ms": 1000 * statistics.median_high(device),
        },
        "graph": {
            "first_replay_host_ms": 1000 * replays[0],
            "replay_host_ms": 1000 * statistics.median_high(replays[1:]),
            "device_ms": 1000 * statistics.median_high(replay_device[1:]),
        },
        "equal": bool(torch.equal(graph_out, eager_out)),
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=None, help="default: results/encoder_replay_<gpu>.json")
    parser.add_argument(
        "--models-dir", type=Path, default=None, help="the workload's models (built if absent)"
    )
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA)
    parser.add_argument(
        "--shapes", nargs="+", default=["64x24", "448x24", "448x40", "2048x40"], help="ROWSxPOSITIONS"
    )
    parser.add_argument("--calls", type=int, default=30)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks.encoder_replay needs a CUDA GPU")
    model, qg = half_qg(args.models_dir, args.data_dir, "qace-encoder-replay-")
    encoder = T5Encoder(model)
    shapes = [tuple(int(x) for x in shape.split("x")) for shape in args.shapes]
    vocab = int(model.config.vocab_size)
    result = {
        **record("benchmarks.encoder_replay", argv, device="cuda"),
        "precision": "bf16",
        "model": str(qg),
        "calls": args.calls,
        "shapes": [measure(encoder, vocab, rows, length, args.calls) for rows, length in shapes],
    }
    out = write_result(result, args.out, "encoder_replay")
    for shape in result["shapes"]:
        print(json.dumps(shape))
    print("wrote", out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
