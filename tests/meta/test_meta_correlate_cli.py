"""``qace meta correlate`` on a made-up judgment file: column mapping, references file, --where, levels."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from qace.meta.cli import main

WORDS = ["dog", "cat", "ball", "park", "red", "runs", "sits", "grass", "man", "bike"]


def _write_study(tmp_path: Path, n_images: int = 12) -> tuple[Path, Path]:
    """Four systems (one of them 'Human') caption each image; three criteria rate each caption."""
    rng = np.random.default_rng(0)
    rows, refs = [], []
    for img in range(n_images):
        truth = [WORDS[(img + k) % len(WORDS)] for k in range(4)]
        for _ in range(3):
            refs.append({"image": f"im{img}", "caption": "a " + " ".join(rng.permutation(truth))})
        for s, keep in (("Human", 4), ("good", 3), ("ok", 2), ("bad", 1)):
            words = truth[:keep] + list(rng.choice(WORDS, 4 - keep))
            quality = keep + rng.normal(0, 0.4)
            rows.append(
                {
                    "cap_id": f"im{img}-{s}",
                    "IMG": f"im{img}",
                    "SYS": s,
                    "text": "a " + " ".join(words),
                    "P": round(quality),
                    "R": round(quality + rng.normal(0, 0.5)),
                    "Total": round(quality * 2 + rng.normal(0, 0.5)),
                    "mymetric": quality + rng.normal(0, 1),
                }
            )
    data, ref_file = tmp_path / "judged.csv", tmp_path / "refs.jsonl"
    pd.DataFrame(rows).to_csv(data, index=False)
    ref_file.write_text("".join(json.dumps(r) + "\n" for r in refs))
    return data, ref_file


def test_correlate_maps_columns_joins_references_filters(
    tmp_path: Path, java: None, capsys: pytest.CaptureFixture[str]
) -> None:
    data, refs = _write_study(tmp_path)
    out = tmp_path / "out"
    code = main(
        [
            "correlate",
            str(data),
            "--candidate-col",
            "text",
            "--id-col",
            "cap_id",
            "--item-col",
            "IMG",
            "--system-col",
            "SYS",
            "--human-cols",
            "P",
            "R",
            "Total",
            "--metric-cols",
            "mymetric",
            "--references",
            str(refs),
            "--ref-item-col",
            "image",
            "--ref-text-col",
            "caption",
            "--where",
            "SYS != 'Human'",
            "--metrics",
            "bleu4",
            "cider",
            "--bootstrap",
            "40",
            "--permutations",
            "40",
            "--out",
            str(out),
            "--cache-dir",
            str(tmp_path / "cache"),
        ]
    )
    assert code == 0
    study = json.loads((out / "correlate.json").read_text())
    assert study["criteria"] == ["P", "R", "Total"]  # each human column its own criterion, not pooled judges
    assert study["metrics"] == ["mymetric", "bleu4", "cider"]  # no other numeric column became a metric
    assert study["n_rows"] == 36 and study["n_items"] == 12 and study["n_systems"] == 3
    seg = study["segment"]["P"]["cider"]["kendall_c"]
    assert -1 <= seg["value"] <= 1 and seg["ci_low"] <= seg["value"] <= seg["ci_high"]
    assert seg["n_items"] == 12 and isinstance(seg["p_value"], float)
    assert set(study["segment"]["P"]["bleu4"]) == {"kendall_c", "kendall_b", "spearman", "pearson"}
    sys_level = study["system"]["Total"]["mymetric"]["pearson"]
    assert sys_level["n"] == 3 and "exact" in sys_level["p_method"] and sys_level["p_value"] >= 1 / 6
    assert study["item"]["R"]["cider"]["kendall_b"]["n"] <= 12
    comps = study["comparisons"]["P"]["kendall_c"]
    assert [(c["a"], c["b"]) for c in comps] == [
        ("mymetric", "bleu4"),
        ("mymetric", "cider"),
        ("bleu4", "cider"),
    ]
    assert all(c["p_williams"] is not None for c in study["comparisons"]["P"]["pearson"])
    md = (out / "correlate.md").read_text()
    assert "| Metric | P | R | Total |" in md and "over all 48 rows of the file (--idf-over all)" in md
    assert "36 of 48 selected by --where" in md and "Williams" in md
    for png in ("scatter.png", "forest.png", "significance.png"):
        assert (out / png).stat().st_size > 0, png

    # CIDEr's document frequencies: over the whole file by default, over the selection on request
    sel = tmp_path / "sel"
    assert (
        main(
            [
                "correlate",
                str(data),
                "--candidate-col",
                "text",
                "--item-col",
                "IMG",
                "--human-cols",
                "P",
                "--references",
                str(refs),
                "--ref-item-col",
                "image",
                "--ref-text-col",
                "caption",
                "--where",
                "SYS != 'Human'",
                "--metrics",
                "cider",
                "--idf-over",
                "selected",
                "--bootstrap",
                "0",
                "--permutations",
                "0",
                "--no-plots",
                "--out",
                str(sel),
                "--cache-dir",
                str(tmp_path / "cache"),
            ]
        )
        == 0
    )
    other = json.loads((sel / "correlate.json").read_text())["segment"]["P"]["cider"]["pearson"]["value"]
    assert other != pytest.approx(study["segment"]["P"]["cider"]["pearson"]["value"], abs=1e-6)
    assert "selected rows only" in (sel / "correlate.md").read_text()
    capsys.readouterr()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["--candidate-col", "caption"],
            "no column 'caption' (--candidate-col); its columns are: cap_id, IMG, SYS",
        ),
        (["--human-cols", "Precision"], "no column 'Precision' (--human-cols Precision)"),
        (["--candidate-col", "P"], "holds numbers, not captions"),
        (["--where", "SYS == 'nobody'"], "selects no rows"),
        (["--where", "SYS ==="], "--where 'SYS ===' failed"),
        (["--id-col", "IMG"], "not unique"),
        (["--metric-cols", "P", "--where", "SYS == 'good'", "--human-cols", "R"], "constant"),
    ],
)
def test_correlate_errors_are_clear(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    data, refs = _write_study(tmp_path, n_images=4)
    args = [
        "correlate",
        str(data),
        "--human-cols",
        "Total",
        "--metric-cols",
        "mymetric",
        "--bootstrap",
        "0",
        "--permutations",
        "0",
        "--no-plots",
        "--out",
        str(tmp_path / "o"),
    ]
    if "--human-cols" in extra:
        args = args[:2] + args[4:]
    assert main([*args, *extra]) == 2
    assert message in capsys.readouterr().err


def test_correlate_refuses_missing_inputs_before_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data, refs = _write_study(tmp_path, n_images=2)
    assert main(["correlate", str(data), "--metric-cols", "mymetric"]) == 2
    assert "--human-cols" in capsys.readouterr().err
    assert main(["correlate", str(data), "--human-cols", "P", "--metrics", "cider"]) == 2
    assert "--candidate-col" in capsys.readouterr().err
    assert (
        main(
            [
                "correlate",
                str(data),
                "--human-cols",
                "P",
                "--candidate-col",
                "text",
                "--item-col",
                "IMG",
                "--references",
                str(refs),
                "--ref-item-col",
                "img",
                "--ref-text-col",
                "caption",
                "--metrics",
                "cider",
            ]
        )
        == 2
    )
    assert "no column 'img' (--ref-item-col)" in capsys.readouterr().err


def test_formats_jsonl_and_parquet_and_reference_lists(tmp_path: Path) -> None:
    data, _ = _write_study(tmp_path, n_images=6)
    df = pd.read_csv(data)
    df["refs"] = [["a dog", "a cat"]] * len(df)
    for path in (tmp_path / "j.jsonl", tmp_path / "j.parquet"):
        if path.suffix == ".jsonl":
            df.to_json(path, orient="records", lines=True)
        else:
            df.to_parquet(path)
        out = tmp_path / path.suffix[1:]
        assert (
            main(
                [
                    "correlate",
                    str(path),
                    "--judge-cols",
                    "P",
                    "R",
                    "--metric-cols",
                    "mymetric",
                    "--item-col",
                    "IMG",
                    "--bootstrap",
                    "20",
                    "--permutations",
                    "0",
                    "--no-plots",
                    "--out",
                    str(out),
                ]
            )
            == 0
        )
        study = json.loads((out / "correlate.json").read_text())
        seg = study["segment"]["human"]["mymetric"]["kendall_c"]
        assert seg["n"] == 2 * len(df) and seg["n_units"] == len(df) and seg["n_items"] == 6


def test_json_lines_named_json_are_read_by_content_and_format_overrides(tmp_path: Path) -> None:
    """Published judgment releases ship one object a line under a ``.json`` name."""
    data, refs = _write_study(tmp_path, n_images=4)
    judged, ref_json = tmp_path / "judged.json", tmp_path / "refs.json"
    judged.write_text(pd.read_csv(data).to_json(orient="records", lines=True))
    ref_json.write_text(refs.read_text())  # JSON lines under a .json name
    argv = ["correlate", str(judged), "--id-col", "cap_id", "--item-col", "IMG", "--human-cols", "P"]
    argv += ["--metric-cols", "mymetric", "--references", str(ref_json), "--ref-item-col", "image"]
    argv += ["--ref-text-col", "caption", "--bootstrap", "0", "--permutations", "0", "--no-plots"]
    assert main([*argv, "--out", str(tmp_path / "out")]) == 0
    assert json.loads((tmp_path / "out" / "correlate.json").read_text())["n_rows"] == 16
    array = tmp_path / "judged.jsonl"  # and one JSON array, pretty-printed, under a .jsonl name
    array.write_text(json.dumps(pd.read_csv(data).to_dict(orient="records"), indent=1))
    argv[1] = str(array)
    assert main([*argv, "--out", str(tmp_path / "again")]) == 0
    assert main([*argv, "--format", "jsonl", "--out", str(tmp_path / "forced")]) == 2  # the override rules
