"""Run the GPU test suite (``pytest -m gpu``), whole or in parts, and merge the parts into one record.

    python -m benchmarks.gpu_suite                        # every gpu test: one part record
    python -m benchmarks.gpu_suite --part 2/3 --out P2.json   # the second of three parts
    python -m benchmarks.gpu_suite --merge P1.json P2.json P3.json   # -> results/gpu_suite_<gpu>.json

**Parts.** ``--part i/n`` runs the tests `benchmarks.gpu_suite_plugin.assign` gives part ``i``: whole test
files, balanced by the per-test seconds of ``--weights`` (default: the current
``benchmarks/results/gpu_suite_<gpu>.json``), the same split in every call at one commit. The parts can run
in separate calls, or side by side on one machine. Each finished test is printed at once with its seconds.
The part record holds the run metadata (`run_info.record`), the part, the digest of the source tree it ran
on (`tree_digest`), the ids of every gpu test and of this part's, the exit status and seconds, the outcome
counts, the failing and the unrun ids, why each skipped test skipped (``skipped_because``: a reader sees
whether a test that matters, parity say, did not run), and every test's seconds (``durations``, slowest
first). Exits with pytest's status.

**Merge.** ``--merge`` writes one record: counts summed, failing ids and skip reasons listed, durations
joined, and ``complete: true`` only when the parts are ``1/n`` to ``n/n`` once each, ran every gpu test
exactly once with no extra pytest arguments, at one commit, on one device, each in a clean tree: a git
checkout without changes, or a copy without git metadata (a GPU host's; its commit named in ``QACE_COMMIT``)
whose digest equals that of this checkout, clean at that commit, and where no test skipped for a reason
other than `EXPECTED_SKIPS`. ``incomplete_because`` says what is missing. Exits 0 when the record is
complete with no failing test, else 1.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.gpu_suite_plugin import parse_part
from benchmarks.run_info import default_result, gpu_name, gpu_tag, record

REPO = Path(__file__).resolve().parents[1]
TREE_ROOTS = ("qace", "tests", "benchmarks", "pyproject.toml")
"""What `tree_digest` covers: the code and data the tests run (``benchmarks/results`` left out)."""
BYTECODE_PACKAGES = ("torch", "transformers", "spacy", "qace")
"""The packages whose import dominates a process start (the suite's spawned host and spaCy processes)."""
FINISHED = (0, 1)
"""pytest's exit statuses of a run that ran every selected test (1: some failed)."""
NO_TESTS = 5
"""pytest's exit status when nothing was selected (a part that got no file)."""
EXPECTED_SKIPS = ("needs onnxruntime-gpu", "needs two GPUs")
"""Skip reasons a complete run may hold: a package the GPU host need not have for the rest of the suite,
and a second GPU. Any other skip (the shared data missing, a package the tests need) makes the merged
record incomplete, so a suite that did not run its parity tests is not recorded as checked."""
BUILD_TEST_MODELS = "import sys; from qace.testing.qace_models import main; sys.exit(main(sys.argv[1:]))"


def tree_files(root: Path) -> list[str]:
    """The files under `TREE_ROOTS` as they are on disk (relative, sorted), leaving out
    ``benchmarks/results``, hidden and ``__pycache__`` folders, ``*.egg-info`` and ``*.pyc``."""
    out: list[str] = []
    for top in TREE_ROOTS:
        path = root / top
        candidates = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for p in candidates:
            rel = p.relative_to(root)
            parts = rel.parts
            skip = any(x.startswith(".") or x == "__pycache__" or x.endswith(".egg-info") for x in parts)
            if not skip and p.suffix != ".pyc" and rel.parts[:2] != ("benchmarks", "results"):
                out.append(rel.as_posix())
    return sorted(out)


def tracked_files(root: Path) -> list[str]:
    """The files git tracks under `TREE_ROOTS` (relative, sorted), ``benchmarks/results`` left out."""
    listed = subprocess.run(
        ["git", "ls-files", "--", *TREE_ROOTS, ":(exclude)benchmarks/results"],
        cwd=root, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return sorted(listed.splitlines())


def tree_digest(root: Path, files: Iterable[str]) -> str:
    """sha256 over each file's path and bytes, in the given order."""
    digest = hashlib.sha256()
    for name in files:
        data = (root / name).read_bytes()
        digest.update(f"{name}\0{len(data)}\0".encode())
        digest.update(data)
    return digest.hexdigest()


def suite_digest(test_ids: Iterable[str]) -> str:
    """sha256 of the sorted test ids: parts of one suite have the same."""
    return hashlib.sha256("\n".join(sorted(test_ids)).encode()).hexdigest()


def bytecode_is_kept(packages: Sequence[str] = BYTECODE_PACKAGES) -> bool:
    """Whether Python can reuse compiled bytecode for ``packages``: each has its ``__init__``'s cached
    bytecode, or a folder where it can write it."""
    for name in packages:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
            continue
        cached = Path(importlib.util.cache_from_source(spec.origin))
        folder = cached.parent if cached.parent.exists() else cached.parent.parent
        if not cached.is_file() and not os.access(folder, os.W_OK):
            return False
    return True


def child_env(environ: Mapping[str, str], bytecode_kept: bool) -> dict[str, str]:
    """The environment pytest runs in: output unbuffered (each finished test shows at once, also when
    piped), and compiled bytecode written, so each module is compiled once in a run, not once per
    process (the suite starts tens of host and spaCy processes): ``PYTHONDONTWRITEBYTECODE`` is dropped,
    and where the packages' folders take no bytecode (``bytecode_kept`` false) it goes to
    ``.qace-cache/pycache`` (``PYTHONPYCACHEPREFIX``, unless one is set)."""
    env = {k: v for k, v in environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONUNBUFFERED"] = "1"
    if not bytecode_kept:
        env.setdefault("PYTHONPYCACHEPREFIX", str(REPO / ".qace-cache" / "pycache"))
    return env


def summarise(log: Path) -> dict[str, Any]:
    """A part's outcome from the plugin's log (`benchmarks.gpu_suite_plugin`): its part, the suite's
    size and digest, this part's ids, the outcome counts, failing and unrun ids, skip reasons, and seconds
    per test."""
    text = log.read_text() if log.is_file() else ""
    lines: list[dict[str, Any]] = [json.loads(line) for line in text.splitlines() if line.strip()]
    empty: dict[str, Any] = {"collected": [], "selected": []}
    head = next((line for line in lines if "selected" in line), empty)
    results = {line["test"]: line for line in lines if "test" in line}
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    key = {"passed": "passed", "failed": "failed", "error": "errors", "skipped": "skipped"}
    for line in results.values():
        counts[key[line["outcome"]]] += 1
    durations = sorted(((t, r["seconds"]) for t, r in results.items()), key=lambda x: (-x[1], x[0]))
    return {
        "part": head.get("part"),
        "suite": suite_digest(head["collected"]),
        "collected": len(head["collected"]),
        "selected": head["selected"],
        **counts,
        "failing": [t for t, r in results.items() if r["outcome"] in ("failed", "error")],
        "not_run": [t for t in head["selected"] if t not in results],
        "skipped_because": {t: r.get("reason", "") for t, r in results.items() if r["outcome"] == "skipped"},
        "durations": dict(durations),
    }


def run_part(
    part: str, weights: Path, pytest_args: Sequence[str], argv: Sequence[str] | None
) -> dict[str, Any]:
    """Run one part of ``pytest -m gpu`` (``part`` is ``i/n``) and return its record. The tiny test
    models (`make_test_models`, the session's ``test_models_dir``) are built beside pytest's start, not
    after it: its fixture waits for that build (their builds share a lock) and reuses it."""
    import torch

    tree = tree_digest(REPO, tree_files(REPO))
    env = child_env(os.environ, bytecode_is_kept())
    env.setdefault("QACE_TEST_MODELS", str(REPO / ".qace-cache" / "test-models"))
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "tests.jsonl"
        shown = ["-m", "gpu", "-q", "-p", "benchmarks.gpu_suite_plugin", f"--suite-part={part}"]
        options = ["-o", "console_output_style=classic", f"--suite-weights={weights}", f"--suite-log={log}"]
        command = [sys.executable, "-m", "pytest", *shown, *options, *pytest_args]
        start = time.perf_counter()
        build = [sys.executable, "-c", BUILD_TEST_MODELS, env["QACE_TEST_MODELS"]]
        builder = subprocess.Popen(build, cwd=REPO, env=env)
        status = subprocess.run(command, cwd=REPO, env=env).returncode
        builder.wait()
        seconds = time.perf_counter() - start
        summary = summarise(log)
    return {
        **record("benchmarks.gpu_suite", argv),
        "device": gpu_name() or "cpu (no CUDA device: every gpu test skips)",
        "gpus_visible": torch.cuda.device_count(),
        "pytest_command": shlex.join(["python", "-m", "pytest", *shown, *pytest_args]),
        "pytest_args": list(pytest_args),
        "weights": str(weights.relative_to(REPO) if weights.is_relative_to(REPO) else weights),
        "tree": tree,
        "exit_status": status,
        "seconds": round(seconds, 1),
        **{**summary, "part": part},
    }


def local_checkout(argv: Sequence[str]) -> dict[str, Any]:
    """The checkout that merges, as `run_info.record` sees it: the merge's command, the commit, whether
    it is clean (no changes to tracked files) and, when clean, the digest of the files git tracks under
    `TREE_ROOTS` (an untracked file a part's copy held makes that copy's digest differ)."""
    info = record("benchmarks.gpu_suite", argv)
    clean = info["commit"] is not None and info["dirty"] is False
    tree = tree_digest(REPO, tracked_files(REPO)) if clean else None
    return {"command": info["command"], "commit": info["commit"], "clean": clean, "tree": tree}


def _clean(part: Mapping[str, Any], local: Mapping[str, Any]) -> bool:
    """A part ran in a clean tree: a git checkout without changes, or a copy whose digest is that of
    this checkout, clean at the part's commit."""
    if part.get("dirty") is False:
        return True
    named, here = str(part.get("commit") or ""), str(local["commit"] or "")
    same = named == here or (len(named) >= 7 and here.startswith(named))  # QACE_COMMIT may abbreviate
    verified = local["clean"] and same
    return part.get("dirty") is None and verified and part.get("tree") == local["tree"]


def _finished(part: Mapping[str, Any]) -> bool:
    """pytest ran every test of the part (some may have failed)."""
    status = part["exit_status"]
    return not part["not_run"] and (status in FINISHED or (status == NO_TESTS and not part["selected"]))


def gaps(parts: Sequence[Mapping[str, Any]], local: Mapping[str, Any]) -> list[str]:
    """Why the parts (sorted) do not make one complete run of the suite; empty when they do."""
    why: list[str] = []
    n = parse_part(parts[0]["part"])[1] if parts else 0
    if [parse_part(p["part"]) for p in parts] != [(i, n) for i in range(1, n + 1)] or not parts:
        why.append(f"parts {[p['part'] for p in parts]} are not 1/n to n/n, once each")
    commits = {p.get("commit") for p in parts}
    if len(commits) != 1 or None in commits:
        why.append(f"the parts ran at commits {sorted(map(str, commits))}, not at one named commit")
    if len({p.get("device") for p in parts}) > 1:
        why.append("the parts ran on different devices")
    ran = [t for p in parts for t in p["selected"]]
    if len({p["suite"] for p in parts}) > 1 or len(ran) != len(set(ran)):
        why.append("the parts split different suites, or ran a test twice")
    elif parts and len(ran) != parts[0]["collected"]:
        why.append(f"the parts hold {len(ran)} of the suite's {parts[0]['collected']} tests")
    for p in parts:
        if p["pytest_args"]:
            why.append(f"part {p['part']} ran with more pytest arguments: {p['pytest_args']}")
        if not _finished(p):
            why.append(
                f"part {p['part']} stopped early: exit status {p['exit_status']}, not run {p['not_run']}"
            )
        if not _clean(p, local):
            why.append(
                f"part {p['part']} (dirty: {p.get('dirty')}) is not shown to have run in a clean tree: its "
                "tree digest differs from this checkout's, or this checkout is not clean at its commit"
            )
        unexpected = {
            test: reason
            for test, reason in p.get("skipped_because", {}).items()
            if not any(known in reason for known in EXPECTED_SKIPS)
        }
        if unexpected:
            test, reason = next(iter(unexpected.items()))
            why.append(
                f"part {p['part']} skipped {len(unexpected)} test(s) for what the GPU host lacked, not the "
                f"hardware: {test} ({reason}){' and more' if len(unexpected) > 1 else ''}"
            )
    return why


def merge(parts: Sequence[Mapping[str, Any]], local: Mapping[str, Any]) -> dict[str, Any]:
    """One record of the parts (see the module docstring); ``local`` is `local_checkout`."""
    ordered = sorted(parts, key=lambda p: parse_part(p["part"]))
    why = gaps(ordered, local)
    durations = sorted(
        ((t, s) for p in ordered for t, s in p["durations"].items()), key=lambda x: (-x[1], x[0])
    )
    first = ordered[0] if ordered else {}
    return {
        "command": local["command"],
        "commit": first.get("commit"),
        "dirty": None if why else False,
        **{key: first.get(key) for key in ("gpu", "cpu", "versions", "device", "gpus_visible")},
        "complete": not why,
        "incomplete_because": why,
        "parts": [
            {key: p.get(key) for key in ("part", "command", "tree", "dirty", "exit_status", "seconds")}
            | {"tests": len(p["selected"])}
            for p in ordered
        ],
        "collected": first.get("collected", 0),
        "seconds": round(sum(p["seconds"] for p in ordered), 1),
        **{key: sum(p[key] for p in ordered) for key in ("passed", "failed", "errors", "skipped")},
        "failing": [t for p in ordered for t in p["failing"]],
        "not_run": [t for p in ordered for t in p["not_run"]],
        "skipped_because": {t: r for p in ordered for t, r in p.get("skipped_because", {}).items()},
        "durations": dict(durations),
    }


def _print(result: Mapping[str, Any], slowest: int = 10) -> None:
    """The record without its id lists, then its slowest tests."""
    print(json.dumps({k: v for k, v in result.items() if k not in ("selected", "durations")}, indent=2))
    print(f"slowest {slowest}:")
    for test, seconds in list(result["durations"].items())[:slowest]:
        print(f"{seconds:8.1f} s  {test}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--part", default="1/1", help="run part i of n (default 1/1: every gpu test)")
    parser.add_argument(
        "--weights", default=None, help="record whose durations balance the parts (default: the current one)"
    )
    parser.add_argument("--merge", nargs="+", metavar="PART", help="merge these part records into one")
    parser.add_argument("--out", default=None, help="the record's file (defaults: the module docstring)")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = parser.parse_args(argv)
    argv = list(sys.argv[1:] if argv is None else argv)
    if args.merge:
        if args.pytest_args:
            parser.error("--merge takes part records only")
        parts = [json.loads(Path(p).read_text()) for p in args.merge]
        result = merge(parts, local_checkout(argv))
        out = Path(args.out or default_result("gpu_suite", result.get("gpu")))
        status = 0 if result["complete"] and not result["failing"] else 1
    else:
        try:
            i, n = parse_part(args.part)
        except ValueError as err:
            parser.error(str(err))
        name = gpu_name()
        tag = gpu_tag(name)
        weights = Path(args.weights or default_result("gpu_suite", name))
        result = run_part(f"{i}/{n}", weights, args.pytest_args, argv)
        out = Path(args.out or REPO / ".qace-cache" / "gpu-suite" / f"gpu_suite_{tag}.part{i}of{n}.json")
        status = result["exit_status"]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    _print(result)
    print(f"wrote {out}")
    return status


if __name__ == "__main__":
    sys.exit(main())
