"""qace report: the page in headless Chromium (table, sorting, search, expansion, compare mode,
VisCE² and regeneration rows), the summary figures, and errors on bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from qace.cli import main
from qace.demo import example_path
from qace.errors import ConfigError, InputError
from qace.report.page import build_report
from qace.report.stats import paired_difference
from qace.signature import Signature
from tests.report.browser import run_page

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"

TABLE = """
  const items = () => [...document.querySelectorAll("#table tbody tr.item")];
  const heads = () => [...document.querySelectorAll("#table thead th")];
  const column = (name) => heads().findIndex((th) => th.textContent === name);
  const cells = (name) => items().map((r) => r.children[column(name)].textContent);
  const ids = () => items().map((r) => r.dataset.id);
  const type = (text) => {
    const box = document.getElementById("search");
    box.value = text;
    box.dispatchEvent(new Event("input"));
  };
  const detail = () => document.querySelector("#table tr.detail");
"""


@pytest.fixture(scope="module")
def scored(test_models_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled example scored with QACE-Ref and --explain (one record is an error)."""
    from qace.api import QACE

    out = tmp_path_factory.mktemp("scores") / "example.ref.jsonl"
    QACE(models=test_models_dir, explain=True, progress=False).score_file(example_path(), out)
    return out


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.open()]


def test_single_report_in_chromium(scored: Path, tmp_path: Path) -> None:
    page = tmp_path / "report.html"
    assert main(["report", str(scored), "-o", str(page), "--input", str(example_path())]) == 0
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "report-single.png"
    result = run_page(
        page,
        "() => {"
        + TABLE
        + """
        const out = {worst: ids(), scores: cells("qace")};
        document.getElementById("order-best").click();
        out.best = ids();
        document.querySelector("#table thead th").click();  // the id column
        out.byId = ids();
        document.getElementById("order-worst").click();
        type("DOG");
        out.filtered = ids();
        out.count = document.getElementById("count").textContent;
        items()[0].click();
        out.detail = detail() ? detail().textContent : null;
        out.questionRows = detail() ? detail().querySelectorAll("table.questions tr").length : -1;
        return out; }""",
        screenshot=shot,
    )
    rows = _rows(scored)
    assert result["errors"] == [] and "exception" not in result
    by_score = sorted(rows, key=lambda r: r["qace"])  # stable, as the page's sort
    assert result["worst"] == [r["id"] for r in by_score]
    assert result["best"] == [r["id"] for r in sorted(rows, key=lambda r: -r["qace"])]
    assert result["byId"] == sorted(r["id"] for r in rows)
    assert [float(s) for s in result["scores"]] == pytest.approx([r["qace"] for r in by_score], abs=5e-4)
    dogs = [r["id"] for r in by_score if "dog" in (r["explanation"]["caption"] + r["image_id"]).lower()]
    assert len(dogs) >= 2 and result["filtered"] == dogs
    assert result["count"].startswith(f"showing {len(dogs)} of {len(dogs)}")
    first = next(r for r in rows if r["id"] == dogs[0])
    question = first["explanation"]["questions"][0]
    assert question["question"] in result["detail"]
    assert all(answer in result["detail"] for answer in question["answers_on_context"])
    assert f"F1 {question['f1'][0]:.2f}" in result["detail"]
    assert result["questionRows"] == first["n_questions"] + 1
    references = {r["id"]: r["references"] for r in _rows(example_path())}[first["id"]]
    assert all(ref in result["detail"] for ref in references)  # from --input, listed under the answers
    assert shot.stat().st_size > 10_000
    html = page.read_text()
    assert "http://" not in html and "https://" not in html.replace("https://aclanthology", "")
    assert first["signature"] in html and "1 record not scored" in html
    short = Signature.parse(first["signature"]).short()  # the settings line: no model hashes
    assert f'<p class="settings"><code>{short}</code></p>' in html and "qg:" not in short


