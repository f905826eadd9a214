"""Scoring beyond one GPU: shards over one host's GPUs, Ray Data over many machines (docs/scale.md)."""
