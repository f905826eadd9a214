"""A shard scorer that stalls once its shard output is open: for killing a ``--gpus`` parent mid-run
(`test_scale_shards.test_workers_die_with_their_parent`). Importable in a spawned worker."""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from tests.toy_scorer import CaptionLength


def stalling(*, device: str, pid_file: str, **settings: Any) -> CaptionLength:
    """A `CaptionLength` whose ``score_records`` writes this process's id to ``pid_file``, then waits."""
    scorer = CaptionLength(device=device, **settings)

    def stall(records: Iterable[Any]) -> Iterator[Any]:
        Path(pid_file).write_text(str(os.getpid()))
        time.sleep(600)
        yield from ()

    scorer.score_records = stall  # type: ignore[method-assign]
    return scorer
