"""The published figures the meta-evaluation report prints beside ours."""

from __future__ import annotations

from typing import Any

#: Published figures the report prints beside ours (Flickr8k-Expert tau-c x 100 from the
#: CLIPScore/PAC-S tables; PASCAL-50S accuracies from the CLIPScore paper, 5 sampled references).
PUBLISHED: dict[str, dict[str, Any]] = {
    "flickr8k_tau_c": {
        "bleu4": 30.8,
        "rouge_l": 32.3,
        "meteor": 41.8,
        "cider": 43.9,
        "spice": 44.9,
        "clip-s": 51.2,
        "refclip-s": 53.0,
    },
    "pascal50s": {
        "bleu4": {"HC": 53.0, "HI": 92.4, "HM": 86.7, "MM": 59.4},
        "cider": {"HC": 53.0, "HI": 98.0, "HM": 91.5, "MM": 64.5},
        "clip-s": {"HC": 56.5, "HI": 99.3, "HM": 96.4, "MM": 70.4},
        "refclip-s": {"HC": 64.5, "HI": 99.6, "HM": 95.4, "MM": 72.8},
    },
    "flickr8k_judges": {"fleiss_kappa": 0.52, "gamma_mean": 0.98},
}
