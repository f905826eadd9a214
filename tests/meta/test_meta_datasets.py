"""Generic loader, score-file joins and the PASCAL-50S accuracy rule, on small made-up files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from qace.errors import ConfigError, InputError
from qace.meta.datasets import PairSet, default_data_dir, load_generic, read_records
from qace.meta.evaluate import (
    join_pascal_scores,
    join_scores,
    mean_accuracy,
    pair_accuracy,
    read_score_file,
)


def _pairs(n: int = 8) -> PairSet:
    cats = ["HC", "HI", "HM", "MM"] * (n // 4)
    votes = [np.array([1, 1, -1]) if i % 2 == 0 else np.array([-1, -1, 1, -1]) for i in range(n)]
    return PairSet(
        name="toy",
        ids=[str(i) for i in range(n)],
        image_ids=[f"im{i}" for i in range(n)],
        cand1=[f"a{i}" for i in range(n)],
        cand2=[f"b{i}" for i in range(n)],
        references=[[f"r{i}-{k}" for k in range(10)] for i in range(n)],
        votes=votes,
        categories=cats,
        sources=np.zeros((n, 2), dtype=int),
    )


def test_generic_jsonl_and_csv(tmp_path: Path) -> None:
    rows = [
        {
            "id": "a",
            "item": "img1",
            "system": "s1",
            "candidate": "a dog",
            "references": ["a dog runs"],
            "h1": 3,
            "h2": 4,
            "bleu": 0.5,
        },
        {
            "id": "b",
            "item": "img1",
            "system": "s2",
            "candidate": "a cat",
            "references": ["a dog runs"],
            "h1": 1,
            "h2": None,
            "bleu": 0.1,
        },
    ]
    jl = tmp_path / "x.jsonl"
    jl.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    data = load_generic(jl, ["h1", "h2"])
    assert data.ids == ["a", "b"] and data.systems == ["s1", "s2"] and list(data.metrics) == ["bleu"]
    assert np.isnan(data.human[1, 1]) and data.human[0].tolist() == [3, 4]
    csv = tmp_path / "x.csv"
    csv.write_text(
        "item,candidate,references,h1,h2,m\nimg1,a dog,a dog runs ||| one dog,3,4,0.5\n"
        'img2,a cat,"[""a cat sits""]",2,,0.2\n'
    )
    data = load_generic(csv, ["h1", "h2"])
    assert data.references == [["a dog runs", "one dog"], ["a cat sits"]]
    assert data.ids == ["0", "1"] and data.systems is None


def test_generic_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "z", "h1": "high"}\n')
    with pytest.raises(InputError, match="record 'z'"):
        load_generic(bad, ["h1"])
    with pytest.raises(InputError, match="no human score column"):
        load_generic(bad, ["h9"])
    with pytest.raises(ConfigError):
        load_generic(bad, [])
    with pytest.raises(InputError):
        read_records(tmp_path / "missing.jsonl")


def test_score_file_join(tmp_path: Path) -> None:
    path = tmp_path / "scores.jsonl"
    lines = [
        {"id": "0", "qace": 0.5, "qace_f1": 0.4, "caption": "x", "ok": True},
        {"id": "1", "qace": 0.7, "qace_f1": None},
        {"id": "3-1", "qace": 0.9},
        {"id": "3-2", "qace": 0.1},
    ]
    path.write_text("\n".join(json.dumps(r) for r in lines) + "\n")
    rows = read_score_file(path)
    assert rows["0"] == {"qace": 0.5, "qace_f1": 0.4}
    joined = join_scores(rows, ["0", "1", "2"])
    assert set(joined) == {"qace"}  # qace_f1 covers 1 of 3 ids: below the 50% threshold
    assert joined["qace"][:2].tolist() == [0.5, 0.7] and np.isnan(joined["qace"][2])


def test_score_file_parquet(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    path = tmp_path / "scores.parquet"
    pq.write_table(pa.table({"id": ["a", "b"], "qace": [0.1, 0.2], "caption": ["x", "y"]}), path)
    assert read_score_file(path) == {"a": {"qace": 0.1}, "b": {"qace": 0.2}}


def test_pascal_join_prefers_seed_tagged_ids() -> None:
    pairs = _pairs(4)
    rows = {f"{i}-{k}": {"m": float(k)} for i in range(4) for k in (1, 2)}
    rows.update({f"{i}-{k}@0": {"m": float(3 - k)} for i in range(4) for k in (1, 2)})
    s1, s2 = join_pascal_scores(rows, pairs, seed=0)["m"]
    assert s1.tolist() == [2.0] * 4 and s2.tolist() == [1.0] * 4
    s1, s2 = join_pascal_scores(rows, pairs, seed=1)["m"]  # no @1 ids: plain ids serve every seed
    assert s1.tolist() == [1.0] * 4


def test_pair_accuracy_rules() -> None:
    pairs = _pairs(8)  # majority: +1 for even pairs, -1 for odd pairs
    assert pairs.majority().tolist() == [1, -1] * 4
    right = pair_accuracy(pairs, np.array([1, 0] * 4, float), np.array([0, 1] * 4, float))
    assert right.per_category == {"HC": 100.0, "HI": 100.0, "HM": 100.0, "MM": 100.0}
    ties = pair_accuracy(pairs, np.zeros(8), np.zeros(8))
    assert ties.mean == 50.0  # a metric tie is a coin flip: half right
    wrong = pair_accuracy(pairs, np.array([0, 1] * 4, float), np.array([1, 0] * 4, float))
    assert mean_accuracy([right, wrong]).mean == 50.0
    with pytest.raises(InputError):
        pair_accuracy(pairs, np.zeros(3), np.zeros(3))


def test_reference_sampling_is_reproducible() -> None:
    pairs = _pairs(4)
    a, b, c = pairs.sample_references(0, 5), pairs.sample_references(0, 5), pairs.sample_references(1, 5)
    assert a == b and a != c
    assert all(len(r) == 5 and len(set(r)) == 5 for r in a)
    assert pairs.sample_references(0, 50)[0] == pairs.references[0]


def test_default_data_dir_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("QACE_SHARED_DATA", str(tmp_path))
    assert default_data_dir() == tmp_path
    monkeypatch.delenv("QACE_SHARED_DATA")
    assert default_data_dir().parts[-2:] == ("shared", "data")


def _toy_runs(pairs: PairSet, n_seeds: int = 3) -> list:
    rng = np.random.default_rng(0)
    n = len(pairs)
    return [pair_accuracy(pairs, rng.normal(size=n), rng.normal(size=n)) for _ in range(n_seeds)]


def test_pascal_summary_sd_over_seeds_and_stratified_ci() -> None:
    import statistics

    from qace.meta.evaluate import CATEGORIES, pascal_summary

    pairs = _pairs(40)
    runs = _toy_runs(pairs)
    out = pascal_summary(pairs, runs, n_boot=300)
    for c in CATEGORIES:
        assert out["sd"][c] == pytest.approx(statistics.stdev(r.per_category[c] for r in runs))
        lo, hi = out["ci"][c]
        assert lo <= out["mean"][c] <= hi and 0 <= lo and hi <= 100
    assert out["sd"]["mean"] == pytest.approx(statistics.stdev(r.mean for r in runs))
    # a metric always right leaves nothing to resample: the interval collapses onto 100
    first = pairs.majority() > 0
    always = pair_accuracy(pairs, np.where(first, 1.0, 0.0), np.where(first, 0.0, 1.0))
    assert pascal_summary(pairs, [always], n_boot=50)["ci"]["mean"] == [100.0, 100.0]
    assert "ci" not in pascal_summary(pairs, runs, n_boot=0)


def test_pascal_plot_has_error_bars_and_starts_at_zero() -> None:
    from qace.meta.evaluate import pascal_summary
    from qace.meta.plots import pascal_figure

    pairs = _pairs(40)
    summary = pascal_summary(pairs, _toy_runs(pairs), 100)
    report = {"pascal50s": {"seeds": [0, 1, 2], "accuracy": {"toy": summary}}}
    fig = pascal_figure(report)
    ax = fig.axes[0]
    assert ax.get_ylim() == (0.0, 100.0)
    bars = [c for c in ax.containers if hasattr(c, "errorbar")]
    assert bars and all(c.errorbar is not None for c in bars)


def test_table1_has_no_empty_columns_for_one_data_set() -> None:
    from qace.meta.report import render_markdown

    corr = {
        "kendall_c": {"value": 0.4, "ci_low": 0.3, "ci_high": 0.5, "p_value": "<1e-300"},
        "kendall_b": {"value": 0.4},
        "spearman": {"value": 0.5},
        "pearson": {"value": 0.5},
    }
    flickr_only = {
        "flickr8k_expert": {
            "n_pairs": 3,
            "n_captions": 1,
            "protocol": "x",
            "metrics": {"cider": {"correlations": corr, "gamma": 0.5}},
        }
    }
    md = render_markdown(flickr_only)
    assert "| Metric | Flickr8k-Expert tau-c |\n" in md and "| CIDEr | 40.0 (43.9) |\n" in md
    assert "HC" not in md and "<1e-300" in md
    pascal_only = {
        "pascal50s": {
            "seeds": [0, 1],
            "protocol": "y",
            "accuracy": {
                "cider": {
                    "mean": {"HC": 50.0, "HI": 90.0, "HM": 80.0, "MM": 60.0, "mean": 70.0},
                    "sd": {"HC": 1.0, "HI": 0.5, "HM": 0.25, "MM": 2.0, "mean": 0.5},
                    "n_seeds": 2,
                }
            },
        }
    }
    md = render_markdown(pascal_only)
    assert "| Metric | HC | HI | HM | MM | Mean |" in md and "Flickr8k-Expert tau-c" not in md
    assert "| CIDEr | 50.0 ± 1.0 (65.1) |" in md and "| 70.0 ± 0.5 (79.6) |" in md
