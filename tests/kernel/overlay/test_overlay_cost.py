"""The overlay's cost model against what ncu measured in this project's own capture (tests/fixtures/ncu, overlay v2
at 2k x 2k on an H200): segment_extraction's FLOPs are its shoelace terms as written, within the share the compiler
saves by reusing a difference between neighbouring edges."""
from app.analysis.kernel_metrics import kernel_table, stage_table
from app.kernel.plan import get_plan_class
from app.runtime.execute import xp_for
from app.runtime.nvtx import Nvtx
from app.runtime.profiling.parsers.ncu_csv import parse_raw
from app.runtime.recorder import Recorder
from tests.conftest import fixture_text


def test_segment_extraction_flops_are_its_shoelace_terms():
    plan = get_plan_class("overlay", "v2")({"left": 2_000, "right": 2_000})
    inputs = plan.make_inputs()
    _, rec = Recorder("cpu", xp_for("cpu"), Nvtx(False, "overlay")).run(plan, inputs, plan.backend("cpu"))
    ext = next(s for s in rec.stages if s["name"] == "segment_extraction")
    model = plan.cost(ext["name"], ext["rows_in"], ext["rows_out"], ext["meta"], inputs)
    edges = inputs.left.n_coords + inputs.right.n_coords - inputs.left.n_rings - inputs.right.n_rings
    assert ext["rows_out"] == edges and model.flops == 8 * edges
    names = [s.name for s in plan.stages]
    raw, _ = parse_raw(fixture_text("ncu/overlay.full.raw.csv"))
    measured = stage_table(kernel_table(raw, "overlay", names, "NVIDIA H200"), names).set_index("stage").loc[
        "segment_extraction", "fp64_flops"]
    # 548,756 counted against 614,848 modelled: 2 DMUL an edge exactly, 5 DADD where the code writes 6.
    assert 0.85 < measured / model.flops <= 1.0
