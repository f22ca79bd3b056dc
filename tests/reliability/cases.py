"""Bad and hostile inputs, by class, and what "handled" means for each.

A CLI case runs ``python -m app.kernel`` in a real process and is handled when it
exits non-zero with exactly one line on stderr (no traceback) and writes nothing
under its --out folder (and, where the case lists them, its line holds the words of ``says``
and none of ``never_says``: an error must not blame a flag the user never passed). An API
case calls the Python API in process and is handled when it raises the tool's one-line
error naming the fix (no other exception).
``tests/reliability/table.py`` writes docs/reliability.md from these cases;
``test_reliability.py`` runs them all.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.signals import sigint_default
from tests.conftest import child_env

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--points", "300", "--polygons", "30", "--device", "cpu"]


@dataclass
class Case:
    cls: str
    name: str
    argv: list = field(default_factory=list)    # CLI arguments after `python -m app.kernel`
    api: object = None                          # or a callable for the Python API
    setup: object = None                        # (tmp: Path, env: dict) -> None, may add to argv via {tmp}
    signal_after: float | None = None           # send SIGTERM/SIGINT this long after the run took the lock
    signum: int = signal.SIGTERM
    says: tuple = ()                            # fragments the one line must hold to count as handled
    never_says: tuple = ()                      # and fragments it must not (a flag the user never passed)


def _trace(tmp: Path, **changes) -> None:
    doc = {"kernel": "join", "version": "v2", "total_elapsed_seconds": 1e-3, "mode": "event",
           "stages": [{"name": "bounds", "elapsed_seconds": 1e-4}], "device": {"name": "cpu"},
           "metadata": {"params": {}}} | changes
    (tmp / "base.json").write_text(json.dumps(doc))


def _write(name: str, text: str):
    return lambda tmp, env: (tmp / name).write_text(text)


def _fifo(tmp, env):
    os.mkfifo(tmp / "fifo")


def _huge(tmp, env):
    with open(tmp / "huge.json", "wb") as f:
        f.truncate(1 << 30)


def _hold_lock(tmp, env):
    code = ("import sys, time; from app.runtime.lock import device_lock\n"
            "with device_lock('cpu'):\n    print('held', flush=True); time.sleep(60)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    p.stdout.readline()
    env["_holder"] = p


def _symlink_lock(tmp, env):
    (tmp / "victim").write_text("precious")
    (Path(env["APP_LOCK_DIR"]) / "app-kernel-profile-cpu.lock").symlink_to(tmp / "victim")


def _foreign_lock(tmp, env):
    """Another user's lock file in this user's own lock folder ($XDG_RUNTIME_DIR/app-kernel). In a shared
    APP_LOCK_DIR another user's lock is used as it is (that is what the folder is for), so the case unsets it."""
    runtime = tmp / "runtime"
    (runtime / "app-kernel").mkdir(parents=True, mode=0o700)
    runtime.chmod(0o700)
    env.pop("APP_LOCK_DIR")
    env["XDG_RUNTIME_DIR"] = str(runtime)
    lock = runtime / "app-kernel" / "app-kernel-profile-cpu.lock"
    lock.write_text("1")
    if os.geteuid() == 0:
        os.chown(lock, 12345, 12345)
    else:                       # cannot give a file away: make it unopenable instead
        lock.chmod(0)


def _simulate_gpu(tmp, env):
    """Make the run believe CUDA device 0 is usable, for a case whose error comes after the GPU check.

    nsys mode checks for a GPU before it looks for nsys, so on a machine without one a missing
    --nsys would only ever show the no-GPU error. A sitecustomize ahead of the package replaces the
    GPU probe; nothing reaches the (absent) GPU, since the run stops at the missing profiler."""
    sim = tmp / "simulated-gpu"
    sim.mkdir()
    (sim / "sitecustomize.py").write_text(
        "import app.runtime.device as d\n"
        "d.probe_gpu = lambda: (True, 'simulated by tests/reliability/cases.py', {'name': 'simulated GPU', 'index': 0})\n")
    env["PYTHONPATH"] = os.pathsep.join([str(sim), env["PYTHONPATH"]])


