"""Other published caption judges, run with QACE's guarantees (signatures, resumable output).

Each judge is a `qace.scoring.FileScorer`: it streams rows or `RecordError`s in input order and
inherits `score_file`, so `qace score --metric ...`, `--gpus` and `qace meta` treat it exactly like QACE.
"""
