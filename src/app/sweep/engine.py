"""Run a sweep's points on Dask (or one after another), retry failures once, show progress.

No scheduler of our own: ``distributed.LocalCluster`` (``--cluster local``),
``dask_cuda.LocalCUDACluster`` (``local-cuda``: one worker pinned to each visible GPU) or
an existing scheduler (``tcp://HOST:PORT``) places the points. A point whose profile
fails, or whose worker dies, is run once more, on another worker where there is one. Each
finished point is written at once (its profile folder, then results.csv), so Ctrl-C or a
crash keeps everything that finished.
"""
from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path

from app.errors import BadParameter
from app.report.writer import write_profile
from app.sweep.point import failure_line, run_point, sweep_environment
from app.sweep.results import row_for, trace_of, write_results

CLUSTERS = ("local", "local-cuda")          # or a scheduler address
MAX_ATTEMPTS = 2                              # a failed point is retried once
DASK_HINT = "pip install -e '.[dask]' (and '.[dask-cuda]' for --cluster local-cuda)"
# For the clusters a sweep starts itself: a saturation of 1.0 hands a worker one point at a time, so the
# scheduler keeps the rest and each worker that frees up takes the largest point left (no second point
# parked behind a busy one while another worker idles). Dask's default, 1.1, queues two on a one-thread
# worker. (Forking workers from a preloaded server instead of spawning them was tried: on a node of four
# H200s the cluster then started in 4.4-4.9 s instead of 3.5 s.)
LOCAL_CLUSTER_CONFIG = {"distributed.scheduler.worker-saturation": 1.0}


class Sequential:
    """Points one after another in this process's children: no Dask needed."""

    description = "this process, one point at a time (no Dask)"
    parallel = False

    def __init__(self):
        self._queue = []
        self._env = sweep_environment()

    def submit(self, point, args, timeout, device, avoid=None):
        self._queue.append((point, args, timeout, device))
        return point["id"]

    def running(self) -> int:
        return min(len(self._queue), 1)

    def next_done(self):
        """(handle, result) of the next finished point, or None when none is left."""
        if not self._queue:
            return None
        point, args, timeout, device = self._queue.pop(0)
        return point["id"], run_point(args, timeout, device, self._env)

    def worker_lost(self, handle) -> int:
        return 0

    def close(self):
        self._queue.clear()


class DaskRunner:
    parallel = True

    def __init__(self, client, cluster, description: str):
        from distributed import as_completed

        self.client, self.cluster, self.description = client, cluster, description
        self._done = as_completed([], with_results=False)
        self._flying = {}
        self._env = sweep_environment()

    def submit(self, point, args, timeout, device, avoid=None):
        """Largest points first (``priority``): the last to finish are then the short ones, so the
        workers finish together rather than one of them running a big point alone at the end."""
        others = [w for w in self.client.scheduler_info()["workers"] if w != avoid] if avoid else []
        where = {"workers": others, "allow_other_workers": False} if others else {}
        future = self.client.submit(run_point, args, timeout, device, self._env,
                                    key=f"point-{point['id']}-{time.time_ns()}", pure=False,
                                    priority=_size_rank(point), **where)
        self._flying[future] = point["id"]
        self._done.add(future)
        return future

    def running(self) -> int:
        """Points being profiled now: those the scheduler has handed to workers, at most one per thread
        (a worker may hold a second one queued)."""
        try:
            busy = {k for keys in self.client.processing().values() for k in keys}
            threads = sum(w["nthreads"] for w in self.client.scheduler_info()["workers"].values())
        except Exception:                   # a scheduler that went away: the next result says so
            return len(self._flying)
        return min(threads, sum(1 for f in self._flying if f.key in busy))

    def next_done(self, wait: float = 0.5):
        """(future, result or the exception it raised), None when none is left, or "wait"."""
        if not self._flying:
            return None
        batch = self._done.next_batch(block=False)
        if not batch:
            time.sleep(wait)
            return "wait"
        for extra in batch[1:]:              # hand them back one at a time
            self._done.add(extra)
        future = batch[0]
        self._flying.pop(future, None)
        try:
            return future, future.result()
        except Exception as exc:             # KilledWorker, a task that could not be unpickled...
            return future, {"rc": None, "stderr": f"error: {type(exc).__name__}: {exc}", "worker": None}

    def worker_lost(self, future) -> int:
        """How often the scheduler saw this point's worker die under it (and ran the point again)."""
        def suspicious(dask_scheduler, key):
            ts = dask_scheduler.tasks.get(key)
            return getattr(ts, "suspicious", 0) if ts is not None else 0
        try:
            return int(self.client.run_on_scheduler(suspicious, key=future.key))
        except Exception:
            return 0

    def close(self):
        for future in list(self._flying):
            future.cancel()
        self._flying.clear()
        try:
            self.client.close(timeout=10)
        finally:
            if self.cluster is not None:
                self.cluster.close(timeout=20)


def _size(point: dict) -> float:
    """A point's work, roughly: the product of its numeric grid values."""
    return math.prod(float(v) for v in point["grid"].values() if isinstance(v, (int, float)) and v > 0)


def _size_rank(point: dict) -> int:
    return int(round(math.log10(_size(point)) * 100))


