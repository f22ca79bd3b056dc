"""--graph: the size tape that lets a run be captured without reading the device, what keeps a stage out
of a replay, and (on a GPU) a real capture whose replay must give the eager run's output."""
import json

import numpy as np
import pytest

from app.kernel.cli import main
from app.runtime.graph import build_stages, replay_blockers
from app.runtime.recorder import RunRecord, SizeTape, StageContext


def _ctx(name, tape):
    return StageContext(name, "x", "cpu", np, tape=tape)


def test_a_tape_hands_back_each_stages_sizes_in_order_and_refuses_a_different_order():
    tape = SizeTape()
    _ctx("filter", tape).read_size(np.array([3, 7]), "pairs")
    _ctx("sort", tape).read_size(np.array([5]), "hits")
    tape.replay()
    first = _ctx("filter", tape)
    assert first.read_size(None, "pairs").tolist() == [3, 7]        # no device array is touched
    assert first.size_reads == ["pairs"] and first.d2h_copies == 0
    with pytest.raises(RuntimeError, match="filter reads a size where the eager run read sort.s"):
        _ctx("filter", tape).read_size(None, "pairs")


def test_the_build_runs_eagerly_and_a_stage_with_other_host_reads_blocks_the_replay():
    def stage(name, h2d=0, syncs=0, reads=0):
        return {"name": name, "counters": {"h2d_copies": h2d, "syncs": syncs, "allocation_size_reads": reads}}
    ok = RunRecord([stage("build", h2d=4), stage("bounds", syncs=1, reads=1), stage("sort")], 1.0, 1.0)
    assert build_stages(ok) == 1 and replay_blockers(ok, 1) == []
    bad = RunRecord([stage("build", h2d=4), stage("refine", syncs=2, reads=1), stage("late", h2d=1)], 1.0, 1.0)
    assert replay_blockers(bad, 1) == ["refine: 1 host read(s) other than sizes", "late: copies host data in after "
                                                                                   "the build"]


@pytest.mark.gpu
@pytest.mark.parametrize("args", [["join", "v1", "--points", "20k", "--polygons", "2k"],
                                  ["join", "v2", "--points", "20k", "--polygons", "2k"],
                                  ["join", "v3", "--points", "20k", "--polygons", "2k"],
                                  ["overlay", "v2", "--left", "2k", "--right", "2k"],
                                  ["overlay", "v3", "--left", "2k", "--right", "2k"],
                                  ["overlay", "v4", "--left", "2k", "--right", "2k"]])
def test_graph_replay_gives_the_eager_output_and_both_times(tmp_path, args):
    assert main([*args, "--device", "gpu", "--bench_runs", "5", "--graph", "--out", str(tmp_path)]) == 0
    (d,) = list(tmp_path.glob("profiles/event/*/*/*"))
    trace = json.loads((d / "trace.json").read_text())
    graph = trace["timing"]["graph"]
    assert graph["capturable"] is False                     # the build copies host arrays in
    # v3 and v4 read nothing before the result's length: the stages after the build capture as they are.
    assert graph["after_build"] is (args[1] in ("v3", "v4")), graph["why"]
    replay = graph["replay"]
    assert replay["replayed"] is True, replay["why"]
    reads = sum(s["metadata"]["allocation_size_reads"] for s in trace["stages"])
    assert replay["size_reads_replayed"] == reads > 0 and replay["runs"] == 5
    # Both kernels read their result's length after their last launch: a timed replay reads it too, as eager runs do.
    assert replay["result_reads_in_replay"] == 1
    assert "each replay timed with its read of the result's length" in replay["why"]
    assert "each timed from the end of its own build, as the profile's runs are" in replay["why"]
    # warmed as the profile's runs are (the profile's --warmup, auto here), and the report says how many pairs
    assert replay["warmup"]["runs"] >= 1 and f"after {replay['warmup']['runs']} warm-up pairs" in replay["why"]
    assert replay["stages"] == [s["name"] for s in trace["stages"][1:]]
    assert 0 < replay["graph_after_build_seconds"] and 0 < replay["eager_after_build_seconds"]
    assert "graph replay vs eager, after the build" in (d / "report.md").read_text()
