"""What a captured graph of the stages after the build serves: new data of the same counts.

A plan that reads no size before its result's length (join v3 and v4, overlay v3) is captured as it is, and the
profile says which inputs its graph serves. These tests hold that claim to its words on a GPU: new inputs with
the counts the graph was captured with (it holds some of them as launch arguments, and its buffers were sized
for them) are written into the device buffers the graph reads, the graph is replayed, the counts the device
found are read back with the result's length and checked against the rooms, and the result must equal
shapely's for the new inputs -- and differ from the captured inputs' result, so a graph that ignored the new
data could not pass.
"""
import numpy as np
import pytest

from app.kernel.datagen import shifted
from app.kernel.plan import get_plan_class

pytestmark = pytest.mark.gpu


def _captured(plan, inputs):
    """(backend, stream, the captured graph, the eager output on the host) for ``inputs``."""
    import cupy as cp

    from app.runtime.device import select
    from app.runtime.execute import backend_for
    from app.runtime.graph import AfterBuild

    backend, _ = backend_for(plan, select("gpu"))
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        stages, blockers = AfterBuild.from_eager_run(plan, inputs, backend, stream)
        assert not blockers and len(stages.build) == 1, blockers
        return backend, stream, stages.capture(), stages.reference


@pytest.mark.parametrize("version", ["v3", "v4"])
def test_a_join_graph_replays_new_points_and_polygons_of_the_same_counts(version):
    import cupy as cp

    from app.kernel.join.gpu import CANDIDATES, REFINE
    from app.kernel.join.plan import JoinInputs
    from app.runtime.recorder import read_to_host

    plan = get_plan_class("join", version)({"points": 20_000, "polygons": 2_000})
    inputs = plan.make_inputs()
    backend, stream, graph, ref = _captured(plan, inputs)
    state = graph.state
    rng = np.random.default_rng(7)
    lo, hi = inputs.points.min(axis=0), inputs.points.max(axis=0)
    new = JoinInputs(rng.uniform(lo, hi, inputs.points.shape), shifted(inputs.polygons, 0.3, -0.2), inputs.predicate)
    with stream:
        state["points"].set(new.points)
        state["coords"].set(new.polygons.coords)
        graph.replay()
        words = read_to_host(cp, state["ledger"]["all"])
        room = len(state["cand_pt"])
        assert int(words[CANDIDATES][0]) <= room, "the new points' candidates outgrew the room: pick other data"
        hits = int(words[REFINE][0])
        pt, poly = (a[:hits].get() for a in state["sorted_pairs"])
    check = plan.verify(new, (pt, poly))
    assert check["matches"], check
    assert check["pairs"] > 0 and not (len(pt) == len(ref[0]) and np.array_equal(pt, ref[0]))


@pytest.mark.parametrize("version", ["v3", "v4"])
def test_an_overlay_graph_replays_new_layers_of_the_same_counts(version):
    import cupy as cp

    from app.kernel.overlay.gpu import KEPT_PAIRS, N_CANDIDATES, N_PAIRS, SLOTS
    from app.kernel.overlay.plan import OverlayInputs
    from app.runtime.recorder import read_to_host

    plan = get_plan_class("overlay", version)({"left": 2_000, "right": 2_000})
    inputs = plan.make_inputs()
    backend, stream, graph, ref = _captured(plan, inputs)
    state = graph.state
    new = OverlayInputs(shifted(inputs.left, -0.1, 0.1), shifted(inputs.right, 0.2, 0.1))
    with stream:
        state["a"]["coords"].set(new.left.coords)
        state["b"]["coords"].set(new.right.coords)
        graph.replay()
        words = read_to_host(cp, state["ledger"]["all"])
        counts = [int(words[s][0]) for s in (N_PAIRS, N_CANDIDATES, SLOTS)]
        rooms = [len(state["pair_a"]), len(state["cand"][0]), state["n_slots"]]
        assert all(c <= r for c, r in zip(counts, rooms)), f"counts {counts} outgrew the rooms {rooms}: pick other data"
        kept = int(words[KEPT_PAIRS][0])
        out = tuple(col.base[:kept].get() for col in state["output"])      # the full columns the graph writes
    check = plan.verify(new, out)
    assert check["matches"], check
    assert kept > 0 and not (len(out[2]) == len(ref[2]) and np.array_equal(out[2], ref[2]))
