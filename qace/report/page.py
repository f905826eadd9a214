"""The report page: a summary (means, components, signatures, histograms) drawn here as static markup,
and the caption table, which `TABLE_SCRIPT` builds in the browser from the page's embedded JSON (sort,
search, worst/best first, a detail row per caption). Text reaches the page only as escaped markup or
through the DOM's ``textContent``, so captions cannot inject markup; the page loads nothing."""

from __future__ import annotations

import json
import re
from html import escape
from importlib import resources
from pathlib import Path
from typing import Any

from qace._version import __version__
from qace.errors import InputError
from qace.report.load import System, load_system, number, read_inputs, shown_row
from qace.report.stats import histogram, paired_difference
from qace.report.svg import histogram_svg

MAX_ERRORS_LISTED = 200


def build_report(scores: list[Path], output: Path, inputs: list[Path] | None = None) -> Path:
    """Write the report of one score file, or compare two on their common ids; returns ``output``.

    ``inputs`` are the scored input files (one for all systems, or one per system): they give the
    caption text of rows without an explanation, and the references the answers were read from.
    """
    inputs = inputs or []
    if not 1 <= len(scores) <= 2:
        raise InputError(f"give one score file, or two to compare; got {len(scores)}")
    if len(inputs) > 1 and len(inputs) != len(scores):
        raise InputError(f"give one --input for all score files or one per score file; got {len(inputs)}")
    systems = [load_system(path, _name(path, scores)) for path in scores]
    given = [read_inputs(p) for p in inputs]
    per_system = [given[min(i, len(given) - 1)] if given else {} for i in range(len(systems))]
    if len(systems) == 2 and systems[0].score_key != systems[1].score_key:
        raise InputError(
            f"cannot compare {systems[0].score_key} scores ({scores[0]}) with {systems[1].score_key} "
            f"scores ({scores[1]}): give two files of the same metric"
        )
    ids = [i for i in systems[0].rows if all(i in s.rows for s in systems)]
    if not ids:
        raise InputError(f"{scores[0]} and {scores[1]} have no id in common; compare runs on the same ids")
    images: dict[str, str] = {}
    items = [
        {
            "id": i,
            "image_id": systems[0].rows[i].get("image_id"),
            "rows": [shown_row(s, s.rows[i], per_system[k], images) for k, s in enumerate(systems)],
        }
        for i in ids
    ]
    data = {
        "mode": "compare" if len(systems) == 2 else "single",
        "systems": [
            {"name": s.name, "score_key": s.score_key, "components": list(s.components)} for s in systems
        ],
        "items": items,
        "images": images,
    }
    summary = _summary(systems, ids)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(_page(" vs ".join(s.name for s in systems), summary, data), encoding="utf-8")
    return output


def _name(path: Path, paths: list[Path]) -> str:
    """The file name, or the path when both compared files share a name."""
    return str(path) if sum(p.name == path.name for p in paths) > 1 else path.name


def _summary(systems: list[System], ids: list[str]) -> str:
    cards = f'<div class="systems">{"".join(_system_card(s) for s in systems)}</div>'
    return _compare_card(systems, ids) + cards if len(systems) == 2 else cards


def _system_card(system: System) -> str:
    plots, figures = [], []
    for key in (system.score_key, *system.components):
        values = [v for v in (number(r.get(key)) for r in system.rows.values()) if v is not None]
        if not values:
            continue
        mean = sum(values) / len(values)
        figures.append(f"<tr><th>{escape(key)}</th><td>{mean:.4f}</td><td>{len(values)}</td></tr>")
        edges, counts = histogram(values)
        plots.append(histogram_svg(f"{key} (mean {mean:.3f})", edges, counts))
    signatures = "".join(f"<li><code>{escape(s)}</code></li>" for s in system.signatures) or "<li>none</li>"
    settings = ", ".join(escape(_short(s)) for s in system.signatures)
    flags: dict[str, int] = {}
    for row in system.rows.values():
        for flag in row.get("flags") or []:
            flags[flag] = flags.get(flag, 0) + 1
    flag_text = ", ".join(f"{escape(f)} {n}" for f, n in sorted(flags.items())) or "none"
    return (
        f'<section class="card"><h2>{escape(system.name)}</h2>'
        f'<p class="settings"><code>{settings}</code></p>'
        f"<p>{len(system.rows)} captions scored, {len(system.errors)} not scored; flags: {flag_text}</p>"
        f'<table class="figures"><tr><th></th><th>mean</th><th>n</th></tr>{"".join(figures)}</table>'
        f'<div class="plots">{"".join(plots)}</div>'
        f"<p>Signature{'s' if len(system.signatures) > 1 else ''}:</p><ul>{signatures}</ul>"
        f"{_errors(system)}</section>"
    )


