"""Versions that run another version's stages on the CPU say so: their CPU profiles time the same code.
(The helper's own cases are in test_baseline.py, where CI's mutation run sees them.)"""
import json

import pytest

from app.analysis.baseline import stages_ran
from app.kernel.cli import main
from app.kernel.plan import get_plan_class, kernels, same_cpu_code

SMALL = ["--points", "2000", "--polygons", "200", "--device", "cpu", "--bench_runs", "5", "--warmup", "1"]


@pytest.fixture(scope="module")
def profiles(tmp_path_factory):
    out = tmp_path_factory.mktemp("cpu_stages")
    for version in ("v1", "v2", "v4"):
        assert main(["join", version, *SMALL, "--out", str(out)]) == 0
    return {v: next(out.glob(f"profiles/event/join/{v}_*/*")) for v in ("v1", "v2", "v4")}


def _trace(d):
    return json.loads((d / "trace.json").read_text())


def test_the_trace_and_the_report_say_which_versions_stages_ran(profiles):
    assert [get_plan_class("join", v).cpu_stages_of for v in ("v1", "v2", "v3", "v4")] == [None, None, "v1", "v1"]
    v1, v4 = _trace(profiles["v1"]), _trace(profiles["v4"])
    assert v4["metadata"]["cpu_stages_of"] == "v1" and "cpu_stages_of" not in v1["metadata"]
    assert (stages_ran(v1), stages_ran(v4)) == ("v1", "v1")
    head = (profiles["v4"] / "report.md").read_text().splitlines()[2]
    assert ("On the CPU, join v4 runs v1's stages (the versions differ in their GPU kernels only), so this profile "
            "times the same code as join v1 on the CPU.") in head
    assert "runs v1's stages" not in (profiles["v1"] / "report.md").read_text()


def test_compare_warns_that_two_versions_timed_the_same_code(profiles, capsys):
    capsys.readouterr()
    assert main(["compare", str(profiles["v1"]), str(profiles["v4"]), "--force"]) in (0, 1)
    out = capsys.readouterr().out
    assert ("on the CPU v1 and v4 both run v1's stages (the versions differ in their GPU kernels only): these "
            "profiles time the same code, so a difference between them is not the versions'") in out
    assert main(["compare", str(profiles["v1"]), str(profiles["v2"]), "--force"]) in (0, 1)
    assert "time the same code" not in capsys.readouterr().out          # v2 runs its own stages on the CPU


def test_the_versions_that_share_cpu_code_are_grouped_by_the_stages_they_run():
    assert same_cpu_code("join", sorted(kernels()["join"])) == {"v1": ["v1", "v3", "v4", "v5"]}
    assert same_cpu_code("join", ["v2", "v4"]) == {} and same_cpu_code("join", ["v3", "v4"]) == {"v1": ["v3", "v4"]}
    # v4 differs from v3 only in its GPU filter's launches: on the CPU it runs v3's stages
    assert same_cpu_code("overlay", sorted(kernels()["overlay"])) == {"v3": ["v3", "v4"]}