def _api(fn):
    def call():
        import numpy as np
        import shapely
        from shapely.geometry import MultiPolygon, Point, Polygon, box

        from app.kernel.join import spatial_join
        from app.kernel.overlay import overlay_areas
        return fn({"np": np, "shapely": shapely, "MultiPolygon": MultiPolygon, "Point": Point, "Polygon": Polygon,
                   "box": box, "spatial_join": spatial_join, "overlay_areas": overlay_areas})
    return call


SQ = "box(0, 0, 1, 1)"
CASES = [
    # unknown names
    Case("unknown kernel, version, mode or command", "kernel", ["nope"]),
    Case("unknown kernel, version, mode or command", "version", ["join", "v9"]),
    Case("unknown kernel, version, mode or command", "mode", ["join", "--prof_type", "bogus"]),
    Case("unknown kernel, version, mode or command", "option", ["join", "--colour", "red"]),
    Case("unknown kernel, version, mode or command", "version of overlay", ["overlay", "v7"]),
    # kernel parameters
    *[Case("kernel parameter out of range or malformed", f"{a} {v}", ["join", a, v, "--device", "cpu"])
      for a, v in (("--points", "-5"), ("--points", "lots"), ("--points", "1e3"), ("--polygons", "0"),
                   ("--vertices", "2"), ("--predicate", "touches"), ("--layout", "spiral"), ("--seed", "-1"))],
    Case("kernel parameter out of range or malformed", "overlay --left 0", ["overlay", "--left", "0"]),
    Case("kernel parameter out of range or malformed", "overlay --layout x", ["overlay", "--layout", "x"]),
    # sizes that cannot fit
    Case("sizes that cannot fit", "points beyond 32-bit indices", ["join", "--points", str(10**12), "--device", "cpu"]),
    Case("sizes that cannot fit", "points beyond host memory", ["join", "--points", "2000000000", "--device", "cpu"]),
    Case("sizes that cannot fit", "polygon vertices beyond 32-bit indices",
         ["join", "--polygons", "500000000", "--vertices", "200", "--device", "cpu"]),
    Case("sizes that cannot fit", "overlay layers beyond memory", ["overlay", "--left", "50000000",
                                                                   "--right", "50000000", "--device", "cpu"]),
    # common options
    *[Case("common option out of range", f"{a} {v}", ["join", *SMALL, a, v])
      for a, v in (("--bench_runs", "0"), ("--bench_runs", "-3"), ("--bench_runs", "ten"), ("--warmup", "-1"),
                   ("--ncu-timeout", "nan"), ("--ncu-timeout", "inf"), ("--ncu-timeout", "0"),
                   ("--nsys-timeout", "-1"), ("--nsys-timeout", "nan"), ("--device", "tpu"),
                   ("--backend", "perf"), ("--ncu-clock-control", "max"))],
    # output folder
    Case("output folder unusable", "--out is a file", ["join", *SMALL, "--out", "{tmp}/file/sub"],
         setup=_write("file", "x")),
    Case("output folder unusable", "--out under /proc", ["join", *SMALL, "--out", "/proc/self/nope"]),
    Case("output folder unusable", "--out under a file deep", ["join", *SMALL, "--out", "{tmp}/file/a/b/c"],
         setup=_write("file", "x")),
    # baselines
    Case("bad --baseline", "missing", ["join", *SMALL, "--baseline", "{tmp}/none.json"]),
    Case("bad --baseline", "folder without trace.json", ["join", *SMALL, "--baseline", "{tmp}"]),
    Case("bad --baseline", "not JSON", ["join", *SMALL, "--baseline", "{tmp}/b.json"], setup=_write("b.json", "{no")),
    Case("bad --baseline", "JSON array", ["join", *SMALL, "--baseline", "{tmp}/b.json"], setup=_write("b.json", "[]")),
    Case("bad --baseline", "NaN total", ["join", *SMALL, "--baseline", "{tmp}/base.json"],
         setup=lambda tmp, env: _trace(tmp, total_elapsed_seconds=float("nan"))),
    Case("bad --baseline", "string total", ["join", *SMALL, "--baseline", "{tmp}/base.json"],
         setup=lambda tmp, env: _trace(tmp, total_elapsed_seconds="1")),
    Case("bad --baseline", "stages not a list", ["join", *SMALL, "--baseline", "{tmp}/base.json"],
         setup=lambda tmp, env: _trace(tmp, stages={"a": 1})),
    Case("bad --baseline", "FIFO", ["join", *SMALL, "--baseline", "{tmp}/fifo"], setup=_fifo),
    Case("bad --baseline", "/dev/zero", ["join", *SMALL, "--baseline", "/dev/zero"]),
    Case("bad --baseline", "1 GiB sparse file", ["join", *SMALL, "--baseline", "{tmp}/huge.json"], setup=_huge),
    Case("bad --baseline", "another kernel", ["join", *SMALL, "--baseline", "{tmp}/base.json"],
         setup=lambda tmp, env: _trace(tmp, kernel="overlay")),
    Case("bad --baseline", "other parameters", ["join", *SMALL, "--baseline", "{tmp}/base.json"],
         setup=lambda tmp, env: _trace(tmp, metadata={"params": {"points": 1}})),
    # the device lock
    Case("device lock busy or unsafe", "held by another process", ["join", *SMALL], setup=_hold_lock),
    Case("device lock busy or unsafe", "symbolic link planted", ["join", *SMALL], setup=_symlink_lock),
    Case("device lock busy or unsafe", "lock file of another user in your own lock folder", ["join", *SMALL],
         setup=_foreign_lock),
    Case("device lock busy or unsafe", "APP_LOCK_DIR missing", ["join", *SMALL],
         setup=lambda tmp, env: env.update(APP_LOCK_DIR=str(tmp / "missing"))),
    Case("device lock busy or unsafe", "APP_LOCK_DIR is a file", ["join", *SMALL],
         setup=lambda tmp, env: ((tmp / "f").write_text("x"), env.update(APP_LOCK_DIR=str(tmp / "f")))),
    # GPU-only requests without a GPU (CI has none; on a GPU machine these cases are skipped)
    Case("GPU asked for, none usable", "--device gpu", ["join", "--device", "gpu"]),
    Case("GPU asked for, none usable", "annotation on the CPU", ["join", "--prof_type", "annotation", "--device", "cpu"]),
    Case("GPU asked for, none usable", "ncu on the CPU", ["join", "--prof_type", "ncu", "--device", "cpu"]),
    Case("GPU asked for, none usable", "nsys on the CPU", ["join", "--prof_type", "nsys", "--device", "cpu"],
         says=("needs a GPU but --device cpu was asked for",)),
    Case("GPU asked for, none usable", "nsys with the default --device auto", ["join", "--prof_type", "nsys"],
         says=("nsys mode (nsys) needs a GPU and none is usable here", "use --prof_type event"),
         never_says=("--device gpu", "--device cpu")),
    # profilers and captures
    Case("profiler missing or capture unreadable", "--ncu missing", ["join", "--prof_type", "ncu", "--ncu", "{tmp}/ncu"]),
    Case("profiler missing or capture unreadable", "--nsys missing (a usable GPU simulated)",
         ["join", "--prof_type", "nsys", "--nsys", "{tmp}/nsys"], setup=_simulate_gpu,
         says=("nsys not found at",)),
    Case("profiler missing or capture unreadable", "timeline: missing file", ["timeline", "{tmp}/none.sqlite"]),
    Case("profiler missing or capture unreadable", "timeline: not SQLite", ["timeline", "{tmp}/x.sqlite"],
         setup=_write("x.sqlite", "text")),
    Case("profiler missing or capture unreadable", "timeline: .nsys-rep without nsys",
         ["timeline", "{tmp}/x.nsys-rep", "--nsys", "{tmp}/no-nsys"], setup=_write("x.nsys-rep", "x")),
    Case("profiler missing or capture unreadable", "timeline: unknown domain",
         ["timeline", str(ROOT / "tests/fixtures/nsys/join.sqlite"), "--domain", "nope"]),
    Case("profiler missing or capture unreadable", "timeline: bad option", ["timeline", "--colour"]),
    # signals
    Case("signal mid-run", "SIGTERM", ["join", "--points", "3000000", "--polygons", "300000", "--device", "cpu"],
         signal_after=1.0),
    Case("signal mid-run", "SIGINT", ["join", "--points", "3000000", "--polygons", "300000", "--device", "cpu"],
         signal_after=1.0, signum=signal.SIGINT),
    # the Python API
    *[Case("geometry with no defined answer (Python API)", name, api=_api(fn)) for name, fn in (
        ("self-overlapping MultiPolygon", lambda g: g["overlay_areas"](
            [g["MultiPolygon"]([g["box"](0, 0, 1, 1), g["box"](.5, .5, 1.5, 1.5)])], [g["box"](0, 0, 1, 1)])),
        ("bow-tie polygon", lambda g: g["spatial_join"](
            [g["Point"](.5, .2)], [g["Polygon"]([(0, 0), (1, 1), (1, 0), (0, 1)])])),
        ("empty polygon", lambda g: g["spatial_join"]([g["Point"](.5, .2)], [g["Polygon"]()])),
        ("None polygon", lambda g: g["overlay_areas"]([None], [g["box"](0, 0, 1, 1)])),
        ("NaN polygon vertex", lambda g: g["spatial_join"](
            [g["Point"](0, 0)], [g["Polygon"]([(0, 0), (float("nan"), 1), (1, 0)])])),
        ("a line among the points", lambda g: g["spatial_join"](
            [g["shapely"].LineString([(0, 0), (1, 1)])], [g["box"](0, 0, 1, 1)])),
        ("points of shape (N, 3)", lambda g: g["spatial_join"](g["np"].zeros((4, 3)), [g["box"](0, 0, 1, 1)])),
        ("points as strings", lambda g: g["spatial_join"]([["a", "b"]], [g["box"](0, 0, 1, 1)])),
        ("unknown predicate", lambda g: g["spatial_join"]([[0, 0]], [g["box"](0, 0, 1, 1)], predicate="near")),
        ("unknown device", lambda g: g["spatial_join"]([[0, 0]], [g["box"](0, 0, 1, 1)], device="tpu")),
    )],
]


