"""bench_all runs every kernel and version in one process, checks each output against shapely and
prints one table (tiny sizes here: the ratios that matter are measured on the GPU machine)."""
import re

import pytest

from app.kernel.plan import kernels
from tests.benchmark import bench_all


def test_every_kernel_and_version_in_one_table(capsys):
    assert bench_all.main(["--sizes", "join=2k:200;overlay=300:300", "--no-gpu", "--cpu-runs", "6"]) == 0
    out = capsys.readouterr().out
    table = [line for line in out.splitlines() if line.startswith(("join ", "overlay "))]
    assert len(table) == sum(len(kernels()[k]) for k in ("join", "overlay"))
    assert all("ok=True" in line for line in table)
    # shapely and the CPU plan ran in pairs: the ratio is the pairs' median, inside its interval
    for line in table:
        ratio, lo, hi = (float(x) for x in re.search(r"shapely/cpu\s+(\d+\.\d\d)x \[(\d+\.\d\d)-(\d+\.\d\d)\]",
                                                      line).groups())
        assert 0 < lo <= ratio <= hi
    # each row says how fast the host's CPU ran while that version ran (the versions run one after another)
    loops = [float(re.search(r"host loop (\d+\.\d) us$", line).group(1)) for line in table]   # no launches here
    assert all(loop > 0 for loop in loops)
    # join v3 and v4 differ from v1 on the GPU only: the legend says their cpu column is v1's code again
    for v in ("v3", "v4"):
        assert f"On the CPU, join {v} runs v1's stages (the versions differ in their GPU kernels only)" in out
    assert "join v2 runs" not in out and "overlay v3 runs" not in out


def test_a_median_is_shown_with_its_interval():
    from tests.benchmark.bench_join import e2e_text, ms

    assert ms(0.000365, (0.000352, 0.00038)) == "0.365 ms [0.352-0.380]"
    assert ms(0.000365) == "0.365 ms"
    assert e2e_text({"gpu_e2e": 0.00295, "gpu_e2e_ci": (0.0029, 0.0031), "gpu_e2e_pinned": 0.0016,
                     "gpu_e2e_pinned_ci": (0.0015, 0.0017)}) == \
        "end to end 2.950 ms [2.900-3.100] (inputs in pinned memory 1.600 ms [1.500-1.700])"


def test_bad_sizes_name_the_format():
    with pytest.raises(SystemExit, match="expected KERNEL=A:B"):
        bench_all.parse_sizes("joins=1k:1k")


@pytest.mark.gpu
def test_on_a_gpu_each_row_has_its_graph_replay_and_says_which_inputs_it_serves(capsys):
    assert bench_all.main(["--sizes", "join=20k:2k", "--runs", "6", "--cpu-runs", "1"]) == 0
    table = {line.split()[1]: line for line in capsys.readouterr().out.splitlines() if line.startswith("join ")}
    assert "graph replay" in table["v3"] and "(new data of these counts)" in table["v3"]
    assert "(these sizes only)" in table["v1"] and "(these sizes only)" in table["v2"]
    # Each GPU row also gives end to end with the inputs in pinned memory, its output checked too (ok=True).
    assert all("(inputs in pinned memory " in line and "ok=True" in line for line in table.values())
    # ... and the host's launch pace while that version ran: one launch of an empty kernel, in host time
    for line in table.values():
        launch = float(re.search(r"host loop \d+\.\d us, a launch (\d+\.\d\d) us$", line).group(1))
        assert 0.1 < launch < 1000
    # After the build, end to end and end to end from pinned inputs each come with their median's interval.
    for line in table.values():
        for what in ("gpu after build", "end to end", "inputs in pinned memory"):
            m = re.search(what + r" (\d+\.\d+) ms \[(\d+\.\d+)-(\d+\.\d+)\]", line)
            assert m, f"{what}: no interval in {line}"
            median, lo, hi = (float(x) for x in m.groups())
            assert lo <= median <= hi


def test_every_timed_cpu_plan_run_is_paired_with_a_shapely_run():
    from app.kernel.plan import get_plan_class

    plan = get_plan_class("join", "v1")({"points": 2000, "polygons": 200})
    inputs = plan.make_inputs()
    calls = []
    shapely_once = bench_all._shapely_once("join", inputs)

    def shapely_logged():
        calls.append(len(calls))
        return shapely_once()

    out = bench_all.cpu_beside_shapely(plan, inputs, 6, shapely_logged)
    assert len(calls) == 6 and out["cpu"] > 0 and out["shapely"] > 0
    lo, hi = out["ratio_ci"]
    assert lo <= out["ratio"] <= hi
    few = bench_all.cpu_beside_shapely(plan, inputs, 2, shapely_once)       # the default: two pairs
    assert all(v != v for v in few["ratio_ci"])                             # no 95% interval: missing
    assert bench_all._ratio({"cpu_ratio": few["ratio"], "cpu_ratio_ci": few["ratio_ci"]}).endswith(
        "x [no 95% interval: under 6 pairs]")
