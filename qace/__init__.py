"""QACE: question-answering caption evaluation, fast and deterministic."""

__version__ = "0.1.0"
