"""The trace loader every comparison reads through: it accepts every real profile, refuses a damaged one in one
line before any profiling starts, and the report's vs Baseline section lists what compare lists."""
import glob
import json
from pathlib import Path

import pytest

from app.analysis.baseline import read_trace
from app.kernel.cli import main

ROOT = Path(__file__).resolve().parents[2]
ARGS = ["join", "--points", "300", "--polygons", "30", "--device", "cpu", "--bench_runs", "2", "--warmup", "0",
        "--no-verify"]


def test_every_real_profile_is_accepted():
    """The checks refuse damage, not a profile of this tool: every stored trace, of every mode, reads."""
    paths = [p for p in glob.glob(str(ROOT / "tests" / "data" / "**" / "*trace.json"), recursive=True)
             + glob.glob(str(ROOT / "docs" / "**" / "trace.json"), recursive=True)
             if "total_elapsed_seconds" in Path(p).read_text()]
    assert len(paths) > 30
    for p in paths:
        assert read_trace(p)["stages"]


@pytest.mark.parametrize("mutate,fragment", [
    (lambda t: t.update(timing=None), "field 'timing' is null, not an object"),
    (lambda t: t["timing"].update(host_pace={"samples": ["x"]}), "'timing.host_pace.samples' must be a list of finite"),
    (lambda t: t["timing"].update(launch_pace=[1]), "field 'timing.launch_pace' is [1], not an object"),
    (lambda t: t["timing"]["host_pace"].update(samples=[3e-5, -2.0]), "holds -2.0"),
    (lambda t: t["stages"][0].update(spread=5), "the spread of stage 'owned_buffer_build' is 5, not an object"),
    (lambda t: t["stages"][0].update(elapsed_seconds=0), "has no finite elapsed_seconds above 0 (0)"),
    (lambda t: t["metadata"].update(params=[1]), "field 'metadata.params' must be an object"),
])
def test_a_damaged_baseline_is_refused_before_profiling(tmp_path, capsys, good, no_profiling, mutate, fragment):
    trace = json.loads(json.dumps(good))
    mutate(trace)
    (tmp_path / "base").mkdir()
    (tmp_path / "base" / "trace.json").write_text(json.dumps(trace))
    assert main([*ARGS, "--out", str(tmp_path / "out"), "--baseline", str(tmp_path / "base")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: --baseline {tmp_path / 'base'}: ") and fragment in err[0], err
    assert err[0].endswith("the trace is damaged: profile again, or pass another profile folder or its trace.json")
    assert not (tmp_path / "out").exists()


def test_deeply_nested_json_is_one_line(tmp_path):
    from app.errors import BadParameter

    (tmp_path / "trace.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(BadParameter, match="not a readable profile trace"):
        read_trace(str(tmp_path))


def test_the_reports_section_lists_one_side_stages_and_too_few_runs(tmp_path, good):
    """A baseline whose stage was renamed, from 2 runs: the report's vs Baseline section lists the stage on each
    side with no verdict, gives no verdict from 2 runs and says why, and calls the total the whole plan."""
    base = json.loads(json.dumps(good))
    base["stages"][1]["name"] = "bounds_before"
    (tmp_path / "base.json").write_text(json.dumps(base))
    out = tmp_path / "out"
    assert main([*ARGS, "--out", str(out), "--baseline", str(tmp_path / "base.json")]) == 0
    (d,) = list(out.glob("profiles/event/join/*/*"))
    section = (d / "report.md").read_text().split("## vs Baseline")[1].split("\n## ")[0]
    assert "whole plan (the total): **noise**. No interval: too few runs to judge: 2 and 2; need ≥ 6" in section
    assert "| bounds_before (us) | " in section and section.split("| bounds_before (us) | ")[1].split(" |")[1] == \
        " absent"
    assert "| -- | -- | only in the baseline |" in section and "| -- | -- | only in this profile |" in section
    assert "none (too few runs) | noise |" in section
    assert "Each side is one profile: a side of one process cannot show" in section
    assert "end to end:" not in section


EVENT = ROOT / "tests" / "data" / "event"


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_a_half_written_profile_folder_is_refused_by_compare_and_devlog(tmp_path, capsys):
    """The writer fills a hidden '.<stamp>.partial-<pid>' folder and renames it when done: one left behind (a writer
    that was stopped) is no profile, though its trace.json may read."""
    partial = tmp_path / "profiles" / "event" / "join" / "p" / ".20261129-999999.partial-99999"
    partial.mkdir(parents=True)
    (partial / "trace.json").write_text((EVENT / "join_v4_100k_10k_h200_launch_pace.trace.json").read_text())
    good = str(EVENT / "join_v4_100k_10k_h200_launch_pace_next.trace.json")
    for argv in (["compare", str(partial), good], ["compare", good, str(partial / "trace.json")],
                 ["devlog", str(partial), "--file", str(tmp_path / "log.md")]):
        assert main(argv) == 2
        assert "still being written, or left by a writer that was stopped" in _one_line(capsys)
    assert not (tmp_path / "log.md").exists()


def test_a_profile_on_both_sides_and_a_cut_off_trace_are_refused_in_one_line(tmp_path, capsys):
    same = str(EVENT / "join_v4_100k_10k_h200_launch_pace.trace.json")
    assert main(["compare", same, same]) == 2
    assert "BASE and NEW both hold the profile" in _one_line(capsys)
    cut = tmp_path / "cut" / "trace.json"
    cut.parent.mkdir()
    cut.write_text(Path(same).read_text()[:3000])
    assert main(["compare", str(cut.parent), same]) == 2
    err = _one_line(capsys)
    assert "not a readable profile trace" in err and err.endswith("the trace is damaged: profile again, or pass "
                                                                  "another profile folder or its trace.json")


def test_compare_names_the_profile_it_holds_the_others_against(tmp_path, capsys):
    base = json.loads((EVENT / "join_v4_100k_10k_h200_launch_pace.trace.json").read_text())
    other = tmp_path / "v3.trace.json"
    other.write_text(json.dumps(base | {"version": "v3"}))
    assert main(["compare", str(other), str(EVENT / "join_v4_100k_10k_h200_launch_pace_next.trace.json")]) == 2
    assert "BASE was measured for version v3 (NEW: v4)" in _one_line(capsys)
