"""Shared fixtures. Keep this file small: one fixture per shared, expensive resource."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent

# The processes the tests start (command lines, host and spaCy processes, Ray actors, benchmark children)
# inherit this: with a test worker per core, a thread pool per process only contends for the cores (the
# test processes' own twin is `_one_torch_thread`). Set it beforehand to choose another count.
os.environ.setdefault("OMP_NUM_THREADS", "1")


# pytest-xdist (pyproject's addopts: -n auto --dist loadfile) runs the tests in one worker process per core,
# each test file in one worker, so its module fixtures are made once. The files of a group below run in one
# worker too, one after another, and before the other files, since they are long.
SERIAL_GROUPS = {
    # each starts Ray (a local cluster or `ray.init`): two Ray clusters on one host clash
    "ray": (
        "tests/benchmarks/test_scale_faults_smoke.py",
        "tests/benchmarks/test_scaling_ray_smoke.py",
        "tests/scale/test_ray_cluster.py",
        "tests/scale/test_scale_ray.py",
    ),
    # each writes the metric-score cache .qace-cache/meta (files not written atomically), the same entries
    "meta-cache": ("tests/meta/test_meta_published.py", "tests/meta/test_meta_cli.py"),
}
_GROUP_OF = {file: group for group, files in SERIAL_GROUPS.items() for file in files}


def pytest_configure(config: pytest.Config) -> None:
    missing = [f for f in _GROUP_OF if not (REPO_ROOT / f).is_file()]
    if missing:
        raise pytest.UsageError(f"tests/conftest.py SERIAL_GROUPS names files that are not there: {missing}")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto`` runs ``pytest -m gpu`` in this one process: the GPU tests share the device, and
    `benchmarks.gpu_suite` records each one's seconds alone. Otherwise xdist's default (the cores)."""
    words = (config.getoption("markexpr", "") or "").replace("(", " ").replace(")", " ").split()
    selects_gpu = any(w == "gpu" and (i == 0 or words[i - 1] != "not") for i, w in enumerate(words))
    return 0 if selects_gpu else None


@pytest.hookimpl(optionalhook=True, tryfirst=True)  # before xdist's own
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """``--dist loadfile`` with `SERIAL_GROUPS`: a group's files are one unit of work."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FileOrGroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::", 1)[0]
            return _GROUP_OF.get(file, file)

    config.option.loadscopereorder = False  # collection order: the groups first (below)
    return FileOrGroupScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):  # every worker sorts alike: the long groups start first
        items.sort(key=lambda item: item.nodeid.split("::", 1)[0] not in _GROUP_OF)
    _skip_gpu_tests_without_cuda(items)


def _skip_gpu_tests_without_cuda(items: list[pytest.Item]) -> None:
    """Tests marked ``gpu`` skip on a host without CUDA (`pytest -m gpu` selects them on a GPU host)."""
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    if not gpu_items:
        return
    import torch

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="marked gpu: needs a CUDA GPU")
        for item in gpu_items:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def test_models_dir() -> Path:
    """Tiny trained qg/tqa/vqa models, built once and cached (QACE_TEST_MODELS or .qace-cache/)."""
    from qace.testing.qace_models import make_test_models

    cache = Path(os.environ.get("QACE_TEST_MODELS") or REPO_ROOT / ".qace-cache" / "test-models")
    return make_test_models(cache)  # reuses a complete build; rebuilds a partial one


@pytest.fixture(scope="session")
def test_vlm_dir() -> Path:
    """The tiny LLaVA-style VLM (VisCE²'s judge), built once and cached (QACE_TEST_VLM or
    .qace-cache/test-vlm)."""
    from qace.testing.vlm import make_test_vlm

    return make_test_vlm(os.environ.get("QACE_TEST_VLM") or REPO_ROOT / ".qace-cache" / "test-vlm")


@pytest.fixture(scope="session")
def clip_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight CLIP (the CLIP-S family's test model), built once."""
    pytest.importorskip("PIL")
    from qace.testing.clip import make_clip_test_model

    return make_clip_test_model(tmp_path_factory.mktemp("clip"))


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread() -> None:
    """The test models are tiny: thread hand-offs cost more than they save (6x slower on 2 busy cores)."""
    import torch

    torch.set_num_threads(1)
