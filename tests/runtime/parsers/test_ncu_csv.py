"""ncu CSV parsers on this project's own captures (tests/fixtures/ncu, made by its make.sh on an
H200 with ncu 2025.3.1): join v2 at 20k points x 2k polygons and overlay v2 at 2k x 2k, one warm
iteration each, in annotation mode's metric set and in ncu mode's full set."""
import math

import pytest

from app.errors import MalformedToolOutput
from app.runtime.profiling.parsers.ncu_csv import parse_details, parse_raw, parse_source, split_nvtx, to_number
from tests.conftest import fixture_text

KERNELS = {"join": 16, "overlay": 26}      # kernels in one warm iteration of each plan
# The first stage with kernels of its own: the host->device build before it only copies.
FIRST_STAGE = {"join": "bounds", "overlay": "segment_extraction"}


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
    assert df.iloc[0]["nvtx_stack"][1] == (kernel, FIRST_STAGE[kernel])
    assert (kernel, "owned_buffer_build") not in {st[1] for st in df["nvtx_stack"]}


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


# --- units, truncation and versions: the real captures with one defect each ---------------------------

def _with_unit(text: str, column: str, unit: str, scale: float) -> str:
    """``text`` (a raw page) with ``column`` printed in ``unit``, its values divided by ``scale``."""
    import csv
    import io

    lines = text.splitlines(keepends=True)
    i = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    rows = list(csv.reader(io.StringIO("".join(lines[i:]))))
    j = rows[0].index(column)
    rows[1][j] = unit
    for r in rows[2:]:
        r[j] = f"{float(r[j].replace(',', '')) / scale:,.12g}"
    buf = io.StringIO()
    csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n").writerows(rows)
    return "".join(lines[:i]) + buf.getvalue()


@pytest.mark.parametrize("column,name,unit,scale", [
    ("gpu__time_duration.sum", "duration_ns", "usecond", 1e3),
    ("gpu__time_duration.sum", "duration_ns", "msecond", 1e6),
    ("gpu__time_duration.sum", "duration_ns", "nsecond", 1),
    ("dram__bytes_read.sum", "dram_read_bytes", "Kbyte", 1e3),
    ("dram__bytes_write.sum", "dram_write_bytes", "Mbyte", 1e6),
    ("l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum", "local_store_bytes", "Gbyte", 1e9),
])
def test_a_metric_in_a_prefixed_unit_is_scaled_to_the_base_unit(column, name, unit, scale):
    text = fixture_text("ncu/join.annotation.csv")
    base, _ = parse_raw(text)
    df, units = parse_raw(_with_unit(text, column, unit, scale))
    assert units[name] == unit
    assert df[name].tolist() == pytest.approx(base[name].tolist(), rel=1e-6, abs=1e-3)


@pytest.mark.parametrize("column,name,unit", [
    ("gpu__time_duration.sum", "duration_ns", "cycle"),
    ("dram__bytes_read.sum", "dram_read_bytes", "sector"),
    ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "sm_pct", "Gbyte/second"),
    ("gpu__time_duration.sum", "duration_ns", ""),
])
def test_a_metric_in_an_unknown_unit_is_not_read(column, name, unit):
    df, units = parse_raw(_with_unit(fixture_text("ncu/join.annotation.csv"), column, unit, 1))
    assert df[name].isna().all()                      # not the number taken in the base unit
    assert units.get(name, "") == unit
    assert df["dram_write_bytes"].notna().all()       # the other metrics are read


def test_the_committed_captures_are_in_the_units_the_maps_expect():
    from app.runtime.profiling.parsers.columns import unit_problem

    for name in ("join.annotation.csv", "overlay.annotation.csv", "join.full.raw.csv", "overlay.full.raw.csv"):
        df, units = parse_raw(fixture_text(f"ncu/{name}"))
        assert not [c for c in df if unit_problem(c, units.get(c, ""))], name


def test_a_raw_page_with_no_kernel_rows_is_refused():
    text = fixture_text("ncu/join.annotation.csv")
    lines = text.splitlines(keepends=True)
    i = next(i for i, line in enumerate(lines) if line.startswith('"ID"'))
    with pytest.raises(MalformedToolOutput, match="no kernel rows"):
        parse_raw("".join(lines[:i + 2]))


@pytest.mark.parametrize("parse,name", [
    (parse_raw, "join.annotation.csv"), (parse_raw, "join.full.raw.csv"),
    (parse_details, "join.full.details.csv"), (parse_source, "join.full.source.csv"),
])
@pytest.mark.parametrize("share", [0.3, 0.6, 0.9])
def test_an_export_cut_off_inside_a_row_is_refused_with_its_line(parse, name, share):
    text = fixture_text(f"ncu/{name}")
    cut = text[: int(len(text) * share)]
    with pytest.raises(MalformedToolOutput, match=r"(the row at line \d+ (ends inside a quoted cell|has \d+ cells))"
                                                  r"|no kernel rows") as exc:
        parse(cut, source="the test's page")
    assert str(exc.value).startswith("the test's page")


def test_a_row_cut_at_a_cell_boundary_or_run_long_is_refused():
    text = fixture_text("ncu/join.full.details.csv")
    lines = text.splitlines()
    # A metric row (18 cells) cut after its value: 17 cells, neither a metric row nor a rule row.
    short = lines[:-1] + [lines[5].rsplit(",", 1)[0]]
    with pytest.raises(MalformedToolOutput, match=f"line {len(lines)} has 17 cells"):
        parse_details("\n".join(short))
    long = lines[:3] + [lines[3] + ',"extra"'] + lines[4:]
    with pytest.raises(MalformedToolOutput, match="line 4 has 19 cells, a metric row has 18 and a rule row 22"):
        parse_details("\n".join(long))
    raw = fixture_text("ncu/join.annotation.csv").splitlines()
    width = len(raw[-1].split('","'))
    raw[-1] += ',"1"'
    with pytest.raises(MalformedToolOutput, match=f"line {len(raw)} has {width + 1} cells, its header {width}"):
        parse_raw("\n".join(raw))


