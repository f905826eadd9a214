"""Reading a chunk's new images from an HDF5 feature store: one at a time, as every record's check read
them, against `FeatureCache.load`, which decodes them in threads (`HDF5Store.get_many`).

    python -m benchmarks.feature_reads --out benchmarks/results/feature_reads_cpu.json
    python -m benchmarks.feature_reads --tiny --out /tmp/feature-reads-tiny.json   # smoke run, seconds

QACE-Img checks every record's region features before its chunk is parsed (`QACE._prepare`), so a
reward call or a chunk whose images the host's feature cache does not hold waits for their reads: an
RL run over more images than that cache holds (4,096) meets new images at nearly every step, and a file
scored once reads every image once.

Workload: a store packed by `pack_features` (fp16, one image a chunk, shuffle and gzip level 1) with
``--images`` images, each the real bottom-up-attention sample of the shared data (36 regions of 2,048
features and their boxes) with its regions in a seeded order: the values, and so the compression, of
real features, each image's bytes its own. The file is read once before timing (the operating system
caches it, as it caches a hot store). Per call size, ``--rounds`` rounds, the two ways taking turns,
each call on an empty `FeatureCache` and images no earlier call of its round read:

- ``one_at_a_time``: `FeatureCache.get` of each image in turn (h5py inflates each chunk under its lock);
- ``load``: `FeatureCache.load` of the call's images, then `get` of each (held by then).

Both give the same arrays (checked on every call). ``ms`` is the median call; ``speedup`` one over
the other; ``threads`` the readers `load` used (`READ_THREADS`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.run_info import record
from benchmarks.throughput import DATA
from qace.data.features import HDF5Store, pack_features
from qace.engine.feature_cache import READ_THREADS, FeatureCache

SAMPLE = DATA / "region_features" / "butd_sample.npz"


def real_like_store(path: Path, images: int, seed: int = 0) -> list[str]:
    """Pack ``images`` images of the real sample's regions in seeded orders at ``path``; their ids."""
    sample = np.load(SAMPLE)
    region = np.concatenate([sample["features"], sample["norm_bb"]], axis=1).astype(np.float32)
    rng = np.random.default_rng(seed)
    ids = [f"img{i:06d}.jpg" for i in range(images)]
    pack_features(((i, region[rng.permutation(len(region))]) for i in ids), path, progress=False)
    return ids


def timed_call(store: HDF5Store, ids: list[str], use_load: bool) -> tuple[float, list[np.ndarray]]:
    """Milliseconds of one call's reads on an empty cache, and the arrays it got."""
    cache = FeatureCache(store, capacity=max(4096, len(ids)))
    start = time.perf_counter()
    if use_load:
        cache.load(ids)
    arrays = [cache.get(i) for i in ids]
    ms = 1000 * (time.perf_counter() - start)
    cache.close()
    return ms, arrays


def measure(store: HDF5Store, ids: list[str], size: int, rounds: int, calls: int) -> dict[str, Any]:
    """``rounds`` rounds of ``calls`` calls of ``size`` images each way, the ways taking turns."""
    times: dict[str, list[float]] = {"one_at_a_time": [], "load": []}
    per_round = size * calls
    if per_round > len(ids):
        raise SystemExit(f"calls of {size} images x {calls} need --images of at least {per_round}")
    for r in range(rounds):
        ways = ["one_at_a_time", "load"] if r % 2 == 0 else ["load", "one_at_a_time"]
        for c in range(calls):
            call_ids = ids[c * size : (c + 1) * size]
            got: dict[str, list[np.ndarray]] = {}
            for way in ways:
                ms, got[way] = timed_call(store, call_ids, way == "load")
                times[way].append(ms)
            if not all(np.array_equal(a, b) for a, b in zip(got["load"], got["one_at_a_time"], strict=True)):
                raise RuntimeError("load and one-at-a-time reads gave different arrays")
    ms = {way: statistics.median(t) for way, t in times.items()}
    return {
        "images": size,
        "ms": ms,
        "ms_each": times,
        "speedup": ms["one_at_a_time"] / ms["load"],
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="benchmarks/results/feature_reads_cpu.json")
    parser.add_argument("--sizes", type=int, nargs="+", default=None, help="images a call (64 256 1024)")
    parser.add_argument("--images", type=int, default=None, help="images in the store (default 2,048)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds, the ways taking turns (4)")
    parser.add_argument("--calls", type=int, default=2, help="calls a round and way")
    parser.add_argument("--tiny", action="store_true", help="a smoke run: small sizes, numbers mean nothing")
    args = parser.parse_args(argv)
    sizes = args.sizes or ([4, 8] if args.tiny else [64, 256, 1024])
    images = args.images or (32 if args.tiny else 2048)
    rounds = args.rounds or (2 if args.tiny else 4)
    if not SAMPLE.is_file():
        parser.error(f"the real feature sample is missing: {SAMPLE}")
    work = Path(tempfile.mkdtemp(prefix="qace-feature-reads-"))
    path = work / "features.h5"
    ids = real_like_store(path, images)
    path.read_bytes()  # into the operating system's cache
    store = HDF5Store(path)
    results = [measure(store, ids, size, rounds, args.calls) for size in sizes]
    for r in results:
        print(
            f"{r['images']} images: one at a time {r['ms']['one_at_a_time']:.1f} ms, load "
            f"{r['ms']['load']:.1f} ms ({r['speedup']:.2f}x)",
            flush=True,
        )
    report = {
        **record("benchmarks.feature_reads", argv, device="cpu", packages=("h5py", "numpy")),
        "workload": {
            "store": "pack_features (fp16, one image a chunk, shuffle + gzip 1)",
            "images": images,
            "image_bytes_on_disk": path.stat().st_size / images,
            "features": "the shared bottom-up-attention sample's 36 regions in a seeded order per image",
        },
        "settings": {"sizes": sizes, "rounds": rounds, "calls": args.calls, "threads": READ_THREADS},
        "results": results,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    store.close()
    return report


if __name__ == "__main__":
    main()
