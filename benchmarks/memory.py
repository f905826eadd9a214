"""Host memory stays flat as the input grows: peak RSS of ``score_file`` for growing inputs.

    python -m benchmarks.memory --sizes 10000 100000 --out benchmarks/results/memory.json

Each size runs in its own process (peak RSS is per process): the Flickr8k-Expert workload is repeated with
fresh ids into a JSONL file, scored with QACE-Img into JSONL on the random benchmark models, and the
process reports ``ru_maxrss``. Streaming input and chunked output mean the peak should not grow with N.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from benchmarks.run_info import record


def _child(size: int, args: argparse.Namespace) -> dict:
    from benchmarks.workload import flickr_workload, workload_scorer

    records = flickr_workload(Path(args.data_dir))
    work = Path(tempfile.mkdtemp(prefix="qace-mem-"))
    source = work / "in.jsonl"
    with source.open("w") as f:
        for i in range(size):
            r = records[i % len(records)]
            f.write(
                json.dumps(
                    {
                        "id": f"{i}",
                        "image_id": r.image_id,
                        "caption": r.caption,
                        "references": list(r.references or ()),
                    }
                )
                + "\n"
            )
    scorer = workload_scorer(
        Path(args.models_dir),
        args.variant,
        device=args.device,
        precision=args.precision,
        args=args,
        candidate_cache=True,
    )
    scorer.config = scorer.config.with_(progress=False)
    start = time.perf_counter()
    summary = scorer.score_file(source, work / "out.jsonl")
    seconds = time.perf_counter() - start
    return {
        "captions": size,
        "scored": summary.scored,
        "seconds": seconds,
        "captions_per_s": size / seconds,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "input_bytes": source.stat().st_size,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[10000, 100000])
    parser.add_argument("--out", default="benchmarks/results/memory.json")
    parser.add_argument(
        "--data-dir", default=str(Path(__file__).resolve().parents[1].parent / "shared" / "data")
    )
    parser.add_argument(
        "--models-dir", required=True, help="random benchmark models (built there if missing)"
    )
    parser.add_argument(
        "--bertscore-files", default=None, help="MiniLM config/tokenizer files (random weights)"
    )
    parser.add_argument("--variant", default="img")
    parser.add_argument("--precision", default="bf16")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch-rows", type=int, default=2048)
    parser.add_argument("--batch-tokens", type=int, default=131072)
    parser.add_argument("--chunk-size", type=int, default=2048)
    parser.add_argument("--spacy-workers", type=int, default=8)
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        print(json.dumps(_child(args.child, args)))
        return 0
    raw = argv if argv is not None else sys.argv[1:]
    from benchmarks.workload import build_models

    build_models(Path(args.models_dir), Path(args.data_dir), args.bertscore_files)
    runs = []
    for size in args.sizes:
        out = subprocess.run(
            [sys.executable, "-m", "benchmarks.memory", *raw, "--child", str(size)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        runs.append(json.loads(out.strip().splitlines()[-1]))
    report = {
        **record("benchmarks.memory", raw),
        "variant": args.variant,
        "runs": runs,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
