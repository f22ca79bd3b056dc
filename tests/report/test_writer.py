"""A profile folder is written completely or not at all, never overwritten, never thrown away."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.errors import Terminated
from app.kernel.cli import main
from app.report import writer
from app.report.writer import remove_stale_partials, write_profile

ROOT = Path(__file__).resolve().parents[2]
SAME_SECOND = """
import sys, time
sys.path.insert(0, sys.argv[3])
from pathlib import Path
from app.report import writer
writer.time.strftime = lambda fmt, t=None: "20261126-120000"      # every writer lands in the same second
start = float(sys.argv[2])
time.sleep(max(0.0, start - time.time() - 0.01))   # asleep, not spinning: four processes share few cores
while time.time() < start:                          # then the last 10 ms spun, so all four leave at once
    pass
print(writer.write_profile(Path(sys.argv[1]), {"trace.json": {"pid": __import__("os").getpid()},
                                               "big.bin": bytes(4 << 20)}))
"""


def test_writers_finishing_in_the_same_second_keep_both_profiles(tmp_path):
    """Real second (and third, fourth) processes racing for one folder name."""
    import time

    start = time.time() + 0.5      # a process starts and imports the writer in about 0.1 s
    procs = [subprocess.Popen([sys.executable, "-c", SAME_SECOND, str(tmp_path), str(start), str(ROOT / "src")],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(4)]
    results = [p.communicate(timeout=60) for p in procs]
    assert all(p.returncode == 0 for p in procs), [r[1] for r in results]
    dirs = sorted(Path(r[0].strip()) for r in results)
    assert len(set(dirs)) == 4
    pids = {json.loads((d / "trace.json").read_text())["pid"] for d in dirs}
    assert pids == {p.pid for p in procs}                       # each finished profile kept, each complete
    assert all((d / "big.bin").stat().st_size == 4 << 20 for d in dirs)
    assert not list(tmp_path.glob(".*partial*"))


def test_stale_partials_of_dead_writers_are_removed(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    stale = tmp_path / f".20260101-000000.partial-{dead}"
    (stale / "tiling").mkdir(parents=True)
    live = tmp_path / f".20260101-000000.partial-{os.getpid()}"
    live.mkdir()
    out = write_profile(tmp_path, {"trace.json": {}})
    assert not stale.exists() and live.exists() and out.is_dir()
    assert remove_stale_partials(tmp_path) == []


def test_interrupt_during_the_write_leaves_nothing(tmp_path, monkeypatch):
    def interrupted(*a):
        raise KeyboardInterrupt
    monkeypatch.setattr(writer, "claim_folder", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_profile(tmp_path, {"trace.json": {}, "report.md": "x"})
    assert list(tmp_path.iterdir()) == []


def test_a_signal_after_the_rename_does_not_claim_the_profile_was_lost(tmp_path, monkeypatch, capsys):
    real = os.rename

    def then_terminated(*a):
        real(*a)
        raise Terminated()
    monkeypatch.setattr(writer.os, "rename", then_terminated)
    out = tmp_path / "out"
    assert main(["join", "--points", "200", "--polygons", "20", "--device", "cpu", "--bench_runs", "1",
                 "--warmup", "0", "--out", str(out)]) == 143
    err = capsys.readouterr().err
    (d,) = list(out.glob("profiles/event/join/*/*"))
    assert f"terminated: the profile was complete and is kept at {d}" in err
    assert (d / "report.md").exists()


def test_interrupt_between_claiming_a_name_and_the_rename_leaves_nothing(tmp_path, monkeypatch):
    def interrupted(*a):
        raise KeyboardInterrupt
    monkeypatch.setattr(writer.os, "rename", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_profile(tmp_path, {"trace.json": {}})
    assert list(tmp_path.iterdir()) == []


def test_same_second_in_one_process_gets_the_next_free_name(tmp_path, monkeypatch):
    monkeypatch.setattr(writer.time, "strftime", lambda fmt, t=None: "20261126-120000")
    dirs = [write_profile(tmp_path, {"trace.json": {"n": i}}) for i in range(3)]
    assert [d.name for d in dirs] == ["20261126-120000", "20261126-120000-2", "20261126-120000-3"]
    assert [json.loads((d / "trace.json").read_text())["n"] for d in dirs] == [0, 1, 2]


def test_files_in_new_nested_folders_and_readable_json(tmp_path):
    """A profile's files may sit folders deep (compiled/<stage>/...); JSON is written indented by two, for a
    reader of the folder, and ends with a newline."""
    doc = {"kernel": "join", "stages": [{"name": "bounds"}]}
    out = write_profile(tmp_path, {"trace.json": doc, "compiled/bounds/kernel.ptx": "// ptx\n", "raw.bin": b"\x00\x01"})
    assert (out / "compiled" / "bounds" / "kernel.ptx").read_text() == "// ptx\n"
    assert (out / "trace.json").read_text() == json.dumps(doc, indent=2) + "\n"
    assert (out / "raw.bin").read_bytes() == b"\x00\x01"


def test_an_uncreatable_output_folder_and_a_failed_write_name_the_fix(tmp_path, monkeypatch):
    from app.errors import OutputNotWritable

    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(OutputNotWritable, match=r"is not a writable folder\); pass --out DIR with a writable folder$"):
        write_profile(blocker / "profiles", {"trace.json": {}})
    with pytest.raises(OutputNotWritable, match=r"^cannot write profiles under .*\(File name too long\); pass --out "
                                                r"DIR with a writable folder$"):
        write_profile(tmp_path / ("x" * 300), {"trace.json": {}})     # a writable parent, a name no folder can have

    # A folder the check lets through but no folder can be made in: root may write anywhere by permissions, and
    # /proc takes no new folders (elsewhere the check refuses it first, with the same fix).
    if Path("/proc/self").is_dir():
        with pytest.raises(OutputNotWritable, match=r"^cannot (create|write profiles under) /proc/app-kernel/profiles "
                                                    r"\(.*\); pass --out DIR with a writable folder$"):
            write_profile(Path("/proc/app-kernel/profiles"), {"trace.json": {}})

    def full(self, *a, **k):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(OutputNotWritable, match=r"failed \(No space left on device\); check free space and "
                                                r"permissions$"):
        write_profile(tmp_path / "out", {"trace.json": {}})
    assert not (tmp_path / "out").exists()     # nothing half-written left behind, nor the empty folder made for it


def test_nan_infinities_and_numpy_values_are_written_as_strict_json(tmp_path):
    """JSON has no NaN: a missing reading (NaN in memory, a plain float or numpy's) is null in the file, and numpy
    numbers and arrays are written as plain JSON numbers and lists; the file parses without NaN or Infinity."""
    import numpy as np

    doc = {"median": float("nan"), "ci95": (float("-inf"), 1.5, float("inf")), "runs": np.int64(3),
           "mean": np.float32(0.5), "lost": np.float32("nan"), "samples": np.array([2.0, np.nan]),
           "stages": [{"elapsed_seconds": np.float64("nan")}]}
    out = write_profile(tmp_path, {"trace.json": doc})

    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")
    assert json.loads((out / "trace.json").read_text(), parse_constant=refuse) == {
        "median": None, "ci95": [None, 1.5, None], "runs": 3, "mean": 0.5, "lost": None, "samples": [2.0, None],
        "stages": [{"elapsed_seconds": None}]}


# No process has this id: Linux gives out ids up to 2^22 at most.
DEAD = 2**31 - 1


def test_a_stale_partial_removal_that_fails_does_not_stop_the_write(tmp_path):
    """A name left by a dead writer that cannot be removed as a folder (a file by that name: removing it fails) is
    passed over: the dead writer's real partial folder beside it is still removed and the profile is written."""
    stray = tmp_path / f".20260101-000000.partial-{DEAD}"
    stray.write_text("")
    stale = tmp_path / f".20260101-000001.partial-{DEAD}"
    (stale / "tiling").mkdir(parents=True)
    out = write_profile(tmp_path, {"trace.json": {"n": 1}})
    assert json.loads((out / "trace.json").read_text()) == {"n": 1}
    assert not stale.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([out.name, stray.name])


def test_an_interrupt_after_the_claimed_name_was_removed_meanwhile_still_leaves_nothing(tmp_path, monkeypatch):
    """The empty folder a run claimed may be gone when it cleans up after a signal (an empty-folder sweep ran
    meanwhile): the signal still reaches the caller, and every folder this run made is removed."""
    def swept_then_interrupted(src, dst):
        os.rmdir(dst)
        raise KeyboardInterrupt
    monkeypatch.setattr(writer.os, "rename", swept_then_interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_profile(tmp_path / "profiles" / "event", {"trace.json": {}})
    assert list(tmp_path.iterdir()) == []
