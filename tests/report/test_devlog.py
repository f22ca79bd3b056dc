"""devlog: one Performance block per profile, compared with the previous entry, missing shown as missing."""
import json
import os

import pytest

from app.kernel.cli import main
from app.report.devlog import MARKER

ARGS = ["join", "--points", "2000", "--polygons", "200", "--device", "cpu", "--bench_runs", "5"]


@pytest.fixture
def in_repo(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)            # the devlog lives in the user's repository: the current folder
    return tmp_path


def test_devlog_is_idempotent_and_compares_with_the_previous_entry(in_repo, capsys):
    assert main([*ARGS, "--devlog"]) == 0
    assert main([*ARGS, "--devlog"]) == 0
    first, second = sorted((in_repo / "out").glob("profiles/event/join/*/*"))
    log = in_repo / "docs" / "kernels" / "join.md"
    text = log.read_text()
    assert text.count("**Performance** (") == 2
    assert main(["devlog", str(first)]) == 0 and main(["devlog", str(second)]) == 0   # both already there
    assert log.read_text() == text
    assert "devlog: already in" in capsys.readouterr().out
    rows = [ln for ln in text.splitlines() if ln.startswith("| Duration")]
    assert rows[0].endswith("| -- |")
    assert rows[1].split("|")[3].strip().endswith(("(noise)", "(faster)", "(slower)"))
    markers = [json.loads(m.group(1)) for m in MARKER.finditer(text)]
    trace = json.loads((second / "trace.json").read_text())
    assert markers[1]["duration_us"] == pytest.approx(trace["total_elapsed_seconds"] * 1e6)
    assert f"{trace['total_elapsed_seconds'] * 1e6:,.1f} us" in rows[1]


def test_missing_metrics_are_named_not_zero(in_repo):
    assert main([*ARGS, "--devlog", "log.md"]) == 0
    text = (in_repo / "log.md").read_text()
    assert "| Achieved GB/s | missing (ran on the CPU" in text
    assert "| SM% (TC Util: these kernels use no tensor cores) | missing (sm__throughput" in text
    assert "| 0.0" not in text


def test_other_parameters_start_their_own_series(in_repo):
    assert main([*ARGS, "--devlog"]) == 0
    assert main([*ARGS[:2], "4000", *ARGS[3:], "--devlog"]) == 0
    rows = [ln for ln in (in_repo / "docs/kernels/join.md").read_text().splitlines() if ln.startswith("| Duration")]
    assert rows[0].endswith("| -- |") and rows[1].endswith("| -- |")


@pytest.mark.parametrize("setup,fragment", [
    (lambda p: None, "devlog {p}/nope: not a readable profile trace"),
    (lambda p: (p / "t.json").write_text(json.dumps({"kernel": "join", "version": "v2", "total_elapsed_seconds": 1.0,
                                                     "stages": []})), "has no summary"),
])
def test_bad_devlog_input_is_one_line(in_repo, capsys, setup, fragment):
    setup(in_repo)
    target = in_repo / ("t.json" if "summary" in fragment else "nope")
    assert main(["devlog", str(target)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and fragment.format(p=in_repo) in err[0], err


def test_unwritable_devlog_is_one_line(in_repo, capsys):
    assert main(ARGS) == 0
    (prof,) = (in_repo / "out").glob("profiles/event/join/*/*")
    (in_repo / "blocker").write_text("x")
    assert main(["devlog", str(prof), "--file", str(in_repo / "blocker" / "log.md")]) == 5
    assert "cannot append to the devlog" in capsys.readouterr().err
    assert not os.path.exists(in_repo / "blocker" / "log.md")