def test_to_number_takes_what_a_padded_row_holds():
    assert math.isnan(to_number(None)) and to_number(3) == 3.0 and to_number(2.5) == 2.5
    assert math.isnan(to_number(["x"])) and to_number(" 12 ") == 12.0


@pytest.mark.parametrize("version,ok", [("2025.3.1.0", True), ("2025.3.0.0", True), ("2026.1.0.0", True),
                                        ("2025.2.1.0", "old"), ("2019.4.0", "old"), (None, False),
                                        ("Version unknown", False)])
def test_an_ncu_older_than_every_column_map_runs_with_a_warning_and_an_unreadable_one_is_refused(version, ok, capsys):
    from app.errors import ToolNotFound
    from app.runtime.profiling.parsers.columns import check_ncu_version, ncu_columns

    if ok:
        assert check_ncu_version(version, "/opt/ncu") == version and ncu_columns(version)["ID"] == "id"
        err = capsys.readouterr().err
        assert (f"warning: ncu {version} (/opt/ncu) is older than 2025.3" in err) == (ok == "old"), err
    else:
        with pytest.raises(ToolNotFound, match="pass --ncu PATH to") as exc:
            check_ncu_version(version, "/opt/ncu")
        assert "2025.3" in str(exc.value) and "/opt/ncu" in str(exc.value)


def _blocks(text):
    head, *blocks = text.split('"Kernel Name"')
    return head, blocks


def test_the_committed_source_page_prints_every_kernel_block_twice_and_each_is_read_once():
    """ncu 2025.3.1 printed each kernel's block twice, identical, in this capture as in every real run seen (H200,
    join v2, 2026-11-29); a relaunch (point_candidates, twice in join's iteration) has its own samples and stays."""
    text = fixture_text("ncu/join.full.source.csv")
    head, blocks = _blocks(text)
    assert len(blocks) == 2 * KERNELS["join"] and all(blocks[i] == blocks[i + 1] for i in range(0, len(blocks), 2))
    once = head + "".join(f'"Kernel Name"{b}' for b in blocks[::2])
    read, read_once = parse_source(text, kernels=KERNELS["join"]), parse_source(once, kernels=KERNELS["join"])
    assert list(read) == list(read_once) and len(read) == KERNELS["join"] and "point_candidates #2" in read
    assert all(read[k].equals(read_once[k]) for k in read)
    assert list(parse_source(text)) == list(read)          # no raw page to count against: repeats dropped too


def test_equal_blocks_are_two_launches_where_the_raw_page_has_as_many_kernels():
    """Two launches of a tiny kernel can print equal tables (no samples): with as many blocks as the raw page has
    kernels, every block is a launch; only a page holding more blocks than kernels has repeats to drop."""
    head, blocks = _blocks(fixture_text("ncu/join.full.source.csv"))
    blocks = blocks[::2]                     # one block a kernel
    doubled_first = head + f'"Kernel Name"{blocks[0]}' + "".join(f'"Kernel Name"{b}' for b in blocks)
    n = len(blocks) + 1                      # the raw page of such a run lists the first kernel twice
    both = parse_source(doubled_first, kernels=n)
    first = blocks[0].split(",", 2)[1].strip().strip('"')
    assert len(both) == n and f"{first} #2" in both
    assert len(parse_source(doubled_first, kernels=n - 1)) == n - 1       # more blocks than kernels: a repeat


@pytest.mark.parametrize("capture", ["join", "overlay", "overlay_v3"])
def test_the_sass_listing_counts_each_kernels_fp64_work_as_its_metrics_do(capture):
    """Each kernel's SASS listing (sass/<kernel>.csv in a profile) and its metrics, both from one capture, agree on
    its FP64 work: its DADD, DMUL and DFMA (two FLOPs) rows summed over the predicated-on thread column give the
    kernel's sm__sass_thread_inst_executed_op_d*_pred_on counts, launch by launch. The plain thread column counts
    the threads an instruction's predicate switched off too: in overlay v3's area_cut_rings 1,073,678 FLOPs
    against 936,482, which is not the kernel's work."""
    raw, _ = parse_raw(fixture_text(f"ncu/{capture}.full.raw.csv"))
    sass = parse_source(fixture_text(f"ncu/{capture}.full.source.csv"), kernels=len(raw))
    assert len(sass) == len(raw)
    plain = {}
    for (key, df), (_, row) in zip(sass.items(), raw.iterrows()):
        assert key.split(" #")[0] == row["kernel"].split("(")[0]          # the listings in the raw page's order
        op = df["Source"].str.split().map(lambda w: w[1] if w[0].startswith("@") else w[0]).str.split(".").str[0]
        weight = op.map({"DADD": 1, "DMUL": 1, "DFMA": 2}).fillna(0)
        pred_on = (weight * df["Predicated-On Thread Instructions Executed"]).sum()
        assert pred_on == 2 * row["dfma"] + row["dadd"] + row["dmul"], key
        plain[key] = (weight * df["Thread Instructions Executed"]).sum()
    if capture == "overlay_v3":
        assert plain["area_cut_rings"] == 1_073_678
