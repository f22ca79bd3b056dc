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
