"""``qace report``: one self-contained HTML page (no network) to read ``qace score`` output.

`load` reads score files (QACE with or without ``--explain``, VisCE², regeneration: any registered
metric of `qace.scorers`) into what the page shows, `stats` computes the summary figures (histograms,
the paired bootstrap of compare mode), `svg` draws the plots and `page` writes the HTML with its table
script; `cli` is the command.
"""
