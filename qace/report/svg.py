"""Inline SVG histograms (the page loads nothing, so plots are drawn as markup)."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

WIDTH, HEIGHT, MARGIN = 300, 140, 24


def histogram_svg(
    title: str, edges: Sequence[float], counts: Sequence[int], *, marker: float | None = None
) -> str:
    """A bar chart of ``counts`` between ``edges``, titled, with the range and the largest count
    labelled; ``marker`` draws a vertical line at that value (e.g. zero difference)."""
    low, high = edges[0], edges[-1]
    top = max(max(counts, default=0), 1)
    plot_w, plot_h = WIDTH - 2 * MARGIN, HEIGHT - 2 * MARGIN
    bar_w = plot_w / max(len(counts), 1)
    bars = []
    for i, count in enumerate(counts):
        h = plot_h * count / top
        x, y = MARGIN + i * bar_w, MARGIN + plot_h - h
        label = f"{edges[i]:.3g} to {edges[i + 1]:.3g}: {count}"
        bars.append(
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(bar_w - 1, 0.5):.1f}" height="{h:.1f}">'
            f"<title>{escape(label)}</title></rect>"
        )
    extra = ""
    if marker is not None and low <= marker <= high:
        mx = MARGIN + plot_w * (marker - low) / (high - low)
        extra = f'<line class="marker" x1="{mx:.1f}" x2="{mx:.1f}" y1="{MARGIN}" y2="{MARGIN + plot_h}"/>'
    base = MARGIN + plot_h
    return (
        f'<svg class="hist" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" height="{HEIGHT}" role="img" '
        f'aria-label="{escape(title)}"><text x="{MARGIN}" y="14" class="title">{escape(title)}</text>'
        f"{''.join(bars)}{extra}"
        f'<line x1="{MARGIN}" x2="{MARGIN + plot_w}" y1="{base}" y2="{base}" class="axis"/>'
        f'<text x="{MARGIN}" y="{base + 14}">{low:.3g}</text>'
        f'<text x="{MARGIN + plot_w}" y="{base + 14}" text-anchor="end">{high:.3g}</text>'
        f'<text x="{MARGIN - 4}" y="{MARGIN + 8}" text-anchor="end">{top}</text></svg>'
    )
