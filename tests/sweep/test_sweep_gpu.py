"""On a GPU machine: a local-cuda sweep puts one worker on each GPU, every point records the physical
GPU it ran on, and no point ever waits for another's GPU (run on the lent multi-GPU node)."""
import csv
import subprocess
import sys

import pytest

from tests.conftest import child_env



@pytest.mark.gpu
def test_local_cuda_gives_each_worker_its_own_gpu_and_no_lock_waits(tmp_path):
    pytest.importorskip("dask_cuda", reason="needs dask-cuda: pip install -e '.[dask-cuda]'")
    import cupy

    n = cupy.cuda.runtime.getDeviceCount()
    points = [str(10_000 * (i + 1)) for i in range(max(4, 2 * n))]
    env = child_env()
    proc = subprocess.run([sys.executable, "-m", "app.kernel", "sweep", "join", "v1", "--grid",
                           "points=" + ",".join(points), "--polygons", "2000", "--device", "gpu", "--bench_runs", "3",
                           "--cluster", "local-cuda", "--out", str(tmp_path)], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (results,) = tmp_path.glob("sweeps/join/points/*/results.csv")
    rows = list(csv.DictReader(open(results)))
    assert len(rows) == len(points) and {r["status"] for r in rows} == {"ok"}
    assert {r["runtime"] for r in rows} == {"gpu"} and all(r["gpu_uuid"].startswith("GPU-") for r in rows)
    by_worker = {}
    for r in rows:
        by_worker.setdefault(r["worker"], set()).add(r["gpu_uuid"])
    assert all(len(u) == 1 for u in by_worker.values()), by_worker          # a worker stays on its GPU
    uuids = [next(iter(u)) for u in by_worker.values()]
    assert len(set(uuids)) == len(uuids)                                    # and no two share one
    assert len(uuids) == n                                                  # every GPU took points
    assert not any(r["profile_waited_for_lock"] == "True" for r in rows)
    assert max(float(r["queued_seconds"]) for r in rows) < 1.0
