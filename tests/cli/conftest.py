"""Fixtures shared by the tests of reading a profile back (--baseline, compare, devlog)."""
import json

import pytest

from app.kernel.cli import main

PROFILE_ARGS = ["join", "--points", "300", "--polygons", "30", "--device", "cpu", "--bench_runs", "2", "--warmup", "0"]


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    out = tmp_path_factory.mktemp("base")
    assert main([*PROFILE_ARGS, "--out", str(out)]) == 0
    (d,) = list(out.glob("profiles/event/join/*/*"))
    return json.loads((d / "trace.json").read_text())


@pytest.fixture
def no_profiling(monkeypatch):
    """Fail the test if a mode starts profiling: every refusal must come first."""
    from app.runtime.profiling.event import EventMode

    def boom(*a, **k):
        raise AssertionError("profiling started before the baseline was checked")
    monkeypatch.setattr(EventMode, "profile", boom)


def drop_a_row_of_the_join(monkeypatch):
    """The join's last stage drops its first row, as a bug would: the output no longer matches the oracle."""
    import app.kernel.join.cpu as join_cpu

    orig = join_cpu.JoinCPU.output_sort

    def dropped(self, state, st, tiling):
        orig(self, state, st, tiling)
        p, q = state["output"]
        state["output"] = (p[1:], q[1:])
    monkeypatch.setattr(join_cpu.JoinCPU, "output_sort", dropped)


@pytest.fixture
def drop_a_row(monkeypatch):
    drop_a_row_of_the_join(monkeypatch)
