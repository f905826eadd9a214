"""Fixed costs: a 16-caption ``qace score`` against a bare process, where its time goes, and ``qace serve``
from start to ready.

    python -m benchmarks.startup --out benchmarks/results/startup_<gpu>.json      # on a GPU host
    python -m benchmarks.startup --tiny --out /tmp/startup.json                    # smoke run, CPU

Every timed run is a fresh process, as a user's is (imports, model loading, CUDA's start-up and the
first call all count), on the workload's paper-shaped random models (`benchmarks.workload`; no output
control: what a user gets from those weights), QACE-Ref, 16 distinct PASCAL-50S captions. Designs and
repetitions alternate, so a slow moment of the host does not fall on one of them:

- ``bare_imports_wall_s``: ``python -c 'import torch, transformers, spacy'`` plus CUDA's start-up (a tiny
  tensor on the device), the floor every run pays;
- ``score_16_wall_s``: ``python -m qace.cli score`` of the 16 captions with the device's defaults;
  ``score_16_single_process_wall_s`` the same with ``--host-workers 0``;
- ``breakdown``: the same scoring in one fresh process, timed phase by phase (each import, CUDA's
  start-up, each part of building the scorer, the first call's stages) and, after it, what starting the
  host and spaCy processes costs when an input is long enough to use them (not part of a 16-caption run);
- ``serve_ready_s``: ``qace serve`` from its start until ``/health`` answers 200 (warm-up included), and
  ``serve_ready_no_warm_up_s`` with ``--no-warm-up``.

Medians are reported beside every run's seconds. One untimed-for-the-medians run goes first
(``first_run_ever_wall_s``): the first run on a machine also compiles token F1's kernels into their disk
cache and writes the bytecode cache, which later runs reuse.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.run_info import record

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
BARE = "import torch, transformers, spacy\nif torch.cuda.is_available():\n    torch.ones(1, device='cuda')\n"


def _wall(command: list[str], env: dict[str, str], timeout: float) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return seconds


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve_ready(base: list[str], env: dict[str, str], timeout: float, *extra: str) -> float:
    """Seconds from starting ``qace serve`` until its ``/health`` answers 200."""
    import httpx

    port = _free_port()
    command = [*base, "--port", str(port), "--token", "startup-benchmark-token-0123", *extra]
    start = time.perf_counter()
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    try:
        while time.perf_counter() - start < timeout:
            if proc.poll() is not None:
                raise RuntimeError(f"qace serve exited ({proc.returncode}):\n{proc.communicate()[1][-3000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1.0).status_code == 200:
                    return time.perf_counter() - start
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"qace serve not ready within {timeout:g} s")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def phases(args: argparse.Namespace) -> dict[str, Any]:
    """The 16-caption scoring in this (fresh) process, timed phase by phase; then the processes' start."""
    out: dict[str, Any] = {}
    t = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal t
        now = time.perf_counter()
        out[name] = now - t
        t = now

    import torch

    lap("import_torch")
    import transformers  # noqa: F401

    lap("import_transformers")
    import spacy  # noqa: F401

    lap("import_spacy")
    if args.device.startswith("cuda"):
        torch.ones(1, device=args.device)
    lap("cuda_init")
    from qace.api import QACE
    from qace.data.records import read_records
    from qace.engine import instrument
    from qace.engine.instrument import StageTimer

    lap("import_qace")
    import qace.kernels.bertscore as bertscore
    import qace.metric.candidates as candidates
    import qace.metric.runners as runners

    built: dict[str, float] = {}
    for module, name in (
        (runners, "build_models"),
        (bertscore, "BertScoreMatcher"),
        (candidates, "CandidateExtractor"),
    ):
        real = getattr(module, name)

        def timed(*a: Any, _real: Any = real, _name: str = name, **k: Any) -> Any:
            start = time.perf_counter()
            try:
                return _real(*a, **k)
            finally:
                built[_name] = time.perf_counter() - start

        setattr(module, name, timed)
    bertscore_dir = Path(args.models_dir) / "bertscore"
    scorer = QACE(
        models=args.models_dir,
        variant="ref",
        device=args.device,
        precision=args.precision,
        bertscore_model=str(bertscore_dir) if bertscore_dir.is_dir() else None,
        progress=False,
    )
    lap("build_scorer")
    out["build_scorer_parts"] = built
    timer = StageTimer()
    instrument.attach(scorer, timer=timer)
    records = list(read_records(args.input))
    list(scorer.score_records(records))
    lap("first_call")
    out["first_call_stages"] = dict(timer.seconds)
    list(scorer.score_records(records))
    lap("second_call")
    out["host_workers"], out["spacy_workers"] = scorer.config.host_workers, scorer.config.spacy_workers
    scorer.start_host_processes(wait=True)
    scorer.candidates.start(wait=True)
    lap("host_and_spacy_processes_ready")
    scorer.close()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", required=True)
    parser.add_argument("--repeats", type=int, default=2, help="runs of each command (alternating)")
    parser.add_argument("--captions", type=int, default=16)
    parser.add_argument("--models-dir", default=None, help="reuse models built earlier")
    parser.add_argument("--precision", default=None, help="default bf16 (fp32 with --tiny)")
    parser.add_argument("--device", default=None, help="default: cuda if any")
    parser.add_argument("--no-serve", dest="serve", action="store_false", help="skip qace serve")
    parser.add_argument("--tiny", action="store_true", help="tiny random models on the CPU: a smoke run")
    parser.add_argument("--data-dir", default=str(DATA))
    parser.add_argument("--phases-of", default=None, help=argparse.SUPPRESS)  # the breakdown's own process
    parser.add_argument("--input", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.phases_of:
        Path(args.phases_of).write_text(json.dumps(phases(args)))
        return 0

    import torch

    from benchmarks.workload import build_models, build_tiny_models, pascal_workload, write_jsonl

    args.device = args.device or ("cuda" if torch.cuda.is_available() and not args.tiny else "cpu")
    args.precision = args.precision or ("fp32" if args.tiny else "bf16")
    records = pascal_workload(Path(args.data_dir), args.captions)
    work = Path(tempfile.mkdtemp(prefix="qace-startup-"))
    models = Path(args.models_dir or work / "models")
    if args.tiny:  # a tiny tokenizer of the workload's own text
        build_tiny_models(models, pascal_workload(Path(args.data_dir), 2048))
    else:
        build_models(models, Path(args.data_dir))
    args.models_dir = str(models)
    args.input = str(work / "in.jsonl")
    write_jsonl(records, Path(args.input))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    if (models / "bertscore").is_dir():
        bertscore = ["--bertscore-model", str(models / "bertscore")]
    else:
        bertscore = []
    common = ["--models", str(models), "--device", args.device, "--precision", args.precision, *bertscore]
    score = [sys.executable, "-m", "qace.cli", "score", args.input, "--no-progress", *common]
    timeout = 60 if args.tiny else 300
    # the first run ever also compiles token F1's kernels (cached on disk) and, on a host without a
    # bytecode cache, writes the .pyc files: a one-time cost, timed apart and kept out of the medians
    first_run = _wall([*score, "-o", str(work / "first.jsonl")], env, timeout)
    runs: dict[str, list[float]] = {"bare": [], "score": [], "score_single": []}
    for i in range(args.repeats):
        runs["bare"].append(_wall([sys.executable, "-c", BARE], env, timeout))
        out_file = work / f"out-{i}.jsonl"
        runs["score"].append(_wall([*score, "-o", str(out_file)], env, timeout))
        runs["score_single"].append(
            _wall([*score, "-o", str(work / f"single-{i}.jsonl"), "--host-workers", "0"], env, timeout)
        )
        print(json.dumps({k: v[-1] for k, v in runs.items()}), flush=True)
    phases_file = work / "phases.json"
    phase_command = [
        sys.executable,
        "-m",
        "benchmarks.startup",
        "--out",
        "-",
        "--phases-of",
        str(phases_file),
    ]
    phase_command += ["--input", args.input, "--models-dir", str(models), "--device", args.device]
    phase_command += ["--precision", args.precision]
    _wall(phase_command, env, timeout)
    result: dict[str, Any] = {
        **record("benchmarks.startup", argv),
        "device": args.device,
        "precision": args.precision,
        "tiny": args.tiny,
        "workload": f"{len(records)} distinct PASCAL-50S captions, QACE-Ref, 5 references each; paper-shaped "
        "random models" + (" (tiny)" if args.tiny else ""),
        "bare_imports_wall_s": statistics.median(runs["bare"]),
        "score_16_wall_s": statistics.median(runs["score"]),
        "score_16_single_process_wall_s": statistics.median(runs["score_single"]),
        "first_run_ever_wall_s": first_run,
        "runs_s": runs,
        "breakdown": json.loads(phases_file.read_text()),
    }
    if args.serve:
        serve = [sys.executable, "-m", "qace.cli", "serve", *common]
        ready = [serve_ready(serve, env, 600), serve_ready(serve, env, 600, "--no-warm-up")]
        result["serve_ready_s"], result["serve_ready_no_warm_up_s"] = ready
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
