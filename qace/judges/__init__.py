"""Other published caption judges, run with QACE's guarantees (signatures, resumable output).

Each judge is a `qace.scoring.FileScorer`: it streams rows or `RecordError`s in input order and
inherits `score_file`; each is an entry of the scorer registry (`qace.scorers`), so `qace score
--metric ...`, `--gpus`, `score-ray`, `serve`, `demo` and `qace meta` treat it exactly like QACE. A
judge module holds the scorer, its command-line options and settings; it imports neither the demo nor
the test-model builders (`qace.testing.demos` builds its demo scorer).
"""
