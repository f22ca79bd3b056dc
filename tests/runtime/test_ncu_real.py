"""Real Nsight Compute runs on the lent GPU machine (skipped without a GPU and ncu)."""
import json
import shutil

import pytest

from app.kernel.cli import main

SHORT_KERNEL_US = 10.0   # kernels shorter than this get a wider tolerance on their rates (see the agreement test)

pytestmark = [pytest.mark.gpu, pytest.mark.ncu,
              pytest.mark.skipif(not shutil.which("ncu"), reason="ncu is not on PATH")]


@pytest.mark.parametrize("kernel,args", [("join", ["--points", "20000", "--polygons", "2000"]),
                                         ("overlay", ["--left", "2000", "--right", "2000"])])
def test_annotation_attributes_every_kernel_to_a_stage(tmp_path, kernel, args):
    out = tmp_path / "out"
    assert main([kernel, *args, "--prof_type", "annotation", "--out", str(out)]) == 0
    (d,) = list(out.glob(f"profiles/annotation/{kernel}/*/*"))
    trace = json.loads((d / "trace.json").read_text())
    assert trace["selected_runtime"] == "gpu" and trace["metadata"]["kernels_outside_stages"] == 0
    device_stages = [s for s in trace["stages"] if s["name"] != "owned_buffer_build"]
    assert all(s["metadata"]["kernels"] > 0 and s["elapsed_seconds"] > 0 for s in device_stages)
    # The first device stage reads what the cost model says it must, give or take caching.
    first = device_stages[0]
    ratio = first["ncu"]["dram_bytes"] / first["cost"]["bytes"]
    assert 0.3 < ratio < 3.0, ratio
    assert (d / "roofline.png").stat().st_size > 10_000 and (d / "bandwidth.png").stat().st_size > 10_000
    report = (d / "report.md").read_text()
    assert "-lineinfo" in report and "Output matches shapely" in report


def test_ncu_full_keeps_report_rules_and_sass(tmp_path):
    out = tmp_path / "out"
    assert main(["join", "--points", "20000", "--polygons", "2000", "--prof_type", "ncu", "--out", str(out)]) == 0
    (d,) = list(out.glob("profiles/ncu/join/*/*"))
    names = {p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file()}
    assert {"report.md", "report-verbose.md", "profile.ncu-rep", "ncu_rules.csv", "roofline.png"} <= names
    assert any(n.startswith("sass/") and n.endswith(".csv") for n in names)
    assert any(n.endswith(".ptx") for n in names)
    report = (d / "report.md").read_text()
    assert "## NCU rule results" in report and "## Hot spots (CUDA source lines" in report
    assert "Output matches shapely" in report
    refine = next(p for p in (d / "hot").glob("*_refine.md")).read_text()
    first = next(line for line in refine.splitlines() if line.startswith("| 1 |"))
    assert "app/kernel/" in first and ".cu" in first          # a CUDA source line, found through -lineinfo


def test_annotation_and_ncu_agree_on_the_same_kernels(tmp_path):
    tables = {}
    for mode in ("annotation", "ncu"):
        out = tmp_path / mode
        assert main(["overlay", "v2", "--left", "2000", "--right", "2000", "--prof_type", mode,
                     "--out", str(out)]) == 0
        (d,) = list(out.glob(f"profiles/{mode}/overlay/*/*"))
        tables[mode] = (d / "kernels.csv").read_text().splitlines()
    import csv

    ann, full = ([dict(r) for r in csv.DictReader(t)] for t in (tables["annotation"], tables["ncu"]))
    assert [r["kernel"] for r in ann] == [r["kernel"] for r in full]
    for a, f in zip(ann, full):
        assert a["fp64_flops"] == f["fp64_flops"] and a["registers"] == f["registers"], a["kernel"]
        # Rates are per unit of the kernel's own duration, which varies from one launch to the next by a
        # microsecond or so: over a kernel of a few microseconds that alone moves a rate by 15-20% (on an
        # H200 node scan_i32_i32, ~3 us, read SM 13.44% in one mode and 11.39% in the other; grid_zero 18.87%
        # and 15.56%). Longer kernels are held to 15%.
        short = min(float(a["duration_us"]), float(f["duration_us"])) < SHORT_KERNEL_US
        for col in ("dram_pct", "sm_pct"):
            x, y = float(a[col]), float(f[col])
            assert abs(x - y) <= max(1.0, (0.25 if short else 0.15) * max(x, y)), (a["kernel"], col, x, y)
