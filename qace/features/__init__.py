"""Region features from where users have them: published feature files read in place
(`qace.features.formats`) and raw images through the bottom-up-attention detector
(`qace.features.detector`, driven by `qace.features.extract`)."""

DEFAULT_DETECTOR = "unc-nlp/frcnn-vg-finetuned"
"""The detector's default source: the public PyTorch conversion of the original Caffe weights (hub id)."""
