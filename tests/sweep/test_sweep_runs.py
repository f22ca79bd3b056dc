"""Sweeps for real, on the CPU: Dask worker processes, a scheduler and workers started as separate
processes, a worker killed mid-sweep, Ctrl-C then --resume, failing points retried elsewhere.

Every point is a real profile (a child `python -m app.kernel` checked against shapely)."""
import csv
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import child_env
from tests.signals import sigint_default

GRID = ["--grid", "points=1500,3k", "--polygons", "150", "--device", "cpu", "--bench_runs", "2", "--warmup", "0"]


def env(**extra):
    return child_env(PYTHONUNBUFFERED="1", **extra)


def sweep(tmp_path, *args, check=True, **kw):
    proc = subprocess.run([sys.executable, "-m", "app.kernel", "sweep", "join", *args, "--out", str(tmp_path)],
                          capture_output=True, text=True, env=env(), timeout=300, **kw)
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def folder(tmp_path) -> Path:
    (found,) = (tmp_path / "sweeps" / "join").glob("*/*/")
    return found


def rows(sweep_dir: Path) -> list[dict]:
    with open(sweep_dir / "results.csv") as f:
        return list(csv.DictReader(f))


def check_points_are_real_profiles(sweep_dir: Path, table: list[dict]):
    for r in table:
        trace = json.loads((sweep_dir / r["profile"] / "trace.json").read_text())
        assert trace["metadata"]["verification"]["matches"] is True
        assert trace["metadata"]["params"]["points"] == int(r["points"])
        assert float(r["e2e_us"]) == pytest.approx(trace["timing"]["total"]["median"] * 1e6)
        assert float(r["e2e_host_out_us"]) == pytest.approx(trace["timing"]["end_to_end"]["median"] * 1e6)
        pace = trace["timing"]["host_pace"]           # the point's own process's host pace, as its trace has it
        assert float(r["host_pace_us"]) == pytest.approx(pace["median"] * 1e6)
        if pace["runs"] >= 6:
            assert [float(r["host_pace_ci95_lo_us"]), float(r["host_pace_ci95_hi_us"])] == pytest.approx(
                [v * 1e6 for v in pace["median_ci95"]])
        else:               # too few runs for a 95% interval: missing in the trace and the table alike
            assert pace["median_ci95"] == [None, None] and r["host_pace_ci95_lo_us"] == r["host_pace_ci95_hi_us"] == ""
        assert f"| {r['point']} | ok | " in (sweep_dir / "report.md").read_text().split("## Points")[1]
        assert f" | {float(r['host_pace_us']):,.1f} us | " in (sweep_dir / "report.md").read_text()


def test_local_cluster_of_two_workers_runs_every_point(tmp_path):
    proc = sweep(tmp_path, "v1,v2", *GRID, "--cluster", "local", "--workers", "2")
    d = folder(tmp_path)
    table = rows(d)
    assert len(table) == 4 and {r["status"] for r in table} == {"ok"}
    assert {r["version"] for r in table} == {"v1", "v2"} and {r["points"] for r in table} == {"1500", "3000"}
    assert all(r["worker"].startswith("tcp://") for r in table)
    check_points_are_real_profiles(d, table)
    report = (d / "report.md").read_text()
    assert "Dask LocalCluster, 2 worker processes" in report and "## Best version per size" in report
    assert "CPU points took turns" in report
    assert (d / "scaling.png").read_bytes()[:4] == b"\x89PNG" and (d / "speedup.png").exists()
    assert "sweep: 4 points, 4 ok" in proc.stdout


