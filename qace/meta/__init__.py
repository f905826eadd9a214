"""Meta-evaluation: how well a metric agrees with people, and how reliable the people are.

Most users need the CLI (``qace meta report``); from Python, the pieces are importable without
pulling in torch (BERTScore loads lazily):

- :mod:`qace.meta.correlation`: Kendall tau-b/tau-c, Spearman, Pearson with scipy's p-values on
  independent units and item-bootstrap intervals (:func:`correlate`).
- :mod:`qace.meta.levels`: system-level (exact permutation p-values) and item-grouped correlation.
- :mod:`qace.meta.significance`: metric A vs metric B: Williams' test, paired bootstrap and
  permutation tests by item.
- :mod:`qace.meta.agreement`: Fleiss/Cohen (weighted) kappa, Krippendorff's alpha, percent
  agreement, Goodman-Kruskal gamma (:func:`agreement_report`).
- :mod:`qace.meta.scales`: readings on the Krippendorff and Landis-Koch scales (agreement) and
  Rosenthal's (correlation).
- :mod:`qace.meta.datasets`: Flickr8k-Expert, PASCAL-50S and generic-file loaders;
  :mod:`qace.meta.judgments`: any judgment file with an explicit column mapping.
- :mod:`qace.meta.study`: everything ``qace meta correlate`` computes and writes.
- :mod:`qace.meta.scorers`: QACE itself as a report row (``--with-scorers``), cached.
- :mod:`qace.meta.baselines`: BLEU/ROUGE-L/METEOR/CIDEr (pycocoevalcap) and BERTScore, cached.
- :mod:`qace.meta.evaluate`, :mod:`qace.meta.report` (with :mod:`qace.meta.report_markdown` and
  :mod:`qace.meta.published`), :mod:`qace.meta.plots`: protocols and outputs.
"""

from qace.meta.agreement import (
    agreement_report,
    cohen_kappa,
    fleiss_kappa,
    goodman_kruskal_gamma,
    krippendorff_alpha,
    percent_agreement,
)
from qace.meta.correlation import Correlation, correlate, correlate_all
from qace.meta.scales import readings

__all__ = [
    "Correlation",
    "agreement_report",
    "cohen_kappa",
    "correlate",
    "correlate_all",
    "fleiss_kappa",
    "goodman_kruskal_gamma",
    "krippendorff_alpha",
    "percent_agreement",
    "readings",
]
