"""devlog on damaged input: a profile's params.json or summary, or a devlog marker edited by hand, is one line or is
read around, never a traceback and never a lost devlog; and an entry from too few runs says why its verdict is
noise."""
import json
import shutil

import pytest

from app.kernel.cli import main
from app.report.devlog import MARKER

ARGS = ["join", "--points", "300", "--polygons", "30", "--device", "cpu", "--bench_runs", "2", "--warmup", "0",
        "--no-verify"]


@pytest.fixture(scope="module")
def profiles(tmp_path_factory):
    out = tmp_path_factory.mktemp("devlog")
    assert main([*ARGS, "--out", str(out)]) == 0
    assert main([*ARGS, "--out", str(out)]) == 0
    return sorted(out.glob("profiles/event/join/*/*"))


def copy_of(profile, tmp_path, name):
    folder = tmp_path / "profiles" / "event" / "join" / name
    shutil.copytree(profile, folder)
    return folder


@pytest.mark.parametrize("params,fragment", [
    (lambda text: text[:100], "params.json is not readable JSON"),
    (lambda text: "[]", "params.json is not a profile's parameters"),
    (lambda text: json.dumps(json.loads(text) | {"clocks": 3}), "params.json is not a profile's parameters"),
])
def test_a_damaged_params_json_is_one_line_and_the_devlog_is_kept(profiles, tmp_path, capsys, params, fragment):
    folder = copy_of(profiles[0], tmp_path, "damaged")
    (folder / "params.json").write_text(params((profiles[0] / "params.json").read_text()))
    log = tmp_path / "log.md"
    log.write_text("# my notes\n")
    assert main(["devlog", str(folder), "--file", str(log)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"devlog {folder}: {folder / 'params.json'}" in err[0] and fragment in err[0], err
    assert "profile again" in err[0] and log.read_text() == "# my notes\n"


@pytest.mark.parametrize("field,value,fragment", [
    ("duration_us", "fast", "field 'summary.duration_us' is \"fast\", not a finite number"),
    ("achieved_gbps", -1, "field 'summary.achieved_gbps' is -1"),
    ("missing", [], "field 'summary.missing' is not an object"),
    ("issues", "none", "field 'summary.issues' is not a list"),
])
def test_a_damaged_summary_is_one_line(profiles, tmp_path, capsys, field, value, fragment):
    folder = copy_of(profiles[0], tmp_path, "summary")
    trace = json.loads((folder / "trace.json").read_text())
    trace["summary"][field] = value
    (folder / "trace.json").write_text(json.dumps(trace))
    assert main(["devlog", str(folder), "--file", str(tmp_path / "log.md")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and fragment in err[0], err
    assert not (tmp_path / "log.md").exists()


def test_too_few_runs_read_as_noise_with_the_reason(profiles, tmp_path, capsys):
    log = tmp_path / "log.md"
    for p in profiles:
        assert main(["devlog", str(p), "--file", str(log)]) == 0
    text = log.read_text()
    duration = [line for line in text.splitlines() if line.startswith("| Duration")][1]
    assert duration.endswith("(noise) |")
    assert ("_Against the previous entry: the duration's verdict is noise, too few runs to judge: 2 and 2; need ≥ 6: "
            "profile again with --bench_runs 6 or more._") in text


def test_a_marker_edited_by_hand_is_read_around(profiles, tmp_path, capsys):
    """The devlog is the user's file: a previous entry's numbers edited into strings, NaN or zeros give no
    comparison ("--"), never a traceback nor "+inf%"."""
    log = tmp_path / "log.md"
    assert main(["devlog", str(profiles[0]), "--file", str(log)]) == 0
    text = log.read_text()
    marker = json.loads(MARKER.search(text).group(1))
    edited = marker | {"duration_us": "x", "samples": [0, "y"], "host_pace_samples": [-1.0], "key": 7}
    log.write_text(text.replace(json.dumps(marker, sort_keys=True), json.dumps(edited, sort_keys=True)))
    assert main(["devlog", str(profiles[1]), "--file", str(log)]) == 0
    last = log.read_text().split("**Performance**")[-1]
    rows = [line for line in last.splitlines() if line.startswith(("| Duration", "| Host CPU pace"))]
    assert all(row.endswith("| -- |") for row in rows) and "inf" not in last
