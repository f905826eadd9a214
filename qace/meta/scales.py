"""Verbal readings of agreement and correlation figures on the scales people cite.

A bare 0.52 means little to a reader; "moderate (Landis-Koch), unreliable (Krippendorff)" says
what it licenses. Each scale is applied only to the statistics it was written for: Landis and
Koch (1977) and Krippendorff (1980) grade chance-corrected *agreement* (kappa, alpha) and
nothing else; a metric-human correlation or a gamma is an association, not agreement, and is
read only as a correlation on Rosenthal's (1996) effect-size bands for r, with the source
named. Percent agreement is not chance-corrected, so no scale is applied to it.
"""

from __future__ import annotations

import math

from qace.errors import ConfigError

#: (lower bound, label) from the top down; a value takes the first label whose bound it reaches.
#: Landis-Koch bands are printed as 0.00-0.20, 0.21-0.40, ...: read as "above 0.20" etc.
LANDIS_KOCH = (
    (0.80, "almost perfect"),
    (0.60, "substantial"),
    (0.40, "moderate"),
    (0.20, "fair"),
    (0.0, "slight"),
    (-math.inf, "poor"),
)
KRIPPENDORFF = ((0.800, "reliable"), (0.667, "tentative conclusions only"), (-math.inf, "unreliable"))
ROSENTHAL = ((0.70, "very large"), (0.50, "large"), (0.30, "medium"), (0.10, "small"), (0.0, "very small"))

#: Figure kinds: chance-corrected agreement, correlation/association, raw proportion.
KINDS = ("agreement", "correlation", "proportion")


def _grade(value: float, scale: tuple[tuple[float, str], ...], strict: bool = False) -> str:
    """First label whose bound ``value`` reaches (``strict``: exceeds, except the 0 bound)."""
    if not math.isfinite(value):
        return "n/a"
    for bound, label in scale:
        if value > bound or (value >= bound and (not strict or bound == 0.0)):
            return label
    return scale[-1][1]


def landis_koch(value: float) -> str:
    """Landis & Koch (1977): poor < 0 <= slight <= .20 < fair <= .40 < moderate <= .60 < ..."""
    return _grade(value, LANDIS_KOCH, strict=True)


def krippendorff_1980(value: float) -> str:
    """Krippendorff (1980/2004): >= .800 reliable, >= .667 tentative, below that unreliable."""
    return _grade(value, KRIPPENDORFF)


def rosenthal_1996(value: float) -> str:
    """Rosenthal (1996) on |r|: .10 small, .30 medium, .50 large, .70 very large."""
    return _grade(abs(value) if math.isfinite(value) else value, ROSENTHAL)


def readings(value: float, kind: str = "agreement") -> dict[str, str]:
    """Readings of ``value`` on every scale that applies to its ``kind``.

    Agreement figures (kappa, alpha) are read on Krippendorff's and Landis-Koch's scales;
    correlations (tau, rho, r, gamma) only on Rosenthal's effect-size bands; proportions on none.
    """
    if kind not in KINDS:
        raise ConfigError(f"unknown figure kind {kind!r}; choose from {KINDS}")
    if kind == "proportion":
        return {}
    if kind == "correlation":
        return {"rosenthal_1996": rosenthal_1996(value)}
    return {"krippendorff_1980": krippendorff_1980(value), "landis_koch_1977": landis_koch(value)}


def reading_text(value: float, kind: str = "agreement") -> str:
    """Short form for tables: ``"KA: unreliable; LK: moderate"`` (agreement) or
    ``"large correlation (Rosenthal 1996)"`` (correlation)."""
    if kind == "correlation":
        return f"{rosenthal_1996(value)} correlation (Rosenthal 1996)"
    short = {"krippendorff_1980": "KA", "landis_koch_1977": "LK"}
    r = readings(value, kind)
    return "; ".join(f"{short[k]}: {v}" for k, v in r.items()) if r else "not chance-corrected"
