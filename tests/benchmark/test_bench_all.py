"""bench_all runs every kernel and version in one process, checks each output against shapely and
prints one table (tiny sizes here: the ratios that matter are measured on the GPU machine)."""
import pytest

from app.kernel.plan import kernels
from tests.benchmark import bench_all


def test_every_kernel_and_version_in_one_table(capsys):
    assert bench_all.main(["--sizes", "join=2k:200;overlay=300:300", "--no-gpu", "--cpu-runs", "1",
                           "--shapely-runs", "1"]) == 0
    out = capsys.readouterr().out
    table = [line for line in out.splitlines() if "shapely/cpu" in line]
    assert len(table) == sum(len(kernels()[k]) for k in ("join", "overlay"))
    assert all("ok=True" in line for line in table)


def test_bad_sizes_name_the_format():
    with pytest.raises(SystemExit, match="expected KERNEL=A:B"):
        bench_all.parse_sizes("joins=1k:1k")


@pytest.mark.gpu
def test_on_a_gpu_each_row_has_its_graph_replay_and_says_which_inputs_it_serves(capsys):
    assert bench_all.main(["--sizes", "join=20k:2k", "--runs", "3", "--cpu-runs", "1", "--shapely-runs", "1"]) == 0
    table = {line.split()[1]: line for line in capsys.readouterr().out.splitlines() if "shapely/cpu" in line}
    assert "graph replay" in table["v3"] and "(any input that fits)" in table["v3"]
    assert "(these sizes only)" in table["v1"] and "(these sizes only)" in table["v2"]
    # Each GPU row also gives end to end with the inputs in pinned memory, its output checked too (ok=True).
    assert all("(inputs in pinned memory " in line and "ok=True" in line for line in table.values())
