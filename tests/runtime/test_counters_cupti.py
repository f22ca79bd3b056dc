"""Truth rule 5 checked from outside: CUPTI sees exactly the copies the stage counters report."""
import pytest

pytestmark = pytest.mark.gpu


def test_cupti_memcpy_records_match_stage_counters():
    cupti_mod = pytest.importorskip("cupti.cupti", reason="cupti-python is not installed")
    from app.kernel.join.plan import JoinV1
    from app.runtime.device import select
    from app.runtime.execute import backend_for, xp_for
    from app.runtime.nvtx import Nvtx
    from app.runtime.recorder import Recorder

    plan = JoinV1({"points": 200_000, "polygons": 20_000})
    inputs = plan.make_inputs()
    backend, _ = backend_for(plan, select("gpu"))
    rec = Recorder("gpu", xp_for("gpu"), Nvtx(False, "join"))
    rec.run(plan, inputs, backend)            # cold run outside the capture

    records = []

    def buffer_requested():
        return 8 * 1024 * 1024, 0

    def buffer_completed(activities):
        records.extend(a for a in activities if a.kind == cupti_mod.ActivityKind.MEMCPY)

    cupti_mod.activity_register_callbacks(buffer_requested, buffer_completed)
    cupti_mod.activity_enable(cupti_mod.ActivityKind.MEMCPY)
    try:
        _, run = rec.run(plan, inputs, backend)
        cupti_mod.activity_flush_all(1)
    finally:
        cupti_mod.activity_disable(cupti_mod.ActivityKind.MEMCPY)
        cupti_mod.activity_flush_all(1)

    htod = [r for r in records if r.copy_kind == cupti_mod.ActivityMemcpyKind.HTOD]
    dtoh = [r for r in records if r.copy_kind == cupti_mod.ActivityMemcpyKind.DTOH]
    counted = {k: sum(s["counters"][k] for s in run.stages)
               for k in ("h2d_copies", "h2d_bytes", "d2h_copies", "d2h_bytes")}
    # 200k x 20k is staged (over 2 MiB): each chunk's DMA is a copy CUPTI sees, and one the counters count.
    assert len(htod) == counted["h2d_copies"] > 4
    assert sum(r.bytes for r in htod) == counted["h2d_bytes"]
    assert len(dtoh) == counted["d2h_copies"] == 3
    assert sum(r.bytes for r in dtoh) == counted["d2h_bytes"]