def _errors(system: System) -> str:
    if not system.errors:
        return ""
    listed = "".join(
        f"<li><code>{escape(str(e.get('id')))}</code>: {escape(str(e.get('reason')))}</li>"
        for e in system.errors[:MAX_ERRORS_LISTED]
    )
    more = len(system.errors) - MAX_ERRORS_LISTED
    tail = f"<li>... and {more} more</li>" if more > 0 else ""
    count = len(system.errors)
    noun = "record" if count == 1 else "records"
    return f"<details><summary>{count} {noun} not scored</summary><ul>{listed}{tail}</ul></details>"


def _compare_card(systems: list[System], ids: list[str]) -> str:
    a, b = systems
    key = a.score_key
    pairs: list[tuple[float, float]] = []
    for i in ids:
        x, y = number(a.rows[i].get(key)), number(b.rows[i].get(key))
        if x is not None and y is not None:
            pairs.append((x, y))
    only = {s.name: len(set(s.rows) - set(ids)) for s in systems}
    skipped = ", ".join(f"{n} only in {escape(name)}" for name, n in only.items() if n)
    if not pairs:
        return (
            '<section class="card"><h2>Paired difference</h2>'
            f"<p>No id has a {escape(key)} score in both.</p></section>"
        )
    d = paired_difference([x for x, _ in pairs], [y for _, y in pairs])
    edges, counts = histogram([y - x for x, y in pairs])
    plot = histogram_svg(f"{key}: B - A per id", edges, counts, marker=0.0)
    return (
        '<section class="card" id="paired"><h2>Paired difference</h2>'
        f"<p>B = {escape(b.name)}, A = {escape(a.name)}, on {d.n} common ids"
        f"{' (' + skipped + ')' if skipped else ''}.</p>"
        f'<p class="big">mean {key} B - A = <b>{d.mean:+.4f}</b> '
        f"({d.level:.0%} bootstrap CI {d.low:+.4f} to {d.high:+.4f})</p>"
        f"<p>B higher on {d.b_better}, equal on {d.ties}, A higher on {d.a_better} ids. "
        "The table below starts with the biggest disagreements.</p>"
        f'<div class="plots">{plot}</div></section>'
    )


def _page(title: str, summary: str, data: dict[str, Any]) -> str:
    """`template.html` with its ``<!--NAME-->`` slots filled in one pass (filled text is not rescanned)."""
    payload = json.dumps(data, ensure_ascii=False, allow_nan=False)
    assets = resources.files("qace.report")
    slots = {
        "TITLE": escape(title),
        "VERSION": escape(__version__),
        "SUMMARY": summary,
        "STYLE": assets.joinpath("report.css").read_text(encoding="utf-8"),
        "SCRIPT": assets.joinpath("report.js").read_text(encoding="utf-8"),
        # no "<" in the JSON, so no caption can close the script element
        "DATA": payload.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026"),
    }
    template = assets.joinpath("template.html").read_text(encoding="utf-8")
    return re.sub(r"<!--([A-Z]+)-->", lambda m: slots[m.group(1)], template)


def _short(signature: str) -> str:
    """A signature's short form (`qace.signature.Signature.short`: no model hashes), or the text itself
    when it is not one."""
    from qace.errors import ConfigError
    from qace.signature import Signature

    try:
        return Signature.parse(signature).short()
    except ConfigError:
        return signature
