"""annotation and ncu mode's subprocess orchestration with a fake ncu that replays this project's
own H200 captures (tests/fixtures/ncu).

The device is declared a GPU in-process (CI has none); the fake runs the real worker on the CPU
and prints the captured CSV, or writes the captured .ncu-rep. Real ncu runs happen on the lent
GPU machine (tests/runtime/test_ncu_real.py).
"""
import json
from pathlib import Path

import pytest

from app.errors import BadParameter
from app.kernel.cli import main
from app.kernel.plan import get_plan_class
from app.runtime import device as devmod
from app.runtime.profiling.annotation import annotation_profile_plan
from app.runtime.profiling.parsers.ncu_csv import parse_raw
from tests.conftest import fixture_text

FAKE = Path(__file__).parent / "fake_tools" / "ncu"
SMALL = ["--points", "3000", "--polygons", "300"]
KERNELS = 16                 # kernels in the captured warm iteration of join v2 (tests/fixtures/ncu)
ARGS = ["join", "v2", *SMALL, "--prof_type", "annotation", "--ncu", str(FAKE)]


@pytest.fixture(autouse=True)
def fake_gpu(monkeypatch):
    sel = devmod.Selection("auto", "gpu", "gpu", "declared by the test", "NVIDIA H200", {"name": "NVIDIA H200"})
    monkeypatch.setattr("app.runtime.profiling.session.devmod.select", lambda requested: sel)


def _profile_dir(out, mode, kernel="join"):
    (d,) = list(out.glob(f"profiles/{mode}/{kernel}/*/*"))
    return d


def test_annotation_profile_from_replayed_capture(tmp_path, capsys):
    out = tmp_path / "out"
    assert main([*ARGS, "--out", str(out)]) == 0
    d = _profile_dir(out, "annotation")
    names = {p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file()}
    assert {"report.md", "trace.json", "params.json", "kernels.csv", "stages.csv", "ncu_raw.csv", "roofline.png",
            "bandwidth.png"} <= names
    trace = json.loads((d / "trace.json").read_text())
    raw, _ = parse_raw(fixture_text("ncu/join.annotation.csv"))
    assert trace["metadata"]["kernels_outside_stages"] == 0
    by = {s["name"]: s for s in trace["stages"]}
    refine_ns = raw.loc[raw["kernel"] == "refine", "duration_ns"].sum()
    assert by["predicate_refine"]["metadata"]["kernels"] == 1
    assert by["predicate_refine"]["elapsed_seconds"] == pytest.approx(refine_ns / 1e9)
    assert by["bounds"]["rows_in"] == 3300                     # rows from the real worker
    # The build's copies launch no kernel: ncu cannot time them, so trace.json and stages.csv hold no time, not 0.
    assert by["owned_buffer_build"]["elapsed_seconds"] is None and by["owned_buffer_build"]["ncu"]["kernels"] == 0
    assert (d / "stages.csv").read_text().splitlines()[1].startswith("owned_buffer_build,0,,,,")
    assert trace["total_elapsed_seconds"] == pytest.approx(sum(s["elapsed_seconds"] for s in trace["stages"][1:]))
    summary = trace["summary"]
    assert summary["achieved_tflops"] == pytest.approx(summary["achieved_tflops_fp64"]
                                                       + summary["achieved_tflops_fp32"])
    assert trace["metadata"]["verification"]["matches"] is True
    report = (d / "report.md").read_text()
    for heading in ("## Stages", "**Bottleneck:**", "## Top 3 Opportunities", "## Kernels",
                    "DRAM bytes and FLOPs: measured vs cost model", "## Transfers and syncs", "## Verification",
                    "## Device", "](roofline.png)", "](bandwidth.png)"):
        assert heading in report, heading
    assert "Output matches shapely" in report
    # The report says ncu empties the caches before each kernel (its default --cache-control all) and judges locality
    # by it: the command must leave that default in place.
    command = trace["metadata"]["tool"]["command"]
    assert "--cache-control" not in command or command[command.index("--cache-control") + 1] == "all"
    assert "--cache-control all, its default, which this tool keeps" in report
    err = capsys.readouterr().err
    assert '==PROF== Profiling "join"' in err                  # progress reached the user


