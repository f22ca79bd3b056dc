"""ncu CSV parsers on the real captures in shared/fixtures/ncu (ncu 2025.3.1, H200)."""
import math

import pytest

from app.errors import MalformedToolOutput
from app.runtime.profiling.parsers.ncu_csv import parse_details, parse_raw, parse_source, split_nvtx, to_number
from tests.conftest import FIXTURES

NCU = FIXTURES / "ncu"
pytestmark = pytest.mark.skipif(not NCU.exists(), reason=f"fixtures not found at {NCU}")


@pytest.fixture(scope="module")
def raw():
    return parse_raw((NCU / "raw_metrics_stdout.csv").read_text())


def test_raw_page_skips_preamble_and_reads_units(raw):
    df, units = raw
    assert len(df) == 33                                   # every profiled kernel, no preamble rows
    assert df["id"].tolist() == list(range(33))
    assert units["duration_ns"] == "ns" and units["dram_read_bytes"] == "byte" and units["l2_hit_pct"] == "%"


def test_thousands_separators_become_numbers(raw):
    df, _ = raw
    first = df.iloc[0]
    assert first["duration_ns"] == 183616 and first["dram_read_bytes"] == 36352
    assert df.iloc[1]["dram_write_bytes"] == 40216064 and df.iloc[1]["ffma"] == 16777216
    assert df.iloc[1]["l2_hit_pct"] == pytest.approx(99.77)


def test_nvtx_cell_splits_into_domain_and_range(raw):
    df, _ = raw
    assert df.iloc[0]["nvtx_stack"] == []                  # RNG kernels ran outside any range
    assert df.iloc[-1]["nvtx_stack"] == [("probe", "stage:sort"), ("CCCL", "thrust::stable_sort"),
                                         ("CCCL", "cub::DeviceRadixSort")]
    stages = {s[0][1] for s in df["nvtx_stack"] if s and s[0][0] == "probe"}
    assert stages == {"stage:axpy", "stage:sort"}


def test_details_page_separates_ragged_rule_rows():
    metrics, rules = parse_details((NCU / "full_details.csv").read_text())
    assert len(metrics) + len(rules) == 190 and len(rules) == 16
    assert set(rules["rule_type"]) == {"OPT", "INF"}
    top = rules.sort_values("speedup_pct", ascending=False).iloc[0]
    assert (top["rule"], top["speedup_type"], top["speedup_pct"]) == ("HighPipeUtilization", "local", 94.75)
    dram = metrics[(metrics["metric"] == "DRAM Frequency")].iloc[0]
    assert dram["value_num"] == pytest.approx(3197665937.27) and dram["unit"] == "hz"
    assert metrics["nvtx_stack"].iloc[0] == [("probe", "stage:axpy")]


def test_source_page_per_kernel_sass_rows():
    blocks = parse_source((NCU / "source_sass.csv").read_text())
    assert list(blocks) == ["saxpy", "saxpy #2"]
    sass = blocks["saxpy"]
    assert sass.shape == (32, 63) and sass["Source"].iloc[0].strip() == "LDC R1, c[0x0][0x28]"
    assert sass["Warp Stall Sampling (All Samples)"].sum() > 0


def test_full_raw_export_parses(tmp_path):
    df, units = parse_raw((NCU / "full_raw.csv").read_text())
    assert len(df) == 2 and (df["kernel"] == "saxpy").all() and df.shape[1] > 2000


@pytest.mark.parametrize("text", ["", "==PROF== nothing here\n", '"ID","Kernel Name"\n'])
def test_malformed_raw_is_one_clear_error(text):
    with pytest.raises(MalformedToolOutput):
        parse_raw(text)


def test_helpers():
    assert to_number("1,234.5") == 1234.5 and math.isnan(to_number("n/a")) and to_number("abc") == "abc"
    assert split_nvtx('7  "join:bounds:none:none:none:none:REGISTERED:bounds" ') == [("join", "bounds")]
