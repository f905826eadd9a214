"""The command line as a user runs it: bad lines go to the errors file, the rest is scored."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from qace.cli import main
from tests.helpers import kill_in_chunk


def test_score_command_reports_bad_lines_and_scores_the_rest(test_models_dir, tmp_path, capsys):
    good = {
        "id": "a",
        "image_id": "i",
        "caption": "a girl runs on the beach",
        "references": ["a girl on sand"],
    }
    lines = [
        json.dumps(good).encode(),
        b'{"id": "broken", "caption": ',
        json.dumps({**good, "id": "b"}).encode()[:-2] + b'\xff"}',
        json.dumps({**good, "id": "c", "references": []}).encode(),
        json.dumps({**good, "id": "a"}).encode(),
        json.dumps({**good, "id": "d"}).encode(),
    ]
    source = tmp_path / "in.jsonl"
    source.write_bytes(b"\n".join(lines) + b"\n")
    out = tmp_path / "out.jsonl"
    code = main(["score", str(source), "--models", str(test_models_dir), "-o", str(out), "--no-progress"])
    assert code == 0
    printed = capsys.readouterr()
    assert "scored 2 captions (4 errors" in printed.out
    assert "MEAN NOTHING" in printed.err
    assert [json.loads(line)["id"] for line in out.open()] == ["a", "d"]
    errors = [json.loads(line) for line in (tmp_path / "out.errors.jsonl").open()]
    assert len(errors) == 4
    assert all(e["reason"] for e in errors)
    # each is logged by its id, or as without one ("broken" cannot be read, so its id is not known)
    assert "record without an id: line 2: malformed JSON" in printed.err
    assert "record c: line 4: references is an empty list" in printed.err
    assert "record None" not in printed.err


def test_missing_models_exit_with_a_clear_message(tmp_path, capsys):
    code = main(
        [
            "score",
            str(tmp_path / "x.jsonl"),
            "--models",
            str(tmp_path / "none"),
            "-o",
            str(tmp_path / "o.jsonl"),
        ]
    )
    assert code == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize("args", [["--version"]])
def test_version(args, capsys):
    with pytest.raises(SystemExit):
        main(args)
    assert "qace" in capsys.readouterr().out


def test_cli_works_without_an_optional_extra(monkeypatch, capsys):
    """Without Ray (an extra), `qace score-ray` stays listed and answers how to install it; every other
    command still parses."""
    import sys

    from qace.cli import build_parser

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    assert {"score", "serve", "score-ray"} <= set(commands)
    assert parser.parse_args(["score", "in.jsonl", "-o", "out.jsonl"]).command == "score"
    assert main(["score-ray", "in.parquet", "-o", "out", "--actors", "2"]) == 2
    assert "pip install 'qace[ray]'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("module", "argv", "extra"),
    [
        ("onnxruntime", ["export", "models"], "onnx"),
        ("onnx", ["export", "--help"], "onnx"),
        ("fastapi", ["serve", "--port", "9000"], "serve"),
        ("ray", ["score-ray", "in.parquet", "-o", "out"], "ray"),
        ("diffusers", ["score", "in.jsonl", "-o", "out.jsonl", "--metric", "regen"], "judges"),
        ("PIL", ["score", "in.jsonl", "-o", "out.jsonl", "--metric", "visce2"], "judges"),
    ],
)
def test_a_missing_extra_keeps_its_command_and_names_the_install_line(
    monkeypatch, capsys, module, argv, extra
):
    import sys

    monkeypatch.setitem(sys.modules, module, None)  # as if the extra were not installed
    with pytest.raises(SystemExit):
        main(["--help"])
    assert argv[0] in capsys.readouterr().out  # still listed
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"pip install 'qace[{extra}]'" in err and f"no module {module}" in err


def _fast_refusal(argv: list[str], cwd) -> tuple[int, str, list[str]]:
    """Run ``qace argv`` in a fresh interpreter: exit code, stderr and the heavy modules it imported
    (none means no model loaded: what makes a refusal fast, whatever the machine's load)."""
    import subprocess
    import sys
    from pathlib import Path

    probe = (
        "import sys\n"
        "from qace.cli import main\n"
        "code = main(sys.argv[1:])\n"
        "print(sorted(m for m in ('torch', 'transformers', 'spacy') if m in sys.modules))\n"
        "sys.exit(code)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run(
        [sys.executable, "-c", probe, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )
    return (
        done.returncode,
        done.stderr,
        json.loads(done.stdout.splitlines()[-1].replace("'", '"')),
    )


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--variant", "img"], "needs region features: pass --features"),
        (["--metric", "qace-img"], "needs region features: pass --features"),
        (["--device", "tpu"], "--device 'tpu' is not a device qace runs on"),
        (["--device", "cuda"], "--device cuda: no CUDA GPU is visible here"),
        (["-o", "blocker/out.jsonl"], "'blocker' is a file, not a folder"),
        (["-o", "blocker/deeper/out.jsonl"], "'blocker' is a file, not a folder"),
        (["-o", "."], "is a folder; give a file in it"),
        (["-o", "/proc/out.jsonl"], "cannot write output '/proc/out.jsonl': '/proc' takes no new files"),
    ],
)
def test_bad_arguments_answer_at_once_before_any_model_loads(flags, message, test_models_dir, tmp_path):
    if "cuda" in flags and any(os.path.exists(p) for p in ("/dev/nvidiactl", "/proc/driver/nvidia")):
        pytest.skip("this host may have a GPU")
    if any(flag.startswith("/proc/") for flag in flags) and not os.path.isdir("/proc/self"):
        pytest.skip("no /proc here")
    (tmp_path / "in.jsonl").write_text(
        '{"id": "a", "image_id": "x", "caption": "a dog", "references": ["a dog"]}\n'
    )
    (tmp_path / "blocker").write_text("a file where a folder is expected")
    argv = ["score", "in.jsonl", "-o", "out.jsonl", "--models", str(test_models_dir), "--no-progress", *flags]
    code, err, imported = _fast_refusal(argv, tmp_path)
    assert code == 2 and message in err and "Traceback" not in err
    assert imported == [], f"loaded {imported} before refusing"