def test_compare_report_in_chromium(scored: Path, tmp_path: Path) -> None:
    rows = _rows(scored)
    deltas = {r["id"]: (i - 5) * 0.01 for i, r in enumerate(rows)}
    deltas[rows[3]["id"]] = 0.3  # the biggest disagreement
    attack = "</script><script>window.__pwned = 1</script><img src=x onerror=window.__pwned=2>"
    b_rows = []
    for r in rows:
        b = {**r, "qace": r["qace"] + deltas[r["id"]]}
        b["explanation"] = {
            **r["explanation"],
            "caption": attack if r is rows[0] else r["explanation"]["caption"] + " (B)",
        }
        b_rows.append(b)
    b_rows.append({**rows[0], "id": "only-in-b"})
    b_path = tmp_path / "b" / scored.name
    b_path.parent.mkdir()
    b_path.write_text("".join(json.dumps(r) + "\n" for r in b_rows))
    page = tmp_path / "compare.html"
    build_report([scored, b_path], page)
    result = run_page(
        page,
        "() => {"
        + TABLE
        + """
        const out = {order: ids(), pwned: window.__pwned === undefined ? null : window.__pwned};
        type("(B)");
        out.filtered = ids().length;
        type("");
        items()[0].click();
        out.detail = detail().textContent;
        out.summary = document.getElementById("paired").textContent;
        out.attack = [...document.querySelectorAll("#table td")].some((td) => td.textContent === ATTACK);
        return out; }""".replace("ATTACK", json.dumps(attack).replace("<", "\\u003c")),
        screenshot=ARTIFACTS / "report-compare.png",
    )
    assert result["errors"] == [] and result["pwned"] is None and result["attack"]
    want = sorted(rows, key=lambda r: -abs(deltas[r["id"]]))
    assert result["order"][0] == rows[3]["id"] and len(result["order"]) == len(rows)
    assert [abs(deltas[i]) for i in result["order"]] == [abs(deltas[r["id"]]) for r in want]
    assert result["filtered"] == len(rows) - 1
    assert "A: " in result["detail"] and "B: " in result["detail"] and "(B)" in result["detail"]
    mean = sum(deltas.values()) / len(deltas)
    assert f"{mean:+.4f}" in result["summary"] and "bootstrap CI" in result["summary"]
    assert "1 only in" in result["summary"]


def test_judge_rows_in_chromium(tmp_path: Path) -> None:
    """Regeneration rows show the original and generated images inline; VisCE² rows their texts.
    Rows have the fields the judges write (qace/judges/regen.py, visce2.py `_row`)."""
    from PIL import Image

    images = []
    for n, color in enumerate(("red", "blue", "green")):
        path = tmp_path / f"img{n}.png"
        Image.new("RGB", (256, 256), color).save(path)
        images.append(str(path))
    sig = "Regen|gen:test|enc:test|version:0.1.0"
    regen = [
        {"id": "r1", "image_id": "beach", "image": images[0], "metric": "Regen", "regen": 0.8,
         "regen_samples": [0.7, 0.9], "generated_images": images[1:], "flags": [], "signature": sig},
        {"id": "r2", "image_id": "dog", "image": str(tmp_path / "gone.png"), "metric": "Regen", "regen": 0.2,
         "regen_samples": [0.2, 0.2], "generated_images": [], "flags": ["nonfinite_image"], "signature": sig},
    ]  # fmt: skip
    captions = tmp_path / "captions.jsonl"
    captions.write_text(
        json.dumps({"id": "r1", "caption": "a red square", "image": images[0]}) + "\n"
        + json.dumps({"id": "r2", "caption": "a dog", "image": images[0]}) + "\n"
        + json.dumps({"id": "v1", "caption": "a girl on a beach", "image": images[2]}) + "\n"
    )  # fmt: skip
    regen_path = tmp_path / "regen.jsonl"
    regen_path.write_text("".join(json.dumps(r) + "\n" for r in regen))
    page = tmp_path / "regen.html"
    assert main(["report", str(regen_path), "-o", str(page), "--input", str(captions)]) == 0
    result = run_page(
        page,
        "() => {"
        + TABLE
        + """
        document.getElementById("order-best").click();
        items()[0].click();
        const imgs = [...detail().querySelectorAll("img")];
        return {caption: items()[0].children[column("caption")].textContent,
                images: imgs.map((i) => i.src.slice(0, 23)), detail: detail().textContent}; }""",
    )
    assert result["errors"] == [] and result["caption"] == "a red square"
    assert result["images"] == ["data:image/jpeg;base64,"] * 3  # original and both generated, inline
    import base64
    import io
    import re

    uris = re.findall(r"data:image/jpeg;base64,([A-Za-z0-9+/=]+)", page.read_text())
    sizes = {Image.open(io.BytesIO(base64.b64decode(u))).size for u in uris}
    assert sizes == {(160, 160)}  # thumbnails, not the 256-pixel files
    assert "generated 2 (cos 0.900)" in result["detail"]

    visce2 = {"id": "v1", "visce2": 85.0, "visce2_expected": 83.2, "visce2_raw": "Rating: 85", "flags": [],
              "context": "A beach at sunset with a girl in a red dress.", "signature": "VisCE2"}  # fmt: skip
    v_path = tmp_path / "visce2.jsonl"
    v_path.write_text(json.dumps(visce2) + "\n")
    build_report([v_path], tmp_path / "visce2.html", inputs=[captions])
    check = (
        "items()[0].click(); const d = detail();"
        " return {d: d.textContent, img: d.querySelectorAll('img').length}"
    )
    result = run_page(tmp_path / "visce2.html", "() => {" + TABLE + check + "}")
    assert "visual context" in result["d"] and "girl in a red dress" in result["d"]
    assert "Rating: 85" in result["d"] and "a girl on a beach" in result["d"]
    assert result["img"] == 1  # the judged image, from --input


