"""Sizes that cannot fit are refused before any allocation, naming the limit."""
import time

import pytest

from app.errors import BadParameter
from app.kernel.cli import main
from app.kernel.plan import get_plan_class
from app.runtime.memory import INDEX_LIMIT, available_host_bytes, check_fits


def plan(kernel, **params):
    return get_plan_class(kernel, None)(params)


def _meminfo_available() -> int:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))


def test_free_host_memory_is_read_from_proc_meminfo():
    assert abs(available_host_bytes() - _meminfo_available()) < 2**30     # it moves a little between reads


def test_meminfo_is_read_in_kilobytes_and_an_unreadable_one_gives_nothing(tmp_path):
    info = tmp_path / "meminfo"
    info.write_text("MemTotal:       2048 kB\nMemFree:         100 kB\nMemAvailable:    1000 kB\n")
    assert available_host_bytes(str(info)) == 1_024_000
    info.write_text("MemTotal:       2048 kB\nMemAvailable:\n")
    assert available_host_bytes(str(info)) is None
    assert available_host_bytes(str(tmp_path / "missing")) is None


def test_a_size_beyond_this_hosts_free_memory_is_refused_without_being_told_the_free_memory():
    have = _meminfo_available()
    points = have // 200                                                   # needs > 236 B a point on the host
    if points >= INDEX_LIMIT:
        pytest.skip(f"this host has {have / 1e9:.0f} GB free: a size past it passes the 32-bit index limit")
    with pytest.raises(BadParameter, match="of host memory and"):
        check_fits(plan("join", points=points, polygons=10), "cpu")


def test_index_limit_of_the_kernels():
    with pytest.raises(BadParameter, match=r"points = 2,147,483,648 exceeds the kernels. 32-bit index limit"):
        check_fits(plan("join", points=INDEX_LIMIT + 1), "gpu", host_bytes=10**15, device_free=10**15)
    with pytest.raises(BadParameter, match="segments = .* exceeds"):
        check_fits(plan("overlay", left=70_000_000, right=70_000_000), "cpu", host_bytes=10**15)


def test_gpu_memory_and_the_largest_size_that_fits():
    p = plan("join", points=100_000_000, polygons=10_000)
    check_fits(p, "gpu", host_bytes=10**12, device_free=10**12)              # fits
    with pytest.raises(BadParameter) as err:
        check_fits(p, "gpu", host_bytes=10**12, device_free=4 * 10**9)
    msg = str(err.value)
    assert "of GPU memory and 4.0 GB is free; use at most about --points" in msg
    most = int(msg.split("--points ")[1].split(" ")[0].replace(",", ""))
    check_fits(plan("join", points=most, polygons=10_000), "gpu", host_bytes=10**12, device_free=4 * 10**9)
    with pytest.raises(BadParameter):
        check_fits(plan("join", points=most + 100, polygons=10_000), "gpu", host_bytes=10**12, device_free=4 * 10**9)


def test_on_the_cpu_device_buffers_count_as_host_memory():
    p = plan("join", points=1_000_000)
    fp = p.footprint()
    check_fits(p, "cpu", host_bytes=fp.host_bytes + fp.device_bytes)
    with pytest.raises(BadParameter, match="host memory"):
        check_fits(p, "cpu", host_bytes=fp.host_bytes + fp.device_bytes - 1)