def run_case(case: Case) -> tuple[bool, str]:
    """(handled, what happened) for one case."""
    if case.api is not None:
        from app.errors import AppError

        try:
            case.api()
        except AppError as exc:
            one = str(exc)
            return ("\n" not in one and bool(one)), one
        except Exception as exc:  # noqa: BLE001  (the very thing this checks for)
            return False, f"raised {type(exc).__name__}: {exc}"
        return False, "returned a result"
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        locks = tmp / "locks"
        locks.mkdir()
        env = child_env(APP_LOCK_DIR=str(locks), PYTHONUNBUFFERED="1")
        # Each case has a lock folder of its own, so nothing else holds its lock; a wait asked for by the calling
        # shell would turn the "held by another process" case into a wait instead of the refusal it checks.
        env.pop("APP_LOCK_WAIT", None)
        if case.setup:
            case.setup(tmp, env)
        holder = env.pop("_holder", None)
        out = tmp / "out"
        argv = [a.replace("{tmp}", str(tmp)) for a in case.argv]
        if argv[0] != "timeline" and "--out" not in argv:
            argv += ["--out", str(out)]
        watched = Path(argv[argv.index("--out") + 1]) if "--out" in argv else out
        try:
            # The run starts with SIGINT at its default (tests.signals says why).
            p = subprocess.Popen([sys.executable, "-m", "app.kernel", *argv], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env=env, cwd=tmp,
                                 preexec_fn=sigint_default if case.signal_after else None)
            if case.signal_after:
                # Signal once the run holds the device lock (its handlers are in place by then), plus a
                # little, so the signal lands mid-run on a slow machine too.
                deadline = time.monotonic() + 60
                while not list(locks.glob("*.lock")) and time.monotonic() < deadline and p.poll() is None:
                    time.sleep(0.05)
                time.sleep(case.signal_after)
                p.send_signal(case.signum)
            stdout, stderr = p.communicate(timeout=120)
        finally:
            if holder:
                holder.kill()
                holder.wait()
        lines = [ln for ln in stderr.splitlines() if ln.strip()]
        written = [x for x in watched.rglob("*") if x.is_file()] if watched.is_dir() else []
        partial = list(watched.rglob(".*partial*")) if watched.is_dir() else []
        ok = p.returncode != 0 and len(lines) == 1 and "Traceback" not in stderr and not written and not partial
        said = lines[0] if lines else ""
        wrong = [f"lacks {f!r}" for f in case.says if f not in said] + \
                [f"names {f!r}" for f in case.never_says if f in said]
        ok = ok and not wrong
        what = f"exit {p.returncode}: {said or '(no message)'}"
        if not ok:
            what += f" | stderr lines {len(lines)}, files written {len(written)}, partial {len(partial)}"
            what += "".join(f", message {w}" for w in wrong)
        return ok, what
