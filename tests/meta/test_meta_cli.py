"""``qace meta`` end to end: export, score with a toy metric, report with it; agreement; correlate."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from qace.meta.cli import main

REPO_ROOT = Path(__file__).resolve().parents[2]


def _toy_scores(export: Path, out: Path) -> None:
    """Stand-in for ``qace score``: one row per exported caption, ``id`` plus numeric columns."""
    with open(export) as src, open(out, "a") as dst:
        for line in src:
            rec = json.loads(line)
            words = set(rec["caption"].lower().split())
            overlap = max(len(words & set(r.lower().split())) for r in rec["references"])
            dst.write(
                json.dumps(
                    {"id": rec["id"], "toy_overlap": overlap / max(1, len(words)), "caption": rec["caption"]}
                )
                + "\n"
            )


def test_report_end_to_end(
    shared_data: Path, java: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    flickr, pascal, scores = tmp_path / "flickr.jsonl", tmp_path / "pascal.jsonl", tmp_path / "scores.jsonl"
    assert main(["export", "flickr8k", str(flickr), "--data-dir", str(shared_data)]) == 0
    assert main(["export", "pascal50s", str(pascal), "--seed", "0", "--data-dir", str(shared_data)]) == 0
    first = json.loads(flickr.read_text().splitlines()[0])
    assert set(first) == {"id", "image_id", "caption", "references"} and first["id"] == "0"
    assert sum(1 for _ in open(flickr)) == 5822 and sum(1 for _ in open(pascal)) == 8000
    assert json.loads(pascal.read_text().splitlines()[1])["id"] == "0-2"
    _toy_scores(flickr, scores)
    _toy_scores(pascal, scores)

    out = tmp_path / "report"
    code = main(
        [
            "report",
            "--data-dir",
            str(shared_data),
            "--out",
            str(out),
            "--metrics",
            "bleu4",
            "cider",
            "spice",
            "--seeds",
            "0",
            "--bootstrap",
            "20",
            "--scores",
            str(scores),
        ]
    )
    assert code == 0
    for name in ("report.json", "report.md", "judges.png", "metric_vs_human.png", "pascal50s.png"):
        assert (out / name).stat().st_size > 0, name
    report = json.loads((out / "report.json").read_text())
    tau = report["flickr8k_expert"]["metrics"]
    assert set(tau) == {"bleu4", "cider", "toy_overlap"}
    assert tau["bleu4"]["correlations"]["kendall_c"]["value"] == pytest.approx(0.308, abs=0.005)
    ci = tau["cider"]["correlations"]["kendall_c"]
    assert ci["ci_low"] < ci["value"] < ci["ci_high"]
    assert set(report["pascal50s"]["accuracy"]) == {"bleu4", "cider", "toy_overlap"}
    assert "spice" in report["skipped"]
    assert report["flickr8k_judges"]["figures"]["fleiss_kappa"] == pytest.approx(0.5167, abs=1e-4)
    md = (out / "report.md").read_text()
    assert "| BLEU-4 | 30.8 (30.8) |" in md and "| SPICE | skipped |" in md
    assert "Level agreement (kappa) beside covariation" in md
    assert "wrote" in capsys.readouterr().out


def test_agreement_and_correlate_on_user_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(0)
    truth = rng.integers(1, 6, 60)
    path = tmp_path / "judged.csv"
    lines = ["id,item,candidate,references,a,b,c,mymetric"]
    for i, t in enumerate(truth):
        a, b, c = (int(np.clip(t + rng.integers(-1, 2), 1, 5)) for _ in range(3))
        lines.append(f"r{i},img{i % 7},caption {i},ref {i},{a},{b},{c},{t + rng.normal():.3f}")
    path.write_text("\n".join(lines) + "\n")
    out_json, out_png = tmp_path / "agree.json", tmp_path / "agree.png"
    assert (
        main(
            [
                "agreement",
                str(path),
                "--judges",
                "a",
                "b",
                "c",
                "--json",
                str(out_json),
                "--plot",
                str(out_png),
            ]
        )
        == 0
    )
    agree = json.loads(out_json.read_text())
    assert set(agree["figures"]) >= {"fleiss_kappa", "krippendorff_alpha_ordinal", "percent_agreement"}
    assert out_png.stat().st_size > 0
    corr_json = tmp_path / "corr.json"
    assert (
        main(
            [
                "correlate",
                str(path),
                "--human",
                "a",
                "b",
                "c",
                "--metric-cols",
                "mymetric",
                "--bootstrap",
                "50",
                "--permutations",
                "0",
                "--no-plots",
                "--out",
                str(tmp_path / "corr"),
                "--json",
                str(corr_json),
            ]
        )
        == 0
    )
    corr = json.loads(corr_json.read_text())
    assert corr["segment"]["human"]["mymetric"]["kendall_c"]["value"] > 0.3
    printed = capsys.readouterr().out
    assert "fleiss_kappa" in printed and "mymetric" in printed
    assert main(["agreement", str(path)]) == 2  # no --judges: a clear error, not a traceback


def test_python_dash_m_entry_point() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "qace.meta", "--help"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0
    assert all(cmd in proc.stdout for cmd in ("report", "agreement", "correlate", "export"))


def test_agreement_on_flickr8k(shared_data: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["agreement", "--data-dir", str(shared_data)]) == 0
    out = capsys.readouterr().out
    assert "5822 items" in out and "fleiss_kappa" in out and "moderate" in out
