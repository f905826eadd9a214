"""The throughput benchmark's FLOP count (`benchmarks.throughput._model_flops`, the MFU figures' numerator)
equals what PyTorch's own counter sees the engine's models multiply, on the CPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from torch.utils.flop_counter import FlopCounterMode

from benchmarks import throughput
from qace.api import QACE
from qace.data.features import RandomFeatureStore

CAPTIONS = ["a dog runs on the grass", "two girls play ball with a red ball", "a man"]


def _linear_flops(counts: dict[Any, int]) -> int:
    """The FLOPs of matrix products (linear layers); attention's batched products are left out, as the
    benchmark leaves them out."""
    return sum(n for op, n in counts.items() if str(op) in ("aten.mm", "aten.addmm"))


@pytest.mark.parametrize("variant", ["img", "ref"])
def test_model_flops_equal_pytorchs_count(test_models_dir: Path, variant: str) -> None:
    scorer = QACE(
        models=test_models_dir, variant=variant, features=RandomFeatureStore(seed=0), progress=False
    )
    inputs: dict[str, Any] = (
        {"image_ids": ["i1", "i2", "i3"]}
        if variant == "img"
        else {"references": [["a dog runs", "a dog on the grass"]] * 3}
    )
    throughput._zero_counters(scorer)
    with FlopCounterMode(display=False) as counter:
        scorer.score(CAPTIONS, **inputs)
    counts = counter.get_flop_counts()
    assert "BertModel" in counts  # BERTScore's encoder, whose products are not the QA models'
    seen = _linear_flops(counts["Global"]) - _linear_flops(counts["BertModel"])
    runners = throughput._runners(scorer)
    assert set(runners) == ({"qg", "tqa", "vqa"} if variant == "img" else {"qg", "tqa"})
    assert all(r.decoder.row_steps > 0 for r in runners.values())
    assert sum(sum(throughput._model_flops(r)) for r in runners.values()) == seen
