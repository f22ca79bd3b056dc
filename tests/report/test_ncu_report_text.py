"""The counter modes' report text on this project's own H200 captures (tests/fixtures/ncu): the headline names the
bottleneck trace.json's summary does, the Key Issue column names an L2 hit rate only where the report's own rule
calls it a locality issue, and the measured-vs-model note says what ncu's DRAM bytes hold."""
import pytest

from app.analysis.kernel_metrics import kernel_table, kernel_time, opportunities, stage_table
from app.analysis.summary import counter_summary
from app.kernel.plan import get_plan_class
from app.report.ncu_report import stage_sections
from app.runtime.execute import xp_for
from app.runtime.nvtx import Nvtx
from app.runtime.profiling.parsers.ncu_csv import parse_raw
from app.runtime.recorder import Recorder
from tests.conftest import fixture_text

DEVICE = "NVIDIA H200"
CAPTURES = {"join": ("join", "v2", {"points": 20_000, "polygons": 2_000}),
            "overlay_v3": ("overlay", "v3", {"left": 2_000, "right": 2_000})}


def _costs(name: str) -> dict:
    """The stages' modelled Costs from a CPU run at the capture's sizes (the counts the models read)."""
    kernel, version, params = CAPTURES[name]
    plan = get_plan_class(kernel, version)(params)
    inputs = plan.make_inputs()
    _, rec = Recorder("cpu", xp_for("cpu"), Nvtx(False, kernel)).run(plan, inputs, plan.backend("cpu"))
    return {s["name"]: plan.cost(s["name"], s["rows_in"], s["rows_out"], s["meta"], inputs) for s in rec.stages}


def _report(name: str, raw=None, model: dict | None = None):
    """The annotation capture's report sections, stage table and summary, the models from the CPU run unless given."""
    kernel, version, params = CAPTURES[name]
    names = [s.name for s in get_plan_class(kernel, version)().stages]
    costs = _costs(name)
    if model is None:
        model = {n: c.bytes for n, c in costs.items() if c.kind == "dram"}
    if raw is None:
        raw, _ = parse_raw(fixture_text(f"ncu/{name}.annotation.csv"))
    kernels = kernel_table(raw, kernel, names, DEVICE, model_bytes=model)
    stages = stage_table(kernels, names)
    ops = opportunities(stages, kernel_time(stages))
    rows = stages.set_index("stage")
    trace = {"metadata": {"params": params, "kernels_outside_stages": int(kernels["stage"].isna().sum())},
             "device": {"name": DEVICE},
             "stages": [{"name": n, "ncu": {k: (None if v != v else v) for k, v in rows.loc[n].items()},
                         "cost": {"bytes": costs[n].bytes, "flops": costs[n].flops, "precision": costs[n].precision,
                                  "kind": costs[n].kind}} for n in names]}
    sections = stage_sections(trace, stages, kernels, ops, None, "ncu --clock-control none")
    return {s.title or "": s for s in sections}, stages, counter_summary(stages, kernels, ops)


@pytest.mark.parametrize("name", sorted(CAPTURES))
def test_the_key_issue_names_an_l2_hit_rate_only_where_it_is_a_locality_issue(name):
    """The footnote's rule is the column's: overlay v3's area stage (L2 hit 62%, its kernels each at most 0.93x the
    stage's model) and join's refine (74%, 0.99x) list no hit rate, as they did below 80% whatever their bytes."""
    sections, stages, _ = _report(name)
    issues = {r[0]: r[-1] for r in sections["Stages"].rows}
    for r in stages.itertuples():
        assert ("L2 hit" in issues[r.stage]) is r.bottleneck.endswith("+ locality"), r.stage
    low = stages[stages["l2_hit_pct"] < 80]
    assert len(low) >= 2 and not any("L2 hit" in issues[s] for s in low["stage"])


def test_the_key_issue_gives_the_evidence_of_a_locality_issue():
    """Where one kernel moves more than 1.25x its stage's modelled bytes (here a model a third of join v2's
    candidate_filter's measured bytes: its emit pass alone moves 1.31x), the Key Issue names the hit rate, the kernel
    and its excess, and the stage's class says "+ locality"."""
    raw, _ = parse_raw(fixture_text("ncu/join.annotation.csv"))
    model = {n: c.bytes for n, c in _costs("join").items() if c.kind == "dram"}
    model["candidate_filter"] = 500_000
    sections, stages, _ = _report("join", raw, model)
    row = next(r for r in sections["Stages"].rows if r[0] == "candidate_filter")
    assert row[5] == "latency-bound + locality"
    assert row[6].startswith("L2 hit 71% (point_candidates moved 1.31x the stage's modelled bytes)")


def test_the_headline_names_the_summarys_bottleneck_locality_included():
    """trace.json's summary.bottleneck is the longest stage's class; the report's headline is the same, with
    "+ locality" where that class has it (it dropped it: "Latency-bound" beside "latency-bound + locality")."""
    raw, _ = parse_raw(fixture_text("ncu/join.annotation.csv"))
    model = {n: c.bytes for n, c in _costs("join").items() if c.kind == "dram"}
    model["candidate_filter"] = 500_000           # the longest stage, given a locality class (see above)
    sections, stages, summary = _report("join", raw, model)
    assert summary["bottleneck"] == "latency-bound + locality"
    assert "**Bottleneck:** Latency-bound + locality\n" in sections[""].text
    sections, _, summary = _report("join")
    assert summary["bottleneck"] == "latency-bound" and "**Bottleneck:** Latency-bound\n" in sections[""].text


def test_the_measured_vs_model_note_says_ncu_counts_almost_no_writes():
    """ncu empties the caches before each kernel, and a kernel's writes stay in L2 until after it stops counting:
    the overlay v3 capture's dram__bytes_write.sum is 0 B of 7.88 MB. The note gives those figures, and no longer
    says data an earlier stage left in L2 lowers the ratio (under ncu's flush none is left)."""
    raw, _ = parse_raw(fixture_text("ncu/overlay_v3.annotation.csv"))
    writes, total = raw["dram_write_bytes"].sum(), raw["dram_read_bytes"].sum() + raw["dram_write_bytes"].sum()
    assert writes < 0.001 * total
    sections, _, _ = _report("overlay_v3")
    note = sections["DRAM bytes and FLOPs: measured vs cost model"].note
    assert f"dram__bytes_write.sum counted {writes:,.0f} B of the {total / 1e6:,.2f} MB measured here" in note
    assert "left in L2 never reaches DRAM" not in note
    kernels_note = sections["Kernels"].note
    assert "--cache-control all" in kernels_note and "leave out most of its writes" in kernels_note


def test_the_measured_vs_model_table_gives_the_largest_kernels_ratio():
    """The evidence the locality rule reads is in the table: overlay v3's area stage moves 1.66x its model, its
    walk over the cut rings 0.93x on its own."""
    sections, _, _ = _report("overlay_v3")
    table = sections["DRAM bytes and FLOPs: measured vs cost model"]
    col = table.columns.index("bytes: largest kernel / model")
    area = next(r for r in table.rows if r[0] == "area_reconstruction")
    assert area[table.columns.index("bytes: measured / model")] == "1.66" and area[col] == "0.93"


def test_the_root_cause_says_n_a_for_a_missing_hit_rate():
    """A stage's L2 hit rate that is missing reads "L2 hit n/a" in the root cause, not "n/a%"."""
    raw, _ = parse_raw(fixture_text("ncu/join.annotation.csv"))
    sections, _, _ = _report("join", raw.drop(columns=["l2_hit_pct"]))
    text = sections[""].text
    assert "L2 hit n/a)" in text and "n/a%" not in text
