"""The overlay's cost model against what ncu measured in this project's own captures (tests/fixtures/ncu: overlay
v2 and v3 at 2k x 2k on an H200): segment_extraction's FLOPs are its shoelace terms as written, within the share
the compiler saves by reusing a difference between neighbouring edges; exact_intersection_refine's are its pairs'
orientation filters and its proper crossings' parameters, as counted."""
import pytest

from app.analysis.kernel_metrics import kernel_table, stage_table
from app.kernel.plan import get_plan_class
from app.runtime.execute import xp_for
from app.runtime.nvtx import Nvtx
from app.runtime.profiling.parsers.ncu_csv import parse_raw
from app.runtime.recorder import Recorder
from tests.conftest import fixture_text

CAPTURES = {"v2": "ncu/overlay.full.raw.csv", "v3": "ncu/overlay_v3.full.raw.csv"}


def _model_and_measured(version: str, stage: str):
    """The stage's record from a CPU run at the capture's sizes (the counts the model reads: the same inputs give
    the same pairs and crossings on either device), its modelled Cost, and ncu's fp64 FLOPs for it."""
    plan = get_plan_class("overlay", version)({"left": 2_000, "right": 2_000})
    inputs = plan.make_inputs()
    _, rec = Recorder("cpu", xp_for("cpu"), Nvtx(False, "overlay")).run(plan, inputs, plan.backend("cpu"))
    record = next(s for s in rec.stages if s["name"] == stage)
    model = plan.cost(stage, record["rows_in"], record["rows_out"], record["meta"], inputs)
    names = [s.name for s in plan.stages]
    raw, _ = parse_raw(fixture_text(CAPTURES[version]))
    measured = stage_table(kernel_table(raw, "overlay", names, "NVIDIA H200"), names).set_index("stage").loc[
        stage, "fp64_flops"]
    return record, model, measured, inputs


def test_segment_extraction_flops_are_its_shoelace_terms():
    ext, model, measured, inputs = _model_and_measured("v2", "segment_extraction")
    edges = inputs.left.n_coords + inputs.right.n_coords - inputs.left.n_rings - inputs.right.n_rings
    assert ext["rows_out"] == edges and model.flops == 8 * edges
    # 548,756 counted against 614,848 modelled: 2 DMUL an edge exactly, 5 DADD where the code writes 6.
    assert 0.85 < measured / model.flops <= 1.0


@pytest.mark.parametrize("version", sorted(CAPTURES))
def test_refine_flops_count_the_crossings_parameters(version):
    refine, model, measured, _ = _model_and_measured(version, "exact_intersection_refine")
    pairs, proper = refine["rows_in"], refine["meta"]["proper"]
    assert (pairs, proper) == (19_271, 7_810)        # the capture's run: 15,620 reciprocals, two a crossing
    assert model.flops == 38 * pairs + 228 * proper
    # ncu: 2,512,978 in both captures (refine_pairs is every version's). The filters alone were 693,756.
    assert measured == pytest.approx(model.flops, rel=1e-3)
