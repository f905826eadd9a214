"""Several registered metrics in one pass over a file: ``qace score --metric qace-img,clip-s,refclip-s``.

`combined_entry` turns the names into one registry entry (`qace.scorers.ScorerEntry`) whose factory
builds a `CombinedScorer`, so every entry point that takes ``--metric`` (``qace score``, ``--gpus``,
``score-ray``, ``serve``) runs the combination as it runs one metric. The records are read once and
each chunk goes to every metric's scorer; the rows are merged into one row per record:

- each metric's columns (a column two metrics both write, such as ``clip_s`` of ``clip-s`` and
  ``refclip-s``, keeps the first metric's value), ``flags`` the union;
- ``<score key>_signature``: each metric's own signature; ``signature``: theirs joined by " + " (what
  a resumed run must match);
- a record any metric cannot score is an error whose reason names that metric (``clip-s: ...``).

Metrics writing the same score column (``qace-ref`` and ``qace-img`` both write ``qace``) cannot share
a row: a `ConfigError` before anything loads.
"""

from __future__ import annotations

import argparse
import itertools
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from qace import scorers
from qace.data.records import Record, RecordError
from qace.errors import ConfigError
from qace.scoring import FileScorer

SEPARATOR = " + "
"""Joins the metrics' signatures in the ``signature`` column."""


def split_names(metric: str) -> list[str]:
    """The metric names of a ``--metric`` value (comma-separated), each registered, none twice."""
    names = [name.strip() for name in metric.split(",") if name.strip()]
    for name in names:
        scorers.get(name)  # `ConfigError` listing the registered names
    if len(set(names)) != len(names):
        raise ConfigError(f"--metric {metric}: a metric is named twice")
    if not names:
        raise ConfigError("--metric is empty; name one or more registered metrics, comma-separated")
    return names


def check_columns(entries: Sequence[scorers.ScorerEntry]) -> None:
    """`ConfigError` when two metrics write the same score column (their rows cannot be merged)."""
    seen: dict[str, str] = {}
    for entry in entries:
        other = seen.setdefault(entry.score_key, entry.name)
        if other != entry.name:
            raise ConfigError(
                f"--metric {other} and {entry.name} both write the column {entry.score_key!r}; score them "
                "in separate runs"
            )


def combined_entry(metric: str) -> scorers.ScorerEntry:
    """The registry entry of a comma-separated ``--metric`` value (a single name: its own entry)."""
    names = split_names(metric)
    entries = [scorers.get(name) for name in names]
    if len(entries) == 1:
        return entries[0]
    check_columns(entries)
    columns = tuple(dict.fromkeys(c for e in entries for c in e.columns))
    return scorers.ScorerEntry(
        name=",".join(names),
        factory="qace.combined:CombinedScorer",
        settings="qace.combined:cli_settings",
        score_key=entries[0].score_key,
        columns=columns,
        parts=tuple(c for c in columns if c != entries[0].score_key),
        signature=SEPARATOR.join(e.signature for e in entries),
        reads=entries[0].reads,
        help=f"{', '.join(names)} in one pass",
    )


def cli_settings(args: argparse.Namespace) -> dict[str, Any]:
    """`CombinedScorer` keyword arguments from parsed arguments: each metric's settings (a metric that
    fixes ``--variant``, as ``qace-img`` does, sees it fixed), all checked before any model loads."""
    names = split_names(args.metric)
    settings: dict[str, dict[str, Any]] = {}
    for name in names:
        entry = scorers.get(name)
        fixed = dict(entry.preset).get("variant")
        if fixed is not None:
            args.variant = fixed
        entry.require()
        settings[name] = entry.settings_from(args)
    return {"metrics": names, "settings": settings, "progress": not getattr(args, "no_progress", False)}


@dataclass(frozen=True)
class _Config:
    chunk_size: int
    progress: bool
    device: str


class CombinedScorer(FileScorer):
    """The metrics ``metrics`` (registered names) scored together, one merged row per record (see the
    module docstring); ``settings`` maps a name to its scorer's keyword arguments."""

    def __init__(
        self,
        *,
        metrics: Sequence[str],
        settings: dict[str, dict[str, Any]] | None = None,
        device: str = "cpu",
        progress: bool = True,
    ) -> None:
        entries = [scorers.get(name) for name in metrics]
        if len(entries) < 2:
            raise ConfigError(f"a combined run needs two or more metrics, got {list(metrics)}")
        check_columns(entries)
        given = settings or {}
        self.members = [(e, e.build(device, **given.get(e.name, {}))) for e in entries]
        self.score_key = entries[0].score_key
        self.signature = SEPARATOR.join(scorer.signature for _, scorer in self.members)
        self.uses_test_models = any(scorer.uses_test_models for _, scorer in self.members)
        chunk = min(scorer.chunk_size for _, scorer in self.members)
        self.config = _Config(chunk, progress, device)

    def score_records(
        self, records: Iterable[Record | RecordError]
    ) -> Iterator[dict[str, Any] | RecordError]:
        """Stream merged rows (or errors) in input order, a chunk (the smallest member's) at a time."""
        iterator = iter(records)
        while chunk := list(itertools.islice(iterator, self.chunk_size)):
            answers = [list(scorer.score_records(chunk)) for _, scorer in self.members]
            for n, item in enumerate(chunk):
                yield item if isinstance(item, RecordError) else self._merge(item, [a[n] for a in answers])

    def _merge(
        self, record: Record, results: list[dict[str, Any] | RecordError]
    ) -> dict[str, Any] | RecordError:
        reasons = [
            f"{entry.name}: {result.reason}"
            for (entry, _), result in zip(self.members, results, strict=True)
            if isinstance(result, RecordError)
        ]
        if reasons:
            return RecordError(record.id, "; ".join(reasons), record.line)
        row: dict[str, Any] = {"id": record.id}
        flags: set[str] = set()
        for (entry, scorer), result in zip(self.members, results, strict=True):
            assert isinstance(result, dict)
            flags.update(result.get("flags", ()))
            for key, value in result.items():
                if key not in ("id", "flags", "signature", "metric"):
                    row.setdefault(key, value)
            row[f"{entry.score_key}_signature"] = scorer.signature
        row["flags"] = sorted(flags)
        row["signature"] = self.signature
        return row