def test_ncu_mode_from_replayed_capture_lists_source_lines(tmp_path):
    out = tmp_path / "out"
    assert main(["join", "v2", *SMALL, "--prof_type", "ncu", "--ncu", str(FAKE), "--out", str(out)]) == 0
    d = _profile_dir(out, "ncu")
    report = (d / "report.md").read_text()
    assert "## Hot spots (CUDA source lines, by warp-stall samples)" in report
    assert "## NCU rule results" in report and "## Verification" in report
    # the build copies only: its bytes are not measured by a capture of kernels, never 0.00 of its cost model
    build = next(line for line in report.splitlines() if line.startswith("| owned_buffer_build | n/a (copies"))
    assert build.startswith("| owned_buffer_build | n/a (copies: ncu captures kernels only) |") and "0.00" not in build
    hot = {p.name: p.read_text() for p in (d / "hot").glob("*.md")}
    assert len(hot) == KERNELS
    refine = next(t for n, t in hot.items() if n.endswith("_refine.md"))
    assert refine.startswith("# refine (stage predicate_refine)")
    # The hottest line of refine is a CUDA source line with its code, reasons and SASS below it.
    first = next(line for line in refine.splitlines() if line.startswith("| 1 |"))
    assert "app/kernel/common.cuh:" in first and "long_scoreboard" in first and "`" in first
    assert "## SASS under the hottest lines" in refine
    kernels = {row.split(",")[1] for row in (d / "kernels.csv").read_text().splitlines()[1:]}
    assert "refine" in kernels
    trace = json.loads((d / "trace.json").read_text())
    assert all(s["ncu"]["dram_pct"] is not None for s in trace["stages"] if s["metadata"]["kernels"])
    # A small reading keeps two significant digits: join_extent's 0.023 FLOP/byte and init_run's DRAM 0.04% read 0.0
    # once, like kernels that do no arithmetic and move nothing.
    table = report.split("## Kernels", 1)[1].split("\n## ", 1)[0]
    cells = {r.split("|")[2].strip(): [c.strip() for c in r.split("|")] for r in table.splitlines()
             if r.startswith("| bounds |")}
    assert cells["join_extent"][6] == "0.023" and cells["init_run"][9] == "0.040"
    assert cells["init_run"][5] == "4.5e-06"            # 8 FLOPs in 1.8 us, a measured rate: not 0.0000


def test_counter_modes_refuse_bench_runs_in_one_line(tmp_path, capsys):
    assert main([*ARGS, "--bench_runs", "5", "--out", str(tmp_path / "out")]) == 2
    err = [l for l in capsys.readouterr().err.splitlines() if l.startswith("error:")]
    assert len(err) == 1 and "--bench_runs 5" in err[0] and "one warm iteration" in err[0]
    assert not (tmp_path / "out").exists()
    with pytest.raises(BadParameter, match="--bench_runs 3"):
        annotation_profile_plan(get_plan_class("join", "v2")({"points": 3000, "polygons": 300}), bench_runs=3,
                                ncu=str(FAKE))


@pytest.mark.parametrize("mode,code,fragment", [
    ("perm", 7, "ERR_NVGPUCTRPERM"),
    ("nokernels", 2, "profiled no kernels"),
    ("worker-fails", 2, "failed (exit"),
])
def test_failures_are_one_line_and_write_nothing(tmp_path, capsys, monkeypatch, mode, code, fragment):
    monkeypatch.setenv("FAKE_NCU_MODE", mode)
    out = tmp_path / "out"
    assert main([*ARGS, "--out", str(out)]) == code
    err = _one_error_line(capsys)
    assert fragment in err, err
    assert not out.exists()


