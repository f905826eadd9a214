"""Doors into the tools caption researchers already use: pycocoevalcap (`coco`), torchmetrics
(`torchmetrics`) and Hugging Face ``evaluate`` (the metric module under ``qace_metric/``). All of
them score through `shared.shared_reward`, so a process loads each engine's models once."""

from pathlib import Path


def evaluate_metric_path() -> Path:
    """The Hugging Face ``evaluate`` metric folder: ``evaluate.load(str(evaluate_metric_path()))``."""
    return Path(__file__).with_name("qace_metric")