def open_runner(cluster: str, workers: int | None):
    """The runner for --cluster and --workers, saying on stderr what was started."""
    if cluster == "local" and workers == 1:
        return Sequential()
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        if cluster != "local":
            raise BadParameter(f"--cluster {cluster} needs Dask: {DASK_HINT}") from None
        print(f"sweep: Dask is not installed, so the points run one after another; for parallel points "
              f"{DASK_HINT}", file=sys.stderr)
        return Sequential()
    if cluster in CLUSTERS:
        import dask

        dask.config.set(LOCAL_CLUSTER_CONFIG)   # read when the cluster's scheduler starts, in this process
    if cluster == "local":
        n = workers or 2
        lc = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address=None)
        return DaskRunner(_quiet(Client(lc)), lc, f"Dask LocalCluster, {n} worker processes")
    if cluster == "local-cuda":
        try:
            from dask_cuda import LocalCUDACluster
        except ImportError as exc:
            raise BadParameter(f"--cluster local-cuda needs dask-cuda ({exc}): {DASK_HINT}") from None
        kwargs = {"n_workers": workers} if workers else {}
        lc = LocalCUDACluster(threads_per_worker=1, dashboard_address=None, **kwargs)
        client = _quiet(Client(lc))
        n = len(client.scheduler_info()["workers"])
        return DaskRunner(client, lc, f"dask-cuda LocalCUDACluster, {n} workers, one per GPU")
    try:
        client = Client(cluster, timeout=5)
    except (OSError, TimeoutError, ValueError) as exc:
        raise BadParameter(f"--cluster {cluster}: cannot reach a Dask scheduler there ({exc}); start one with "
                           "`dask scheduler` and workers with `dask worker ADDRESS`, or use --cluster local") from None
    _check_workers(client, cluster)
    n = len(client.scheduler_info()["workers"])
    return DaskRunner(client, None, f"Dask scheduler {cluster}, {n} workers at start")


def _quiet(client):
    """Workers this sweep started ignore SIGINT (app.sweep.workers): a Ctrl-C stops them through the sweep, without
    a traceback of theirs. Registered with the scheduler, so a worker restarted after a crash gets it too."""
    from app.sweep.workers import IgnoreSigint

    client.register_plugin(IgnoreSigint())
    return client


def _check_workers(client, address: str) -> None:
    def has_app():
        import importlib.util

        return importlib.util.find_spec("app.kernel") is not None
    try:
        client.wait_for_workers(1, timeout=30)
    except (TimeoutError, OSError):
        client.close()
        raise BadParameter(f"--cluster {address}: the scheduler has no workers; start some with "
                           f"`dask worker {address}`") from None
    lacking = [w for w, ok in client.run(has_app).items() if not ok]
    if lacking:
        client.close()
        raise BadParameter(f"--cluster {address}: workers {', '.join(lacking)} cannot import this tool; install it "
                           "there (pip install -e .) in the Python the workers run")


def run_points(spec, sweep_dir: Path, todo: list[dict], runner, rows: list[dict], timeout: float,
               progress=None) -> list[dict]:
    """Run ``todo``; every finished point's row goes into ``rows`` and results.csv at once."""
    axes = list(spec.axes)
    attempts = {p["id"]: 1 for p in todo}
    by_handle = {}
    if runner.parallel:
        todo = sorted(todo, key=_size, reverse=True)
    for p in todo:
        by_handle[runner.submit(p, spec.cli_args(p), timeout, spec.device)] = p
    finished = failed = 0
    while True:
        if progress:
            progress(finished, runner.running(), failed)
        got = runner.next_done()
        if got is None:
            break
        if got == "wait":
            continue
        handle, result = got
        point = by_handle.pop(handle)
        # 9: the output differs from the reference; 10: the check could not run (the oracle failed: running the
        # point again would fail the same way). Neither is retried, nor run again by --resume.
        status = {0: "ok", 9: "wrong", 10: "unverified"}.get(result.get("rc"), "failed")
        lost = runner.worker_lost(handle)
        if status == "failed" and attempts[point["id"]] < MAX_ATTEMPTS:
            _log_attempt(sweep_dir, point, attempts[point["id"]], result)
            attempts[point["id"]] += 1
            by_handle[runner.submit(point, spec.cli_args(point), timeout, spec.device,
                                    avoid=result.get("worker"))] = point
            continue
        profile = None
        if result.get("files"):
            profile = os.path.relpath(write_profile(sweep_dir / "points" / point["id"], result["files"]), sweep_dir)
        finished += 1
        if status == "failed":
            failed += 1
            _log_attempt(sweep_dir, point, attempts[point["id"]], result)
        error = "" if status == "ok" else failure_line(result)
        rows[:] = [r for r in rows if r["point"] != point["id"]]
        rows.append(row_for(point, trace_of(result.get("files", {})), result, status, attempts[point["id"]], lost,
                            error, profile))
        write_results(sweep_dir, rows, axes)
    if progress:
        progress(finished, 0, failed)
    return rows


def _log_attempt(sweep_dir: Path, point: dict, attempt: int, result: dict) -> None:
    folder = sweep_dir / "points" / point["id"]
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"attempt-{attempt}-failed.log").write_text(
        f"worker: {result.get('worker')} on {result.get('host')}\nexit status: {result.get('rc')}\n"
        f"--- stderr (tail) ---\n{result.get('stderr', '')}\n")