@pytest.mark.parametrize(
    ("source", "flags", "message"),
    [
        ("missing.jsonl", [], "input file 'missing.jsonl' does not exist"),
        ("folder", [], "input 'folder' is a folder; give the file of records in it"),
        ("no_caption.csv", [], "has no 'caption' column"),
        ("broken.json", [], "cannot read COCO results 'broken.json'"),
        ("in.jsonl", ["--references", "missing.json"], "cannot read references file 'missing.json'"),
        ("in.jsonl", ["--variant", "img", "--features", "nope.h5"], "--features 'nope.h5' does not exist"),
        ("in.jsonl", ["--models", "missing"], "--models 'missing' does not exist"),
    ],
)
def test_bad_paths_answer_at_once_and_leave_nothing(source, flags, message, test_models_dir, tmp_path):
    """Every path is checked before any model loads: exit 2, one line, no output or .partial left,
    so the corrected rerun is not refused."""
    (tmp_path / "in.jsonl").write_text('{"id": "a", "image_id": "x", "caption": "a", "references": ["a"]}\n')
    (tmp_path / "folder").mkdir()
    (tmp_path / "no_caption.csv").write_text("id,text\n1,a dog\n")
    (tmp_path / "broken.json").write_text('[{"image_id": 1, "caption": "a dog"')
    before = sorted(tmp_path.iterdir())
    argv = ["score", source, "-o", "out.jsonl", "--no-progress", "--models", str(test_models_dir), *flags]
    code, err, imported = _fast_refusal(argv, tmp_path)
    assert code == 2 and message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert imported == [], f"loaded {imported} before refusing"
    assert sorted(tmp_path.iterdir()) == before


