"""The timeline command (`python -m app.kernel timeline`) on the real nsys captures of tests/fixtures/nsys/."""
import json
import sqlite3
import statistics

import pytest

from app.kernel.cli import main
from tests.runtime.nsys_capture import fixture, raw_ranges


def test_timeline_command_json(capsys):
    db = fixture("join.sqlite")
    assert main(["timeline", str(db), "--domain", "join", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    by = {r["name"]: r for r in doc["ranges"]}
    assert by["profile"]["instances"] == 3
    for r in doc["ranges"]:
        assert set(r) >= {"name", "instances", "span_us", "busy_us", "kernel_us", "memcpy_us", "memset_us", "ops",
                          "idle_us"}
        assert set(r["idle_us"]) == {"before_first_op", "launch_gap", "sync_wait", "launch_call", "launch_latency",
                                     "after_last_op", "no_gpu_work"}
    (start, end, _), *_ = raw_ranges(db, "bounds")
    assert by["bounds"]["span_us"] == pytest.approx(
        statistics.median((e - s) / 1e3 for s, e, _ in raw_ranges(db, "bounds")))


def test_timeline_command_tables_and_every_domain(capsys):
    assert main(["timeline", str(fixture("overlay.sqlite"))]) == 0
    out = capsys.readouterr().out
    assert "## Wall-time accounting" in out and "segment_mbr_filter" in out and "## Audit" in out


@pytest.mark.parametrize("setup,code,fragment", [
    (lambda p: p.write_text("not a database"), 8, "is not an SQLite export"),
    (lambda p: sqlite3.connect(p).execute("CREATE TABLE t (x)"), 8, "no StringIds table"),
    (None, 2, "no such file"),
])
def test_timeline_command_bad_input(tmp_path, capsys, setup, code, fragment):
    path = tmp_path / "capture.sqlite"
    if setup:
        setup(path)
    assert main(["timeline", str(path)]) == code
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and fragment in err[0], err


def test_timeline_command_nsys_rep_needs_nsys(tmp_path, capsys):
    rep = tmp_path / "x.nsys-rep"
    rep.write_bytes(b"\0")
    assert main(["timeline", str(rep), "--nsys", str(tmp_path / "nowhere" / "nsys")]) == 6
    assert "nsys not found" in capsys.readouterr().err


def test_timeline_command_unknown_domain(capsys):
    assert main(["timeline", str(fixture("join.sqlite")), "--domain", "nope"]) == 2
    assert "domains present: 'CCCL', 'join'" in capsys.readouterr().err
