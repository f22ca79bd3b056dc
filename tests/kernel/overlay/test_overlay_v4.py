"""overlay v4 is v3 with the filter's first eight launches in one cooperative launch (overlay_v4.cu's
filter_fused): the same device code on every item, so the same pairs, candidates, counters and areas as v3, bit
for bit, from seven launches fewer."""
import collections

import numpy as np
import pytest

from app.kernel.plan import get_plan_class


def test_v4_runs_v3s_stages_on_the_cpu():
    plan = get_plan_class("overlay", "v4")({"left": 40, "right": 40})
    backend = plan.backend("cpu")
    assert plan.cpu_stages_of == "v3" and backend.version == "v3"


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["random", "self", "grid"])
def test_v4_finds_v3s_pairs_and_areas_exactly_in_seven_launches_fewer(layout):
    import cupy as cp

    from app.runtime.device import select
    from app.runtime.execute import backend_for
    from app.runtime.nvtx import Nvtx
    from app.runtime.recorder import Recorder

    got = {}
    for version in ("v3", "v4"):
        plan = get_plan_class("overlay", version)({"left": 3000, "right": 2500, "layout": layout, "seed": 3})
        inp = plan.make_inputs()
        backend, _ = backend_for(plan, select("gpu"))
        Recorder("gpu", cp, Nvtx(False, "overlay")).run(plan, inp, backend)    # the rooms fitted: a warm run next
        launches = collections.Counter()
        fns = backend.mod.fn
        backend.mod.fn = {n: (lambda *a, _n=n, _f=f, **k: (launches.update([_n]), _f(*a, **k))[1])
                          for n, f in fns.items()}
        try:
            out, rec = Recorder("gpu", cp, Nvtx(False, "overlay")).run(plan, inp, backend)
        finally:
            backend.mod.fn = fns
        cols = tuple(cp.asnumpy(a) for a in out)
        assert plan.verify(inp, cols)["matches"]
        stages = {s["name"]: s for s in rec.stages}
        got[version] = cols, stages, launches
    (out3, st3, n3), (out4, st4, n4) = got["v3"], got["v4"]
    for a, b in zip(out3, out4):
        np.testing.assert_array_equal(a, b)            # areas too: the same arithmetic in the same order
    assert st3["segment_mbr_filter"]["meta"] == st4["segment_mbr_filter"]["meta"]
    for stage in ("exact_intersection_refine", "area_reconstruction"):
        assert st3[stage]["meta"] == st4[stage]["meta"], stage
    assert n4["filter_fused"] == 1 and n4["edge_pairs_warp"] == 1
    assert not {"corner_cells_grid", "corner_scatter", "polygon_pairs", "sort_pairs"} & set(n4)
    assert sum(n3.values()) - sum(n4.values()) == 7
