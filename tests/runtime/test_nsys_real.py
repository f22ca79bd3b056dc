"""nsys mode for real: the plan traced by nsys and by the CUPTI backend on the lent GPU.

Skips where there is no GPU (CI); on the GPU machine nsys must be found (the
README says how), so a missing nsys fails rather than hides.
"""
import json

import pytest

from app.kernel.cli import main

pytestmark = [pytest.mark.gpu, pytest.mark.nsys]
SMALL = {"join": ["--points", "20000", "--polygons", "2000"], "overlay": ["--left", "2000", "--right", "2000"]}


def _profile(tmp_path, kernel, *extra):
    out = tmp_path / "out"
    assert main([kernel, *SMALL[kernel], "--prof_type", "nsys", "--bench_runs", "3", "--out", str(out), *extra]) == 0
    (d,) = list(out.glob(f"profiles/nsys/{kernel}/*/*"))
    return d, json.loads((d / "trace.json").read_text())


@pytest.mark.parametrize("kernel", ["join", "overlay"])
@pytest.mark.parametrize("backend", ["nsys", "cupti"])
def test_every_microsecond_accounted(tmp_path, kernel, backend):
    d, trace = _profile(tmp_path, kernel, "--backend", backend)
    names = {p.name for p in d.iterdir()}
    assert {"report.md", "trace.json", "params.json", "timeline.png", "timeline.json", "timeline_ranges.csv"} <= names
    assert ("profile.nsys-rep" in names and "profile.sqlite" in names) if backend == "nsys" else "cupti_records.json" in names
    assert trace["timing"]["timed_runs"] == 3
    assert trace["metadata"]["verification"]["matches"]
    for s in trace["stages"]:
        t = s["timeline"]
        assert t["instances"] == 3
        assert t["ops"] > 0, s["name"]                          # every stage launched GPU work it owns
        assert t["accounting_max_error_pct"] <= 2.0
        assert t["busy_us"] <= t["span_us"] + 1e-6
    it = trace["metadata"]["iteration"]
    assert it["busy_us"] > 0 and sum(it["idle_us"].values()) > 0
    events = json.loads((d / "timeline.json").read_text())["traceEvents"]
    assert any(e.get("cat") == "kernel" for e in events) and any(e.get("name") == "bounds" or
                                                                 e.get("name") == "segment_extraction" for e in events)
    report = (d / "report.md").read_text()
    for heading in ("## Stages", "**Bottleneck:**", "## Top 3 Opportunities", "## Wall-time accounting",
                    "## Event time vs span vs GPU busy", "## Audit", "What forces this plan"):
        assert heading in report
    if backend == "cupti":
        assert trace["metadata"]["tool"]["overhead"]["overhead_pct"] is not None
        # CUPTI's set-up is paid by discarded traced iterations before the first reported one: their kernels
        # are in the records, before the first profile range and outside every range.
        from app.runtime.profiling.worker import CUPTI_WARM_RUNS

        rec = json.loads((d / "cupti_records.json").read_text())
        profiles = sorted(r[2] for r in rec["ranges"] if r[0] == "profile")
        assert len(profiles) == 3
        first = profiles[0]
        plan_kernels = [o for o in rec["ops"] if o[2] == "kernel" and "launch_pace" not in o[3]]
        per_iteration = sum(1 for o in plan_kernels if first <= o[0] < profiles[1])
        before = sum(1 for o in plan_kernels if o[0] < first)
        assert per_iteration > 0 and before >= CUPTI_WARM_RUNS * per_iteration
    # The host's paces, timed before each traced iteration, with the same figures as event mode's.
    for key in ("host_pace", "launch_pace"):
        p = trace["timing"][key]
        assert p["runs"] == 3 and all(0 < t < 0.01 for t in p["samples"]), key
    assert "| host launch pace before each traced iteration (an empty kernel, us a launch) |" in report
    # The pace's launches ran between the iterations, outside every range: the timeline shows them there.
    kernels = {e["name"] for e in events if e.get("cat") == "kernel"}
    assert "launch_pace_nop" in kernels


def test_timeline_command_on_a_real_capture(tmp_path, capsys):
    d, trace = _profile(tmp_path, "join")
    capsys.readouterr()
    assert main(["timeline", str(d / "profile.nsys-rep"), "--domain", "join", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    by = {r["name"]: r for r in doc["ranges"]}
    assert by["profile"]["instances"] == 3
    assert by["bounds"]["span_us"] == pytest.approx(trace["stages"][1]["elapsed_seconds"] * 1e6, rel=1e-6)
