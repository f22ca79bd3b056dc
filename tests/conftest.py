import gzip
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
# This project's own captures, committed with the script that made them (tests/fixtures/*/make.sh).
OWN_FIXTURES = ROOT / "tests" / "fixtures"


def fixture_text(rel: str) -> str:
    """A committed fixture's text, gzipped or not. A missing fixture fails the test; it never skips it."""
    path = OWN_FIXTURES / rel
    if not path.exists() and path.with_name(path.name + ".gz").exists():
        path = path.with_name(path.name + ".gz")
    if path.suffix == ".gz":
        with gzip.open(path, "rt") as f:
            return f.read()
    return path.read_text()


def pytest_collection_modifyitems(config, items):
    from app.runtime.device import probe_gpu

    usable, why, _ = probe_gpu()
    if usable:
        return
    skip = pytest.mark.skip(reason=f"needs a GPU: {why}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session", autouse=True)
def _session_lock_dir(tmp_path_factory):
    # Module- and session-scoped fixtures are set up before any test's own (below), and several run a real
    # profile: without this they took this machine's real device lock, so two test runs at once (or two
    # mutants tested side by side) refused each other's profile, exit 4, and a fixture failed for nothing.
    patch = pytest.MonkeyPatch()
    patch.setenv("APP_LOCK_DIR", str(tmp_path_factory.mktemp("locks")))
    yield
    patch.undo()


@pytest.fixture(autouse=True)
def _isolated_lock_dir(tmp_path, monkeypatch):
    # Tests must not collide with a real profile's lock on this machine.
    monkeypatch.setenv("APP_LOCK_DIR", str(tmp_path))


DEVICES = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]