@pytest.fixture
def dask_cluster(tmp_path):
    """A `dask scheduler` and two `dask worker` processes (no nanny: killing one kills the worker).

    Started through the modules behind those commands, so a Dask installed without its scripts
    (pip --target, as on the lent GPU machines) works too."""
    sched_file = tmp_path / "scheduler.json"
    scheduler = [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", "0",
                 "--scheduler-file", str(sched_file), "--no-dashboard"]
    procs = [subprocess.Popen(scheduler, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    deadline = time.monotonic() + 60
    while not sched_file.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    address = json.loads(sched_file.read_text())["address"]
    for _ in range(2):
        worker = [sys.executable, "-m", "distributed.cli.dask_worker", address, "--nthreads", "1", "--no-nanny",
                  "--no-dashboard", "--local-directory", str(tmp_path / "scratch")]
        procs.append(subprocess.Popen(worker, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    from distributed import Client

    with Client(address, timeout=30) as client:       # both workers registered before the sweep starts
        client.wait_for_workers(2, timeout=60)
    yield address, procs[1:]
    for p in procs:
        p.kill()
        p.wait()


def test_against_a_scheduler_and_two_workers_started_apart(tmp_path, dask_cluster):
    address, _ = dask_cluster
    sweep(tmp_path, "v1,v2", *GRID, "--cluster", address)
    d = folder(tmp_path)
    table = rows(d)
    assert {r["status"] for r in table} == {"ok"} and len(table) == 4
    assert f"Dask scheduler {address}, 2 workers at start" in (d / "report.md").read_text()
    check_points_are_real_profiles(d, table)


def _profiling_child(pid: int) -> bool:
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmd = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == pid and b"app.kernel" in cmd:
            return True
    return False


def test_a_worker_killed_mid_point_is_replaced_and_the_sweep_completes(tmp_path, dask_cluster):
    address, workers = dask_cluster
    grid = ["--grid", "points=20k,40k,60k", "--polygons", "300", "--device", "cpu", "--bench_runs", "3"]
    proc = subprocess.Popen([sys.executable, "-m", "app.kernel", "sweep", "join", "v1", *grid, "--cluster", address,
                             "--out", str(tmp_path)], env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    victim, deadline = None, time.monotonic() + 120
    while victim is None and time.monotonic() < deadline:
        victim = next((w for w in workers if _profiling_child(w.pid)), None)
        time.sleep(0.05)
    assert victim is not None, "no worker ever ran a point"
    victim.kill()                                     # mid-point: its profile child dies with it
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    d = folder(tmp_path)
    table = rows(d)
    assert len(table) == 3 and {r["status"] for r in table} == {"ok"}
    # the point it was profiling, and any it held waiting for the device, ran again elsewhere
    lost = [r for r in table if int(r["worker_lost"]) > 0]
    assert 1 <= len(lost) <= 2, table
    survivor = next(w for w in workers if w is not victim)
    assert survivor.poll() is None
    assert "worker lost 1x" in (d / "report.md").read_text()
    check_points_are_real_profiles(d, table)
    # The killed worker's point folder is in its own Dask directory, and the next worker Dask starts there removes it.
    left = list((tmp_path / "scratch").rglob("app-kernel-sweep-*"))
    assert len(left) == 1 and left[0].parent.name.startswith("worker-"), left
    from distributed.diskutils import WorkSpace

    WorkSpace(str(tmp_path / "scratch" / "dask-scratch-space")).new_work_dir(prefix="worker-").release()
    assert not left[0].exists()


def _leftovers(mark: str) -> list[int]:
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if f"SWEEP_TEST_MARK={mark}".encode() in environ.read_bytes():
                found.append(int(environ.parent.name))
        except OSError:
            continue
    return found


def test_ctrl_c_keeps_finished_points_stops_the_cluster_and_resume_runs_the_rest(tmp_path):
    """Ctrl-C in a terminal: SIGINT to the whole process group, the sweep, its Dask workers and their profiles. The
    sweep stops the cluster; the workers ignore the signal and print no traceback of theirs."""
    mark = uuid.uuid4().hex
    grid = ["--grid", "points=1k,2k,3k,4k", "--polygons", "100", "--device", "cpu", "--bench_runs", "2"]
    proc = subprocess.Popen([sys.executable, "-m", "app.kernel", "sweep", "join", "v1", *grid, "--workers", "2",
                             "--out", str(tmp_path)], env=env(SWEEP_TEST_MARK=mark), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=sigint_default, start_new_session=True)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        found = list((tmp_path / "sweeps").glob("join/*/*/results.csv"))
        if found and len(rows(found[0].parent)) >= 1:
            break
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGINT)                # the group, as a terminal's Ctrl-C
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    d = folder(tmp_path)
    done = rows(d)
    assert 1 <= len(done) < 4 and {r["status"] for r in done} == {"ok"}
    assert f"interrupted: {len(done)} finished points are kept in {d}" in err
    time.sleep(1.0)
    assert _leftovers(mark) == [], "a worker or a profile outlived the interrupted sweep"
    first = {r["point"]: r["profile"] for r in done}

    resumed = subprocess.run([sys.executable, "-m", "app.kernel", "sweep", "--resume", str(d), "--workers", "1"],
                             capture_output=True, text=True, env=env(), timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"{4 - len(done)} of 4 points to run ({len(done)} done before)" in resumed.stderr
    table = rows(d)
    assert len(table) == 4 and {r["status"] for r in table} == {"ok"}
    for point, profile in first.items():             # finished points were not run again
        assert next(r["profile"] for r in table if r["point"] == point) == profile
        assert len(list((d / "points" / point).iterdir())) == 1
    report = (d / "report.md").read_text()           # both runs that made the table, each with its own command
    assert "- Ran on: Dask LocalCluster, 2 worker processes; wall time " in report
    assert "; interrupted; command " in report
    assert "- Resumed on: this process, one point at a time (no Dask); wall time " in report
    assert f"command `python -m app.kernel sweep --resume {d} --workers 1`." in report


def test_a_failing_point_is_retried_once_on_the_other_worker_and_listed(tmp_path):
    # ncu mode cannot run here (no GPU in CI; on a GPU machine $NCU names no program): every point fails.
    proc = subprocess.run([sys.executable, "-m", "app.kernel", "sweep", "join", "v1", "--grid", "points=1k,2k",
                           "--polygons", "100", "--prof_type", "ncu", "--workers", "2", "--out", str(tmp_path)],
                          capture_output=True, text=True, env=env(NCU="/nonexistent/ncu"), timeout=300)
    assert proc.returncode == 1
    d = folder(tmp_path)
    table = rows(d)
    assert {r["status"] for r in table} == {"failed"} and {r["attempts"] for r in table} == {"2"}
    assert all(r["error"].startswith("error:") for r in table)
    for r in table:
        logs = sorted((d / "points" / r["point"]).glob("attempt-*-failed.log"))
        assert [p.name for p in logs] == ["attempt-1-failed.log", "attempt-2-failed.log"]
        first, second = (p.read_text().splitlines()[0] for p in logs)
        assert first != second                        # the retry ran on the other worker
    report = (d / "report.md").read_text()
    assert "## Failures" in report and "No point finished with a verified result" in report
    assert f"{table[0]['point']}: failed: error:" in proc.stdout


@pytest.mark.parametrize("args, message", [
    (["--grid", "pionts=1k"], "join has no parameter 'pionts'"),
    (["--grid", "points"], "write NAME=V1,V2"),
    (["--grid", "points=1k,1k"], "repeats a value"),
    (["--grid", "points=1k", "--points", "5"], "both fixed and a --grid axis"),
    (["--grid", "points=ten"], "--points expects int"),
    (["--grid", "points=1k", "--cluster", "nowhere"], "use local, local-cuda or a scheduler address"),
    (["--grid", "points=1k", "--cluster", "tcp://127.0.0.1:9"], "cannot reach a Dask scheduler"),
    (["--grid", "points=1k", "--workers", "0"], "--workers expects a whole number >= 1"),
    (["--resume", "/nonexistent/sweep"], "no sweep.json there"),
    ([], "a sweep needs at least one --grid"),
    (["--grid", "points=1k", "--prof_type", "ncu", "--bench_runs", "5"], "profiles one warm iteration"),
    (["--grid", "points=1k", "--prof_type", "nsys", "--bench_runs", "auto"], "auto is event mode's"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, args, message):
    proc = subprocess.run([sys.executable, "-m", "app.kernel", "sweep", "join", *args, "--out", str(tmp_path)],
                          capture_output=True, text=True, env=env(), timeout=120)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "sweeps").exists()


def test_without_dask_the_points_run_one_after_another(tmp_path, monkeypatch, capsys):
    from app.kernel.cli import main

    monkeypatch.setitem(sys.modules, "distributed", None)        # import distributed -> ImportError
    assert main(["sweep", "join", "v1", "--grid", "points=1k", "--polygons", "50", "--device", "cpu",
                 "--bench_runs", "2", "--out", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "Dask is not installed, so the points run one after another" in err and "pip install -e '.[dask]'" in err
    assert rows(folder(tmp_path))[0]["status"] == "ok"


def test_versions_that_run_one_versions_stages_on_the_cpu_are_named(tmp_path, monkeypatch):
    """join v4 runs v1's stages on the CPU: a CPU sweep of both says their ranking there is noise; v2 is its own."""
    from app.kernel.cli import main

    monkeypatch.setitem(sys.modules, "distributed", None)
    assert main(["sweep", "join", "v1,v2,v4", "--grid", "points=1k", "--polygons", "50", "--device", "cpu",
                 "--bench_runs", "2", "--warmup", "0", "--out", str(tmp_path)]) == 0
    report = (folder(tmp_path) / "report.md").read_text()
    assert ("- On the CPU, join v1 and v4 both run v1's stages (the versions differ in their GPU kernels only): their "
            "CPU points time the same code, so which of them is best there, and where they cross, is the runs' "
            "noise, not the versions'.") in report
    assert "v2 both run" not in report and "v2 and" not in report.split("## Best")[0]


def test_versions_of_one_code_on_the_cpu_have_no_winner_in_the_best_table(tmp_path, monkeypatch):
    """join v1 and v4 on the CPU time the same stages: whichever reads faster, the best row says it is no winner."""
    from app.kernel.cli import main

    monkeypatch.setitem(sys.modules, "distributed", None)
    assert main(["sweep", "join", "v1,v4", "--grid", "points=1k", "--polygons", "50", "--device", "cpu",
                 "--bench_runs", "2", "--warmup", "0", "--out", str(tmp_path)]) == 0
    best = (folder(tmp_path) / "report.md").read_text().split("## Best version per size")[1].split("\n\n")[1]
    row = best.splitlines()[2]
    assert {row.split(" | ")[1], row.split(" | ")[3]} == {"v1", "v4"}, best
    assert row.endswith("(the same code on the CPU: no winner, the runs' noise) |"), row


def test_a_gpu_point_sees_only_its_workers_own_gpu(monkeypatch):
    """dask-cuda lists a worker's own GPU first, then the node's others: the profile gets the first only."""
    from app.sweep.point import child_environment

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,3,0,1")
    assert child_environment("gpu", {})["CUDA_VISIBLE_DEVICES"] == "2"
    assert child_environment("auto", {"MALLOC_TRIM_THRESHOLD_": None})["CUDA_VISIBLE_DEVICES"] == "2"
    assert child_environment("cpu", {})["CUDA_VISIBLE_DEVICES"] == "2,3,0,1"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8afea666")
    assert child_environment("gpu", {})["CUDA_VISIBLE_DEVICES"] == "GPU-8afea666"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    env = child_environment("gpu", {"MALLOC_TRIM_THRESHOLD_": "1", "OMP_NUM_THREADS": None})
    assert "CUDA_VISIBLE_DEVICES" not in env and env["MALLOC_TRIM_THRESHOLD_"] == "1" and "OMP_NUM_THREADS" not in env
    assert env["APP_LOCK_WAIT"] == "3600"


def test_a_point_whose_check_could_not_run_is_unverified_not_retried(tmp_path):
    """Exit 10 (the oracle could not run: here shapely fails to import in the point's process) is no failure to
    retry -- the oracle fails the same way again -- and no result: 'unverified', kept out of every fit."""
    broken = tmp_path / "broken"
    (broken / "shapely").mkdir(parents=True)
    (broken / "shapely" / "__init__.py").write_text('raise ImportError("shapely is broken here (a test)")\n')
    e = env()
    e["PYTHONPATH"] = os.pathsep.join((str(broken), e["PYTHONPATH"]))
    proc = subprocess.run([sys.executable, "-m", "app.kernel", "sweep", "join", "v1", "--grid", "points=1k",
                           "--polygons", "50", "--device", "cpu", "--bench_runs", "2", "--workers", "1",
                           "--out", str(tmp_path / "out")], capture_output=True, text=True, env=e, timeout=300)
    assert proc.returncode == 1, proc.stderr[-2000:]
    (row,) = rows(folder(tmp_path / "out"))
    assert row["status"] == "unverified" and row["attempts"] == "1", row
    assert "verification could not run (ImportError: shapely is broken here" in row["error"]
    assert "1 not ok (failed, wrong or unverified)" in proc.stdout