def test_timeout_stops_ncu(tmp_path, capsys, monkeypatch, own_tempdir):
    import os
    import tempfile

    pidfile = tmp_path / "ncu.pid"
    monkeypatch.setenv("FAKE_NCU_MODE", "hang")
    monkeypatch.setenv("FAKE_NCU_PIDFILE", str(pidfile))
    before = set(Path(tempfile.gettempdir()).glob("app-kernel-tool-ncu-*"))
    assert main([*ARGS, "--ncu-timeout", "1", "--out", str(tmp_path / "out")]) == 2
    assert "did not finish within 1 s" in capsys.readouterr().err
    with pytest.raises(ProcessLookupError):
        os.kill(int(pidfile.read_text()), 0)                     # ncu (the fake) was stopped, not orphaned
    assert set(Path(tempfile.gettempdir()).glob("app-kernel-tool-ncu-*")) == before    # its temp folder removed


def test_missing_ncu(tmp_path, capsys):
    assert main(["join", "--prof_type", "ncu", "--ncu", str(tmp_path / "nope")]) == 6
    assert "ncu not found at" in capsys.readouterr().err


def test_cpu_run_leads_the_headline(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_NCU_MODE", "cpu-worker")       # the worker's report says it ran on the CPU
    out = tmp_path / "out"
    main([*ARGS, "--out", str(out)])
    report = (_profile_dir(out, "annotation") / "report.md").read_text()
    headline = report.split("\n## ")[0]
    assert "CPU FALLBACK" in headline and "no GPU counters" in headline


# --- the real capture with one defect injected (the fake's FAKE_NCU_MODE / FAKE_NCU_EXPORT) -----------------

def _one_error_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(err) == 1, err
    return err[0]


def _replayed_kernels(trace: dict):
    """The kernel table of the committed capture as made (base units), as annotation mode computes it: with the cost
    models of the run that replayed it (``trace``), which decide the locality classes."""
    from app.analysis.kernel_metrics import kernel_table

    stages = [s.name for s in get_plan_class("join", "v2")().stages]
    model = {s["name"]: s["cost"]["bytes"] for s in trace["stages"] if s["cost"]["kind"] == "dram"}
    return kernel_table(parse_raw(fixture_text("ncu/join.annotation.csv"))[0], "join", stages, "NVIDIA H200",
                        model_bytes=model)


@pytest.mark.parametrize("mode,column", [("unit-us", "duration_us"), ("unit-ms", "duration_us"),
                                         ("unit-kb", "dram_bytes"), ("unit-mb", "local_spill_bytes")])
def test_a_metric_in_another_unit_is_scaled_not_taken_as_the_base_unit(tmp_path, monkeypatch, mode, column):
    """ncu printed the same quantity in usecond/msecond/Kbyte/Mbyte: read as ns or bytes it made 1.65 GB/s
    read 1,650.8 and a byte count 1000x too small (and flipped the L2 verdicts)."""
    import pandas as pd

    monkeypatch.setenv("FAKE_NCU_MODE", mode)
    out = tmp_path / "out"
    assert main([*ARGS, "--out", str(out)]) == 0
    d = _profile_dir(out, "annotation")
    got = pd.read_csv(d / "kernels.csv")
    want = _replayed_kernels(json.loads((d / "trace.json").read_text()))
    assert got[column].notna().all()
    assert got[column].tolist() == pytest.approx(want[column].tolist(), rel=1e-6)
    assert got["flags"].fillna("").tolist() == want["flags"].tolist()           # nothing above the peak
    assert got["bottleneck"].tolist() == want["bottleneck"].tolist()


def test_a_metric_in_an_unknown_unit_is_missing_and_named_with_its_unit(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_NCU_MODE", "unit-odd")            # gpu__time_duration.sum in "cycle"
    out = tmp_path / "out"
    assert main([*ARGS, "--out", str(out)]) == 0
    d = _profile_dir(out, "annotation")
    trace = json.loads((d / "trace.json").read_text())
    build, *rest = trace["stages"]
    assert all(s["elapsed_seconds"] is None for s in rest)                # no time, not cycles read as ns
    # The build only copies: no kernel of its own, in the capture or the worker's compile record.
    assert build["ncu"]["kernels"] == 0 and build["ncu"]["bottleneck"] == "no kernels"
    assert trace["summary"]["duration_us"] is None
    report = (d / "report.md").read_text()
    listing = report.split("## Missing readings")[1].split("\n## ")[0]
    assert "gpu__time_duration.sum (unit 'cycle' not understood" in listing
    assert "kernel time n/a" in report.split("\n## ")[0]


@pytest.mark.parametrize("mode,code,fragment", [
    ("failed-refine", 2, 'reported an error (exit 0) after'),     # ncu: ==ERROR== Failed to profile, exit 0
    ("header-only", 8, "has its header and units rows but no kernel rows"),
    ("trunc-mid", 8, "ends inside a quoted cell: the output was cut off"),
])
def test_a_capture_short_of_kernels_is_refused_in_one_line(tmp_path, capsys, monkeypatch, mode, code, fragment):
    monkeypatch.setenv("FAKE_NCU_MODE", mode)
    out = tmp_path / "out"
    assert main([*ARGS, "--out", str(out)]) == code
    err = _one_error_line(capsys)
    assert fragment in err, err
    if mode == "failed-refine":
        assert err.endswith('==ERROR== Failed to profile "refine" in process 1')     # the line itself, no CSV
    assert not out.exists()


def test_a_stage_whose_kernels_are_not_in_the_capture_is_missing_not_zero(tmp_path, monkeypatch):
    """The refine row gone with nothing said (exit 0): predicate_refine ran on the GPU and its kernel time is
    unknown, not 0.0 us, and so is the iteration's."""
    monkeypatch.setenv("FAKE_NCU_MODE", "drop-refine")
    out = tmp_path / "out"
    assert main([*ARGS, "--out", str(out)]) == 0
    d = _profile_dir(out, "annotation")
    trace = json.loads((d / "trace.json").read_text())
    by = {s["name"]: s for s in trace["stages"]}
    refine = by["predicate_refine"]
    assert refine["elapsed_seconds"] is None and refine["ncu"]["duration_us"] is None and refine["ncu"]["unprofiled"]
    assert by["bounds"]["elapsed_seconds"] > 0 and not by["bounds"]["ncu"]["unprofiled"]
    assert trace["total_elapsed_seconds"] is None
    assert trace["summary"]["duration_us"] is None and "predicate_refine" in trace["summary"]["missing"]["duration_us"]
    report = (d / "report.md").read_text()
    assert "kernel time n/a (no kernel profiled in predicate_refine, which ran on the GPU)" in report
    row = next(line for line in report.splitlines() if line.startswith("| predicate_refine |"))
    assert "| n/a |" in row and "0.0" not in row and "no kernel profiled" in row
    assert "**Bottleneck:** n/a" in report


def test_the_cause_leads_a_failure_line_not_the_warnings_after_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FAKE_NCU_MODE", "stdout-err")       # ==ERROR== on stdout, 4 warning lines on stderr
    assert main([*ARGS, "--out", str(tmp_path / "out")]) == 2
    err = _one_error_line(capsys)
    assert err.split(" s: ", 1)[1].startswith('==ERROR== LaunchFailed: an illegal memory access'), err


@pytest.mark.parametrize("export,fragment", [
    ("source:trunc-mid", "the source page exported from profile.ncu-rep"),    # was a traceback (None.strip())
    ("details:trunc-mid", "the details page exported from profile.ncu-rep"),  # was 182 rule results of 313
    ("raw:trunc-rows", f"the raw page holds {KERNELS - 8} kernels, the details page {KERNELS}"),
    ("raw:drop-refine", f"the raw page holds {KERNELS - 1} kernels, the details page {KERNELS}"),
    ("source:drop-refine", "has 71 cells, the header of kernel 'point_candidates' 70"),   # refine's rows under it
    ("source:drop-last-block", f"the raw page holds {KERNELS} kernels, the source page {KERNELS - 1}"),
])
def test_a_damaged_export_is_refused_in_one_line(tmp_path, capsys, monkeypatch, export, fragment):
    monkeypatch.setenv("FAKE_NCU_EXPORT", export)
    out = tmp_path / "out"
    assert main(["join", "v2", *SMALL, "--prof_type", "ncu", "--ncu", str(FAKE), "--out", str(out)]) == 8
    err = _one_error_line(capsys)
    assert fragment in err and "re-run the profile" in err, err
    if "trunc-mid" in export:
        assert "the row at line " in err
    assert not out.exists()


def test_an_ncu_older_than_the_column_maps_runs_after_a_warning_and_one_with_no_version_is_refused(
        tmp_path, capsys, monkeypatch):
    calls = tmp_path / "calls"
    monkeypatch.setenv("FAKE_NCU_VERSION", "Version 2019.4.0 (build 27400000)")
    monkeypatch.setenv("FAKE_NCU_CALLS", str(calls))
    out = tmp_path / "out"
    assert main([*ARGS, "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "warning: ncu 2019.4.0" in err and "older than 2025.3" in err and "shown as missing" in err
    assert calls.read_text().split()[0] == "--version"            # asked before the run
    (report,) = out.glob("profiles/*/*/*/*/report.md")
    assert "ncu 2019.4.0 --clock-control none" in report.read_text()      # the report names the ncu that ran
    monkeypatch.setenv("FAKE_NCU_VERSION", "")
    calls.unlink()
    assert main([*ARGS, "--out", str(tmp_path / "out2")]) == 6
    assert "could not read the version of ncu" in _one_error_line(capsys)
    assert calls.read_text().split() == ["--version"]            # asked its version, profiled nothing
    assert not (tmp_path / "out2").exists()


def test_an_ncu_refusing_an_option_is_told_which_release_it_needs(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("FAKE_NCU_MODE", "oldopts")
    assert main(["join", "v2", *SMALL, "--prof_type", "ncu", "--ncu", str(FAKE), "--out", str(tmp_path / "o")]) == 2
    err = _one_error_line(capsys)
    assert "unrecognised option '--import-source'" in err and "Nsight Compute 2025.3 and newer" in err, err


def test_the_ncu_version_read_before_the_run_is_recorded(tmp_path, monkeypatch):
    calls = tmp_path / "calls"
    monkeypatch.setenv("FAKE_NCU_CALLS", str(calls))
    out = tmp_path / "out"
    assert main([*ARGS, "--out", str(out)]) == 0
    d = _profile_dir(out, "annotation")
    assert json.loads((d / "params.json").read_text())["tools"]["ncu"] == "2025.3.1.0"
    assert json.loads((d / "trace.json").read_text())["metadata"]["tool"]["version"] == "2025.3.1.0"
    assert calls.read_text().split()[0] == "--version"          # read first, once
    assert calls.read_text().split().count("--version") == 1


def test_a_source_page_repeating_each_kernel_is_read_once_per_kernel(tmp_path):
    """The real ncu 2025.3.1 printed every kernel's SASS block twice, identical, in join v2's source page on
    the H200 (2026-11-29; the committed capture holds the page as printed): one kernel each, not a second
    launch, and the pages still agree."""
    assert fixture_text("ncu/join.full.source.csv").count('"Kernel Name"') == 2 * KERNELS
    out = tmp_path / "out"
    assert main(["join", "v2", *SMALL, "--prof_type", "ncu", "--ncu", str(FAKE), "--out", str(out)]) == 0
    d = _profile_dir(out, "ncu")
    assert len(list((d / "sass").glob("*.csv"))) == KERNELS and len(list((d / "hot").glob("*.md"))) == KERNELS
    assert any(p.name.endswith("_point_candidates_2.csv") for p in (d / "sass").glob("*.csv"))  # a real relaunch
