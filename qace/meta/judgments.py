"""A user's human-judgment file, read with an explicit column mapping (``qace meta correlate``).

Nothing is guessed: every role (candidate, id, item, system, human criteria, judges, metric
columns, references) is named by the caller, and a name that is not a column fails with the
list of the columns there are. References come from a column of the file or from a separate
file joined on the item (one caption per row, or a list per row). ``where`` is a pandas
``DataFrame.query`` expression selecting the rows to evaluate; the whole file is kept so that
corpus statistics (CIDEr's document frequencies) can still come from every row.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from qace.data.sniff import read_json_lines, table_format
from qace.errors import ConfigError, InputError
from qace.meta.datasets import CaptionSet, _parse_refs

#: Name of the criterion formed by several judges' columns of one criterion.
JUDGES_CRITERION = "human"


def read_table(path: Path | str, fmt: str = "auto") -> Any:
    """A JSONL, JSON (list of records), CSV or Parquet file as a pandas DataFrame: ``fmt``, or by the
    name and, for JSON, the content (`qace.data.sniff.table_format`)."""
    import pandas as pd

    p = Path(path)
    if not p.is_file():
        raise InputError(f"file not found: {p}")
    kind = table_format(p, fmt)
    try:
        if kind == "jsonl":
            df = pd.DataFrame(read_json_lines(p))
        elif kind == "json":
            df = pd.DataFrame(json.loads(p.read_bytes()))
        elif kind == "csv":
            df = pd.read_csv(p, keep_default_na=True, dtype=object)
        else:
            df = pd.read_parquet(p)
    except (ValueError, json.JSONDecodeError) as exc:
        raise InputError(f"{p} could not be read as {kind}: {exc}") from exc
    if df.empty:
        raise InputError(f"{p}: no rows")
    df.columns = [str(c) for c in df.columns]
    return df


def _require_columns(df: Any, path: Path | str, wanted: dict[str, str]) -> None:
    """``wanted`` maps an option (``--candidate-col``) to the column it names."""
    missing = [(opt, col) for opt, col in wanted.items() if col not in df.columns]
    if missing:
        named = ", ".join(f"{col!r} ({opt})" for opt, col in missing)
        raise InputError(f"{path} has no column {named}; its columns are: {', '.join(map(str, df.columns))}")


def _numeric_column(df: Any, col: str, ids: Sequence[str], path: Path | str) -> np.ndarray:
    import pandas as pd

    raw = df[col]
    values = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=float)
    given = raw.notna().to_numpy() & (raw.astype(str).str.strip() != "").to_numpy()
    bad = np.flatnonzero(np.isnan(values) & given)
    if bad.size:
        i = int(bad[0])
        raise InputError(
            f"{path}: column {col!r} is not numeric ({raw.iloc[i]!r}; {bad.size} such rows); "
            "name a numeric score column",
            ids[i],
        )
    return values


def check_varies(values: np.ndarray, col: str, what: str, path: Path | str) -> None:
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        raise InputError(f"{path}: {what} column {col!r} is empty in the selected rows")
    if np.all(finite == finite[0]):
        raise InputError(
            f"{path}: {what} column {col!r} is constant ({finite[0]:g}) in the selected rows: "
            "no correlation is defined"
        )


@dataclass
class Judgments:
    """Every row of the file as a :class:`CaptionSet`, which rows ``where`` selects, and the criteria.

    ``criteria`` maps a criterion name to the columns of ``data.human`` that hold it: one column
    per ``--human-cols`` criterion, several for the judges of one criterion (``--judge-cols``).
    """

    data: CaptionSet
    selected: np.ndarray
    criteria: dict[str, list[int]]
    where: str | None = None

    def human(self, criterion: str) -> np.ndarray:
        """(selected rows, judges) scores of one criterion."""
        return self.data.human[self.selected][:, self.criteria[criterion]]


def _references_from_file(
    path: Path | str, item_col: str, text_col: str, fmt: str = "auto"
) -> dict[str, list[str]]:
    refs = read_table(path, fmt)
    _require_columns(refs, path, {"--ref-item-col": item_col, "--ref-text-col": text_col})
    out: dict[str, list[str]] = {}
    for item, text in zip(refs[item_col].astype(str), refs[text_col], strict=True):
        lst = out.setdefault(item, [])
        for caption in _parse_refs(list(text) if isinstance(text, np.ndarray) else text, item):
            if caption.strip() and caption not in lst:
                lst.append(caption)
    return out


def load_judgments(
    path: Path | str,
    *,
    human_cols: Sequence[str] = (),
    judge_cols: Sequence[str] = (),
    candidate_col: str | None = None,
    id_col: str | None = None,
    item_col: str | None = None,
    system_col: str | None = None,
    metric_cols: Sequence[str] = (),
    references_col: str | None = None,
    references_file: Path | str | None = None,
    ref_item_col: str | None = None,
    ref_text_col: str | None = None,
    where: str | None = None,
    fmt: str = "auto",
    references_format: str = "auto",
) -> Judgments:
    """Read ``path`` with the given column mapping; validate every named column. ``fmt`` and
    ``references_format`` override the formats `read_table` tells by name and content.

    Errors (:class:`InputError` / :class:`ConfigError`) name the column or record and the fix:
    a missing column lists the available ones, a human or metric column that is empty or
    constant in the selected rows is refused (it would give NaN correlations), a candidate
    column that is empty or not text is refused, as are items without references.
    """
    if not human_cols and not judge_cols:
        raise ConfigError(
            "name the human scores: --human-cols C1 C2 (one criterion each) and/or "
            "--judge-cols J1 J2 J3 (several judges of one criterion)"
        )
    if references_file is not None and not (item_col and ref_item_col and ref_text_col):
        raise ConfigError("--references needs --item-col, --ref-item-col and --ref-text-col")
    if references_file is not None and references_col:
        raise ConfigError("take references from a column or from --references, not both")
    df = read_table(path, fmt)
    wanted = {f"--human-cols {c}": c for c in human_cols} | {f"--judge-cols {c}": c for c in judge_cols}
    wanted |= {f"--metric-cols {c}": c for c in metric_cols}
    for opt, col in (
        ("--candidate-col", candidate_col),
        ("--id-col", id_col),
        ("--item-col", item_col),
        ("--system-col", system_col),
        ("--references-col", references_col),
    ):
        if col:
            wanted[opt] = col
    _require_columns(df, path, wanted)
    n = len(df)
    ids = df[id_col].astype(str).tolist() if id_col else [str(i) for i in range(n)]
    if id_col and len(set(ids)) != n:
        dup = df[id_col][df[id_col].duplicated()].astype(str).iloc[0]
        raise InputError(
            f"{path}: ids in {id_col!r} are not unique ({dup!r} repeats); "
            "pick a unique --id-col or leave it out to use row numbers"
        )
    selected = np.ones(n, dtype=bool)
    if where:
        try:
            selected = df.index.isin(df.query(where).index)
        except Exception as exc:  # pandas raises many types for a bad expression
            raise InputError(
                f"--where {where!r} failed: {exc}; columns are: {', '.join(df.columns)}"
            ) from exc
        if not selected.any():
            raise InputError(f"--where {where!r} selects no rows of {path}")
    items = df[item_col].astype(str).tolist() if item_col else list(ids)
    columns = [*human_cols, *(c for c in judge_cols if c not in human_cols)]
    human = np.stack([_numeric_column(df, c, ids, path) for c in columns], axis=1)
    criteria = {c: [columns.index(c)] for c in human_cols}
    if judge_cols:
        criteria[JUDGES_CRITERION] = [columns.index(c) for c in judge_cols]
    for c in columns:
        check_varies(human[selected, columns.index(c)], c, "human", path)
    metrics = {}
    for c in metric_cols:
        metrics[c] = _numeric_column(df, c, ids, path)
        check_varies(metrics[c][selected], c, "metric", path)
    candidates = [""] * n
    if candidate_col:
        col = df[candidate_col]
        text = col.where(col.notna(), "").astype(str).str.strip()
        empty = np.flatnonzero((text == "").to_numpy() & selected)
        if empty.size:
            raise InputError(
                f"{path}: candidate column {candidate_col!r} is empty in {empty.size} "
                "selected rows; is it the right --candidate-col?",
                ids[int(empty[0])],
            )
        numeric = np.flatnonzero(text.str.fullmatch(r"[-+0-9.eE]+").to_numpy() & selected)
        if numeric.size == int(selected.sum()):
            raise InputError(
                f"{path}: candidate column {candidate_col!r} holds numbers, not captions; "
                "is it the right --candidate-col?"
            )
        candidates = text.tolist()
    references: list[list[str]] = [[] for _ in range(n)]
    if references_col:
        references = [
            _parse_refs(list(v) if isinstance(v, np.ndarray) else v, rid)
            for v, rid in zip(df[references_col].where(df[references_col].notna(), None), ids, strict=True)
        ]
    elif references_file is not None:
        by_item = _references_from_file(
            references_file, str(ref_item_col), str(ref_text_col), references_format
        )
        missing = sorted({items[i] for i in np.flatnonzero(selected) if items[i] not in by_item})
        if missing:
            raise InputError(
                f"{references_file} has no references for {len(missing)} item(s) of {path} "
                f"(first: {missing[:3]}); do --item-col and --ref-item-col hold the same ids?"
            )
        references = [list(by_item.get(it, [])) for it in items]
    systems = df[system_col].astype(str).tolist() if system_col else None
    data = CaptionSet(
        name=Path(path).stem,
        ids=ids,
        image_ids=items,
        candidates=candidates,
        references=references,
        human=human,
        judges=columns,
        systems=systems,
        metrics=metrics,
    )
    return Judgments(data=data, selected=selected, criteria=criteria, where=where)