def test_paired_difference() -> None:
    a = [0.1, 0.5, 0.9, 0.3]
    d = paired_difference(a, [x + 0.1 for x in a])
    assert d.mean == pytest.approx(0.1) and d.low == pytest.approx(0.1) and d.high == pytest.approx(0.1)
    assert (d.b_better, d.ties, d.a_better) == (4, 0, 0)
    noisy = paired_difference(a * 50, [x + (0.2 if i % 2 else -0.1) for i, x in enumerate(a * 50)])
    assert noisy.low < noisy.mean < noisy.high and noisy.low > 0.0  # 0.05 mean, clearly above zero
    assert paired_difference(a, a[::-1], seed=3) == paired_difference(a, a[::-1], seed=3)
    with pytest.raises(ConfigError):
        paired_difference([], [])


def test_bad_input_is_named(scored: Path, tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        build_report([tmp_path / "missing.jsonl"], tmp_path / "r.html")
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"id": "a", "qace": 0.5}\nnot json\n')
    with pytest.raises(InputError, match="line 2 is not JSON"):
        build_report([broken], tmp_path / "r.html")
    other = tmp_path / "other.jsonl"
    other.write_text(json.dumps({"id": "zzz", "qace": 0.5}) + "\n")
    with pytest.raises(InputError, match="no id in common"):
        build_report([scored, other], tmp_path / "r.html")
    visce2 = tmp_path / "v.jsonl"
    visce2.write_text(json.dumps({"id": "ex01", "visce2": 50.0}) + "\n")
    with pytest.raises(InputError, match="cannot compare qace scores"):
        build_report([scored, visce2], tmp_path / "r.html")
    assert main(["report", str(scored), str(scored), str(scored)]) == 2


def test_parquet_output_reads_like_jsonl(scored: Path, test_models_dir: Path, tmp_path: Path) -> None:
    from qace.report.load import read_rows

    pytest.importorskip("pyarrow")
    from qace.data.output import ResultWriter

    rows = _rows(scored)
    out = tmp_path / "s.parquet"
    with ResultWriter(out, signature=rows[0]["signature"]) as writer:
        for row in rows:
            writer.add(row)
    assert read_rows(out) == rows
    shutil.rmtree(tmp_path / "s.parquet.partial", ignore_errors=True)


def test_demo_ends_with_the_report(
    test_models_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert main(["demo", "--models", str(test_models_dir), "--output-dir", str(tmp_path)]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[-1] == f"report (open in a browser): {tmp_path / 'example.img.html'}"
    assert printed[-2] == f"report (open in a browser): {tmp_path / 'example.ref.html'}"
    html = (tmp_path / "example.ref.html").read_text()
    assert "A girl in a red dress running on the beach." in html and "QACE-Ref|" in html
