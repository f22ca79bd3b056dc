import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
FIXTURES = Path(os.environ.get("APP_FIXTURES", ROOT.parent / "shared" / "fixtures"))


def pytest_collection_modifyitems(config, items):
    from app.runtime.device import probe_gpu

    usable, why, _ = probe_gpu()
    if usable:
        return
    skip = pytest.mark.skip(reason=f"needs a GPU: {why}")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _isolated_lock_dir(tmp_path, monkeypatch):
    # Tests must not collide with a real profile's lock on this machine.
    monkeypatch.setenv("APP_LOCK_DIR", str(tmp_path))


DEVICES = ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)]
