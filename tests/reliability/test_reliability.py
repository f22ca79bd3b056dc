"""Every bad-input case of docs/reliability.md is handled: one line, non-zero, nothing written."""
import pytest

from app.runtime.device import probe_gpu
from tests.reliability.cases import CASES, run_case


@pytest.mark.parametrize("case", CASES, ids=[f"{c.cls}: {c.name}" for c in CASES])
def test_case_is_handled(case):
    if case.cls.startswith("GPU asked for") and probe_gpu()[0] and "on the CPU" not in case.name:
        pytest.skip("a GPU is usable here")
    ok, what = run_case(case)
    assert ok, what
