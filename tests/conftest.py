import gzip
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
# This project's own captures, committed with the script that made them (tests/fixtures/*/make.sh).
OWN_FIXTURES = ROOT / "tests" / "fixtures"


def child_path(src: Path = ROOT / "src") -> str:
    """PYTHONPATH for a real second process running the package in ``src`` (this checkout's): src first, what the
    path held before kept after it (where the dependencies come from a path rather than the interpreter's own
    site-packages, as on the lent GPU machines, they must reach the child too)."""
    return os.pathsep.join(p for p in (str(src), os.environ.get("PYTHONPATH")) if p)


def child_env(src: Path = ROOT / "src", **extra) -> dict:
    """This process's environment with ``child_path(src)`` as PYTHONPATH, and ``extra``."""
    return dict(os.environ, PYTHONPATH=child_path(src), **extra)


def fixture_text(rel: str) -> str:
    """A committed fixture's text, gzipped or not. A missing fixture fails the test; it never skips it."""
    path = OWN_FIXTURES / rel
    if not path.exists() and path.with_name(path.name + ".gz").exists():
        path = path.with_name(path.name + ".gz")
    if path.suffix == ".gz":
        with gzip.open(path, "rt") as f:
            return f.read()
    return path.read_text()


# Tests that use the GPU, ncu or nsys, one after another on one worker when the tests run side by side
# (pytest -n auto --dist loadgroup, the README's command): two at once would time each other's kernels.
DEVICE_MARKS = ("gpu", "ncu", "nsys")


def pytest_collection_modifyitems(config, items):
    from app.runtime.device import probe_gpu

    for item in items:
        if any(m in item.keywords for m in DEVICE_MARKS):
            item.add_marker(pytest.mark.xdist_group("device"))
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


@pytest.fixture
def own_tempdir(monkeypatch):
    """A temporary folder of the test's own as this process's temp folder, where the tool makes its folders for
    ncu and nsys: a test that counts them before and after must not count another test's, made meanwhile by a
    test running beside it (pytest -n). Short, under the real temp folder: sockets made there keep within their
    path length."""
    import shutil
    import tempfile

    path = tempfile.mkdtemp(prefix="app-test-")
    monkeypatch.setattr(tempfile, "tempdir", path)
    yield path
    shutil.rmtree(path, ignore_errors=True)


DEVICES = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]


# A real second process holding a profiling lock (app.runtime.lock.device_lock) until it is stopped.
LOCK_HOLDER = ("import sys, time\nfrom app.runtime.lock import device_lock\nwith device_lock(sys.argv[1]):\n"
               "    print('held', flush=True); time.sleep(60)\n")


@pytest.fixture
def holder():
    """Start real second processes that hold the lock of a key; yields the starter ``start(key, env=None,
    prefix=())`` (``env``: the process's environment, this one's with src/ on the path by default; ``prefix``: run
    it through, e.g. as another user, tests.users.NOBODY), and stops them at the end."""
    procs = []

    def start(key: str, env: dict | None = None, prefix: tuple = ()) -> subprocess.Popen:
        env = env if env is not None else child_env()
        p = subprocess.Popen([*prefix, sys.executable, "-c", LOCK_HOLDER, key], stdout=subprocess.PIPE, text=True,
                             env=env)
        procs.append(p)
        assert p.stdout.readline().strip() == "held"
        return p

    yield start
    for p in procs:
        p.kill()
        p.wait()
