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
