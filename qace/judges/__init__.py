"""Other published caption judges, run with QACE's guarantees (signatures, resumable output).

Each judge is a scorer in the sense of `qace.data.run.Scorer`: it streams rows or `RecordError`s in
input order, so `qace score --metric ...`, `qace.data.run.score_file` and `qace meta` treat it
exactly like QACE.
"""