def test_on_the_gpu_device_buffers_are_not_host_memory():
    """A GPU run needs its host buffers on the host and its device buffers on the GPU, not both on the host; and
    the largest size it suggests for the host counts only the host's share."""
    p = plan("join", points=1_000_000)
    fp = p.footprint()
    check_fits(p, "gpu", host_bytes=fp.host_bytes, device_free=fp.device_bytes)
    with pytest.raises(BadParameter) as err:
        check_fits(p, "gpu", host_bytes=fp.host_bytes // 2, device_free=10**12)
    most = int(str(err.value).split("--points ")[1].split(" ")[0].replace(",", ""))
    check_fits(plan("join", points=most), "gpu", host_bytes=fp.host_bytes // 2, device_free=10**12)
    assert most > 400_000                   # about half the points: the device's bytes are not in the host's need


def test_a_size_of_one_that_fits_exactly_is_suggested():
    """Where the smallest size needs exactly what is free it fits (only more than free is refused), so the advice
    is that size, not "even 1 does not fit"."""
    one = plan("join", points=1, polygons=10_000).footprint()
    exact = one.host_bytes + one.device_bytes                # a CPU run: both on the host
    check_fits(plan("join", points=1, polygons=10_000), "cpu", host_bytes=exact)
    with pytest.raises(BadParameter, match=r"use at most about --points 1 \(with the other sizes unchanged\)$"):
        check_fits(plan("join", points=1_000_000, polygons=10_000), "cpu", host_bytes=exact)
    with pytest.raises(BadParameter, match="even --points 1 does not fit"):
        check_fits(plan("join", points=1_000_000, polygons=10_000), "cpu", host_bytes=exact - 1)


def test_when_no_single_size_helps():
    with pytest.raises(BadParameter, match="even --left 1 does not fit: reduce the other sizes"):
        check_fits(plan("overlay", left=1_000_000, right=1_000_000), "cpu", host_bytes=10**8)


@pytest.mark.parametrize("args,fragment", [
    (["join", "--points", str(10**12), "--polygons", "10"], "32-bit index limit"),
    (["join", "--points", "1500000000", "--polygons", "10"], "of host memory and"),
])
def test_cli_refuses_at_once(tmp_path, capsys, args, fragment):
    if "host memory" in fragment and (available_host_bytes() or 0) > 400e9:
        pytest.skip("this machine has enough memory for the case")
    t0 = time.monotonic()
    assert main([*args, "--device", "cpu", "--out", str(tmp_path / "out")]) == 2
    assert time.monotonic() - t0 < 5                                    # nothing was generated first
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and fragment in err[0] and not (tmp_path / "out").exists()


def test_footprint_covers_a_measured_run():
    """join 1M x 100k on the CPU peaked at 538 MB resident (measured with /usr/bin/time -v)."""
    fp = plan("join", points=1_000_000, polygons=100_000).footprint()
    assert fp.host_bytes + fp.device_bytes >= 538e6


@pytest.mark.parametrize("kernel,params,message", [
    ("join", {"vertices": 300_000},           # --polygons stays at its default: only --vertices is named
     "polygon vertices = 3,000,010,000 exceeds the kernels' 32-bit index limit (2,147,483,647); use a smaller "
     "--vertices"),
    ("join", {"points": 1_000, "polygons": 200_000_000},
     "polygon vertices = 3,400,000,000 exceeds the kernels' 32-bit index limit (2,147,483,647); use a smaller "
     "--polygons"),
    ("overlay", {"left": 70_000_000, "right": 70_000_000},
     "segments = 2,380,000,000 exceeds the kernels' 32-bit index limit (2,147,483,647); use a smaller --left or "
     "--right"),
])
def test_the_index_limit_names_the_sizes_raised_above_their_defaults(kernel, params, message):
    with pytest.raises(BadParameter) as err:
        check_fits(plan(kernel, **params), "gpu", host_bytes=10**15, device_free=10**15)
    assert str(err.value) == message


def test_the_largest_vertices_that_fit_start_at_its_minimum_of_3():
    """--vertices has a minimum of 3: the advice is never a count below it, and where 3 does not fit either the
    refusal says so. On the CPU overlay needs 1 kB a vertex of either layer: 200 kB (v + 1) for 100 x 100 polygons
    of v vertices."""
    p = plan("overlay", left=100, right=100, vertices=1_000_000)
    need = "these sizes need about 200.0 GB of host memory and "
    with pytest.raises(BadParameter) as err:
        check_fits(p, "cpu", host_bytes=799_999)                    # --vertices 3 needs 800,000 B
    assert str(err.value) == need + "0.0 GB is free; even --vertices 3 does not fit: reduce the other sizes"
    with pytest.raises(BadParameter) as err:
        check_fits(p, "cpu", host_bytes=800_000)
    assert str(err.value) == need + "0.0 GB is free; use at most about --vertices 3 (with the other sizes unchanged)"
    with pytest.raises(BadParameter) as err:
        check_fits(p, "cpu", host_bytes=10**9)
    assert str(err.value) == need + ("1.0 GB is free; use at most about --vertices 4,999 (with the other sizes "
                                     "unchanged)")
    check_fits(plan("overlay", left=100, right=100, vertices=4_999), "cpu", host_bytes=10**9)
    with pytest.raises(BadParameter, match="even --vertices 3 does not fit"):
        check_fits(plan("overlay", left=100, right=100, vertices=3), "cpu", host_bytes=799_999)


def test_the_sizes_a_need_grows_with_are_listed_most_raised_first():
    """Every whole-number size the need grows with (not --seed), the one furthest above its default first, a tie in
    the parameters' order; only the raised ones when asked, or all where none is raised."""
    from app.runtime.memory import _drivers

    p = plan("join", points=10**9, polygons=10_000)
    assert _drivers(p, lambda f: f.host_bytes) == ["points", "polygons", "vertices"]
    assert _drivers(p, lambda f: f.device_bytes, raised_only=True) == ["points"]
    assert _drivers(p, lambda f: f.indices["polygon vertices"], raised_only=True) == ["polygons", "vertices"]
