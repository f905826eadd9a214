"""One rank of test_torchmetrics' two-process gloo run: ``ddp_worker.py RANK MODELS_DIR IN_JSON OUT_JSON``
(IN_JSON: ``{"captions": [...], "refs": [...]}``)."""

from __future__ import annotations

import faulthandler
import json
import os
import sys

import torch
import torch.distributed as dist

from qace.integrations import shared
from qace.integrations.torchmetrics import QACEScore


def main(rank: int, models: str, data: str, out: str) -> None:
    faulthandler.enable()  # a fatal signal (an abort in a C++ teardown) prints every thread's stack
    with open(data) as f:
        inputs = json.load(f)
    captions, refs = inputs["captions"], inputs["refs"]
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    metric = QACEScore(models=models, per_sample=True)
    mine = slice(0, 3) if rank == 0 else slice(3, 4)
    metric.update(captions[mine], refs[mine])
    reward = shared.shared_reward(models=models, device="cpu", variant="ref")
    counted = []
    original = reward.score
    reward.score = lambda captions, **kw: counted.append(len(captions)) or original(captions, **kw)  # type: ignore[method-assign]
    result = metric.compute()
    # a rank that saw nothing this epoch still syncs and gets every rank's score
    metric.reset()
    if rank == 1:
        metric.update(captions[3:], refs[3:])
    empty = metric.compute()
    dist.barrier()  # no rank tears down while another still talks to it (rank 0 also hosts the store)
    dist.destroy_process_group()
    with open(out, "w") as f:
        json.dump(
            {
                "per_sample": result["qace_per_sample"].tolist(),
                "mean": result["qace"].item(),
                "scored_here": counted[0],
                "empty_rank_mean": empty["qace"].item(),
            },
            f,
        )


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4])
    sys.stdout.flush()
    sys.stderr.flush()
    # the work is done and written; leave without the interpreter's finalisation, where one CI run saw
    # rank 1 abort ("terminate called without an active exception") as torch's C++ objects were torn down
    os._exit(0)
