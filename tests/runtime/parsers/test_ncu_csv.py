"""ncu CSV parsers on this project's own captures (tests/fixtures/ncu, made by its make.sh on an
H200 with ncu 2025.3.1): join v2 at 20k points x 2k polygons and overlay v2 at 2k x 2k, one warm
iteration each, in annotation mode's metric set and in ncu mode's full set."""
import math

import pytest

from app.errors import MalformedToolOutput
from app.runtime.profiling.parsers.ncu_csv import parse_details, parse_raw, parse_source, split_nvtx, to_number
from tests.conftest import fixture_text

KERNELS = {"join": 20, "overlay": 41}      # kernels in one warm iteration of each plan


@pytest.fixture(scope="module", params=list(KERNELS))
def annotation(request):
    return request.param, parse_raw(fixture_text(f"ncu/{request.param}.annotation.csv"), "2025.3.1.0")


def test_raw_page_skips_preamble_and_reads_units(annotation):
    kernel, (df, units) = annotation
    assert len(df) == KERNELS[kernel]                      # every profiled kernel, no preamble rows
    assert df["id"].tolist() == list(range(KERNELS[kernel]))
    assert units["duration_ns"] == "ns" and units["dram_read_bytes"] == "byte" and units["l2_hit_pct"] == "%"
    assert (df["duration_ns"] > 0).all() and df["kernel"].map(bool).all()


def test_thousands_separators_become_numbers():
    df, _ = parse_raw(fixture_text("ncu/join.annotation.csv"))
    refine = df[df["kernel"] == "refine"].iloc[0]
    assert refine["registers"] == 64 and refine["dfma"] + refine["dadd"] + refine["dmul"] > 0
    assert isinstance(refine["duration_ns"], float) and refine["duration_ns"] > 1000


def test_nvtx_cell_splits_into_domain_and_range(annotation):
    kernel, (df, _) = annotation
    # ncu was limited to <kernel>@profile: every kernel ran inside it, under one stage range.
    assert all(st[0] == (kernel, "profile") and len(st) >= 2 for st in df["nvtx_stack"])
    assert df.iloc[0]["nvtx_stack"][1] == (kernel, "owned_buffer_build")


def test_details_page_separates_ragged_rule_rows():
    metrics, rules = parse_details(fixture_text("ncu/join.full.details.csv"))
    assert len(rules) > 0 and set(rules["rule_type"]) >= {"OPT", "INF"}
    assert rules["speedup_pct"].dropna().between(0, 100).all()
    sol = metrics[metrics["section"] == "GPU Speed Of Light Throughput"]
    assert set(sol["id"].astype(int)) == set(range(KERNELS["join"]))
    dram = sol[sol["metric"] == "DRAM Frequency"].iloc[0]
    assert dram["unit"] == "hz" and 1e9 < dram["value_num"] < 4e9
    assert metrics["nvtx_stack"].iloc[0][0] == ("join", "profile")


def test_source_page_per_kernel_sass_rows():
    blocks = parse_source(fixture_text("ncu/join.full.source.csv"))
    assert len(blocks) == KERNELS["join"] and "refine" in blocks and "point_candidates #2" in blocks
    sass = blocks["refine"]
    assert sass["Source"].iloc[0].strip().startswith("LDC R1")
    assert sass["Warp Stall Sampling (All Samples)"].sum() > 0


def test_full_raw_export_parses():
    df, _ = parse_raw(fixture_text("ncu/overlay.full.raw.csv"), "2025.3.1.0")
    assert len(df) == KERNELS["overlay"] and df.shape[1] > 1000
    # ncu mode asks for annotation mode's metrics on top of the full set: they are all there.
    for col in ("dram_pct", "sm_pct", "dfma", "ffma", "local_load_bytes", "dram_pct_sol"):
        assert df[col].notna().all(), col


@pytest.mark.parametrize("text", ["", "==PROF== nothing here\n", '"ID","Kernel Name"\n'])
def test_malformed_raw_is_one_clear_error(text):
    with pytest.raises(MalformedToolOutput):
        parse_raw(text)


def test_helpers():
    assert to_number("1,234.5") == 1234.5 and math.isnan(to_number("n/a")) and to_number("abc") == "abc"
    assert split_nvtx('7  "join:bounds:none:none:none:none:REGISTERED:bounds" ') == [("join", "bounds")]
