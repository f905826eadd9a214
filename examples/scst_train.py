"""Self-critical sequence training (SCST) of a toy captioner with QACE as the reward.

The captioner is a tiny GRU that "sees" an image as a learned embedding and writes a caption from
the words of the bundled example references. Each step samples ``k`` captions per image, decodes
one greedy caption as the baseline, and asks `QACEReward.scst` for the advantages
``r(sample) - r(greedy)`` (one engine call for both sets); the loss is the REINFORCE loss
``-advantage * log p(sample)``. With the tiny test models this runs on CPU in seconds:

    qace make-test-models .qace-cache/test-models
    python examples/scst_train.py --models .qace-cache/test-models --steps 5

With the paper's models (drop ``--models``) and ``--device cuda`` it is the same loop.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import torch
from torch import nn

from qace.reward import QACEReward

EXAMPLES = Path(__file__).resolve().parents[1] / "qace" / "examples" / "captions.jsonl"
BOS, EOS = 0, 1


def load_images(path: Path) -> dict[str, list[str]]:
    """Image id -> its references, from the bundled examples."""
    images: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        images.setdefault(record["image_id"], record["references"])
    return images


class ToyCaptioner(nn.Module):
    """Image embedding -> GRU -> words; just enough policy to show the training loop."""

    def __init__(self, n_images: int, vocab: list[str], hidden: int = 64) -> None:
        super().__init__()
        self.vocab = vocab
        self.image = nn.Embedding(n_images, hidden)
        self.words = nn.Embedding(len(vocab), hidden)
        self.gru = nn.GRUCell(hidden, hidden)
        self.out = nn.Linear(hidden, len(vocab))

    def generate(self, images: torch.Tensor, max_len: int, greedy: bool) -> tuple[list[str], torch.Tensor]:
        """Captions and the summed log-probability of each (zero gradient path when greedy)."""
        state = self.image(images)
        token = torch.full((len(images),), BOS, dtype=torch.long, device=images.device)
        alive = torch.ones(len(images), dtype=torch.bool, device=images.device)
        logp = torch.zeros(len(images), device=images.device)
        words: list[list[str]] = [[] for _ in images]
        for _ in range(max_len):
            state = self.gru(self.words(token), state)
            dist = torch.distributions.Categorical(logits=self.out(state))
            token = dist.probs.argmax(-1) if greedy else dist.sample()
            logp = logp + dist.log_prob(token) * alive
            for row in torch.nonzero(alive & (token != EOS)).flatten().tolist():
                words[row].append(self.vocab[token[row]])
            alive = alive & (token != EOS)
            if not alive.any():
                break
        return [" ".join(w) for w in words], logp


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="qg/ and tqa/ directory (default: the paper's models)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--samples", type=int, default=2, help="sampled captions per image per step")
    parser.add_argument("--max-len", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    torch.manual_seed(args.seed)

    images = load_images(EXAMPLES)
    ids = sorted(images)
    vocab = [
        "<bos>",
        "<eos>",
        *sorted({w.lower().strip(".,") for refs in images.values() for r in refs for w in r.split()}),
    ]
    reward = QACEReward(models=args.models, device=args.device)  # models load once, here
    reward.warm_up()  # on a GPU: every batch shape's CUDA graphs now, not in the training steps
    policy = ToyCaptioner(len(ids), vocab).to(args.device)
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)
    image_index = torch.arange(len(ids), device=args.device)
    references = [images[i] for i in ids]

    for step in range(1, args.steps + 1):
        started = time.perf_counter()
        policy.eval()
        with torch.no_grad():
            greedy, _ = policy.generate(image_index, args.max_len, greedy=True)
        policy.train()
        sampled, logp = policy.generate(
            image_index.repeat_interleave(args.samples), args.max_len, greedy=False
        )
        advantages = reward.scst(sampled, greedy, references=references)  # empty captions score 0.0
        loss = -(advantages.to(logp.device) * logp).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        mean_greedy = reward(greedy, references=references).mean().item()
        print(
            f"step {step}: loss {loss.item():+.4f} | greedy QACE {mean_greedy:.4f} | "
            f"e.g. {greedy[0]!r} | {time.perf_counter() - started:.1f}s"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
