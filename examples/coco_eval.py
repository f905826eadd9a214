"""Add QACE-Ref to a COCOEvalCap-style evaluation: the five lines marked below.

    python examples/coco_eval.py [--models DIR]

pycocoevalcap's loop, as its ``COCOEvalCap.evaluate`` runs it, on three COCO images: PTB-tokenise
references and results, then ask every scorer. QACE's models load once, at its first call. Without
``--models`` it uses the paper's models (see the README, "Real models").
"""

from __future__ import annotations

import argparse

from pycocoevalcap.bleu.bleu import Bleu
from pycocoevalcap.cider.cider import Cider
from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

from qace.integrations.coco import QACEScorer  # 1

GTS = {
    391895: [
        "A man with a red helmet on a small moped on a dirt road.",
        "Man riding a motor bike on a dirt road.",
    ],
    522418: [
        "A woman wearing a net on her head cutting a cake.",
        "A woman cutting a large white sheet cake.",
    ],
    184613: [
        "A child holding a flowered umbrella and petting a yak.",
        "A boy holding an umbrella near cattle.",
    ],
}
RES = {
    391895: ["a man rides a motorcycle on a dirt road"],
    522418: ["a woman cuts a cake in the kitchen"],
    184613: ["a boy with an umbrella stands next to cows"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="directory with qg/, tqa/, vqa/ (default: the paper's models)")
    args = parser.parse_args()
    tokenizer = PTBTokenizer()
    gts = tokenizer.tokenize({k: [{"caption": c} for c in v] for k, v in GTS.items()})
    res = tokenizer.tokenize({k: [{"caption": c} for c in v] for k, v in RES.items()})
    scorers = [(Bleu(4), ["Bleu_1", "Bleu_2", "Bleu_3", "Bleu_4"]), (Cider(), "CIDEr")]
    scorers.append((QACEScorer(models=args.models), "QACE-Ref"))  # 2
    evaluation: dict[str, float] = {}
    for scorer, method in scorers:
        score, scores = scorer.compute_score(gts, res)
        if isinstance(method, list):
            evaluation.update(zip(method, score, strict=True))
        else:
            evaluation[method] = score
        if isinstance(scorer, QACEScorer):  # 3: per-image QACE and its components
            for image_id, value, f1 in zip(gts, scores, scorer.last_components["qace_f1"], strict=True):  # 4
                print(f"{image_id}: QACE-Ref {value:.3f} (F1 part {f1:.3f})")  # 5
    for method, score in evaluation.items():
        print(f"{method}: {score:.3f}")


if __name__ == "__main__":
    main()