def test_resume_in_other_chunks_is_refused_before_any_model_loads(test_models_dir, tmp_path, monkeypatch):
    """A killed run's partial output goes on only in its own chunk size: another --chunk-size is refused
    at once (it was refused after the models had loaded), and none given takes the partial's."""
    from qace.api import QACE
    from qace.demo import example_path

    scorer = QACE(models=test_models_dir, variant="ref", progress=False, chunk_size=3)
    scorer.score_file(example_path(), tmp_path / "whole.jsonl")
    kill_in_chunk(monkeypatch, 2)  # the first chunk is committed
    with pytest.raises(KeyboardInterrupt):
        scorer.score_file(example_path(), tmp_path / "out.jsonl")
    monkeypatch.undo()
    argv = ["score", str(example_path()), "-o", "out.jsonl", "--resume", "--models", str(test_models_dir),
            "--no-progress"]  # fmt: skip
    code, err, imported = _fast_refusal([*argv, "--chunk-size", "5"], tmp_path)
    assert code == 2 and "was written with --chunk-size 3 but this run has 5" in err and imported == []
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 0
    assert (tmp_path / "out.jsonl").read_bytes() == (tmp_path / "whole.jsonl").read_bytes()


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root may write anywhere")
def test_an_output_folder_that_cannot_be_written_answers_at_once(test_models_dir, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    (tmp_path / "in.jsonl").write_text('{"id": "a", "caption": "a dog", "references": ["a dog"]}\n')
    argv = ["score", "in.jsonl", "-o", "locked/out.jsonl", "--models", str(test_models_dir)]
    try:
        code, err, imported = _fast_refusal(argv, tmp_path)
    finally:
        locked.chmod(0o700)
    assert code == 2 and "no permission to write in" in err and imported == []


@pytest.mark.parametrize("store", ["hdf5", "npz"])
def test_corrupt_feature_files_are_per_record_errors(store, test_models_dir, tmp_path, capsys):
    """A damaged HDF5 chunk or .npz costs its captions only; the run (and a resumed one) goes on."""
    from tests.corrupt_files import damaged_compressed_npz, features, hdf5_with_damaged_row, truncated_npz

    if store == "hdf5":
        where = hdf5_with_damaged_row(tmp_path / "f.h5", ["good", "bad", "worse"], damaged="bad")
    else:
        where = tmp_path / "npz"
        where.mkdir()
        np.savez(where / "good.npz", **features("good"))
        truncated_npz(where / "bad.npz", "bad")
        damaged_compressed_npz(where / "worse.npz", "worse")
    images = {"1": "good", "2": "bad", "3": "good", "4": "worse" if store == "npz" else "good"}
    source = tmp_path / "in.jsonl"
    source.write_text(
        "".join(
            json.dumps({"id": i, "image_id": m, "caption": "a dog runs"}) + "\n" for i, m in images.items()
        )
    )
    out = tmp_path / "out.jsonl"
    argv = ["score", str(source), "-o", str(out), "--models", str(test_models_dir), "--variant", "img"]
    argv += ["--features", str(where), "--no-progress", "--chunk-size", "2"]
    assert main(argv) == 0
    bad = {"2", "4"} if store == "npz" else {"2"}
    assert [json.loads(line)["id"] for line in out.open()] == [i for i in images if i not in bad]
    errors = {e["id"]: e["reason"] for e in map(json.loads, (tmp_path / "out.errors.jsonl").open())}
    assert set(errors) == bad and all("image '" in reason for reason in errors.values())
    assert main([*argv, "--resume"]) == 0  # listed errors count as done: nothing is read again
    assert "scored 0 captions (0 errors, 4 already done)" in capsys.readouterr().out


def test_features_pack_lists_bad_images_and_packs_the_rest(tmp_path, capsys):
    from tests.corrupt_files import features, truncated_npz

    source = tmp_path / "npz"
    source.mkdir()
    np.savez(source / "a.npz", **features("a"))
    truncated_npz(source / "b.npz", "b")
    (source / "c.npz").write_text("plain text")
    np.savez(source / "d.npz", features=np.full((36, 2048), 1e6), norm_bb=np.zeros((36, 6)))
    out = tmp_path / "f.h5"
    assert main(["features", "pack", str(source), str(out)]) == 0
    printed = capsys.readouterr()
    assert "packed 1 images" in printed.out and "3 image(s) left out" in printed.out
    assert "image 'b'" in printed.err and "image 'c'" in printed.err and "not an .npz file" in printed.err
    assert "pickled" not in printed.err and "--dtype float32" in printed.err
    assert main(["features", "pack", str(source), str(out), "--dtype", "float32"]) == 0
    assert "packed 2 images" in capsys.readouterr().out


def test_references_format_overrides_what_the_content_says(tmp_path, test_models_dir):
    """#37.10: ``--references-format`` reads a references file as said; without it, by its content."""
    import json

    from qace.cli import main

    results = tmp_path / "results.json"
    results.write_text(json.dumps([{"image_id": 1, "caption": "a dog runs on the grass"}]))
    refs = tmp_path / "refs.json"  # JSON lines under a .json name
    refs.write_text(json.dumps({"image_id": 1, "caption": "a brown dog runs"}) + "\n")
    base = ["score", str(results), "--references", str(refs), "--models", str(test_models_dir)]
    base += ["--device", "cpu", "--no-progress"]
    assert main([*base, "-o", str(tmp_path / "a.jsonl"), "--references-format", "jsonl"]) == 0
    assert main([*base, "-o", str(tmp_path / "b.jsonl")]) == 0  # sniffed: the same rows
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    assert main([*base, "-o", str(tmp_path / "c.jsonl"), "--references-format", "json"]) == 2
    assert not (tmp_path / "c.jsonl").exists()
