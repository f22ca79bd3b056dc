"""devlog: one Performance block per profile, compared with the previous entry, missing shown as missing."""
import json
import os
import re
from pathlib import Path

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
    assert rows[1].split("|")[3].strip().endswith(("(noise)", "(no verdict: one process each)"))
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


def test_another_device_starts_its_own_series(in_repo):
    """An entry compares only with the previous one measured on the same device: a profile from another GPU is
    not "faster" because it ran on other hardware. Markers written before they named the device take it from
    their Performance line."""
    import shutil

    assert main([*ARGS, "--devlog"]) == 0
    assert main([*ARGS, "--devlog"]) == 0
    first, second = sorted((in_repo / "out").glob("profiles/event/join/*/*"))
    log = in_repo / "docs" / "kernels" / "join.md"
    text = log.read_text()
    name = json.loads((first / "trace.json").read_text())["device"]["name"]
    for m in MARKER.finditer(text):         # both entries as an older version wrote them: no device in the marker
        old = json.loads(m.group(1))
        assert old.pop("device") == name
        text = text.replace(m.group(1), json.dumps(old, sort_keys=True))
    log.write_text(text)
    other = second.with_name(second.name + "-other-gpu")
    shutil.copytree(second, other)
    trace = json.loads((other / "trace.json").read_text())
    trace["device"]["name"] = "Another GPU, 80 GB"
    (other / "trace.json").write_text(json.dumps(trace))
    assert main(["devlog", str(other)]) == 0
    entries = log.read_text().split("**Performance** (")[1:]
    assert entries[2].startswith("Another GPU, 80 GB, clocks")
    duration = [ln for ln in entries[2].splitlines() if ln.startswith("| Duration")][0]
    assert duration.endswith("| -- |") and "compared with" not in entries[2]
    third = second.with_name(second.name + "-again")
    shutil.copytree(second, third)
    assert main(["devlog", str(third)]) == 0
    last = log.read_text().split("**Performance** (")[-1]      # found by the second's Performance line
    assert not [ln for ln in last.splitlines() if ln.startswith("| Duration")][0].endswith("| -- |")
    assert f"compared with `{'/'.join(second.resolve().parts[-4:])}`" in last
    assert [json.loads(m.group(1)) for m in MARKER.finditer(log.read_text())][-1]["device"] == name


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
    # A devlog that cannot be read (a name no file can have, a file that is not text) is one line too, untouched.
    (in_repo / "binary.md").write_bytes(b"\xff\xfe entries")
    for name, fragment in (("x" * 300 + ".md", "(File name too long)"), ("binary.md", "can't decode byte 0xff")):
        assert main(["devlog", str(prof), "--file", str(in_repo / name)]) == 5
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "cannot read the devlog" in err[0] and fragment in err[0], err
    assert (in_repo / "binary.md").read_bytes() == b"\xff\xfe entries"


def test_an_entry_from_another_card_of_the_same_model_says_so(in_repo):
    """Two real H200 profiles of the overlay from two lent nodes: the second entry is compared with the first (same
    model, same series) and says under its table that they ran on different cards. The same card again says
    nothing."""
    import shutil

    src = Path(__file__).resolve().parents[2] / "docs" / "kernels" / "profiles"
    folders = []
    for name in ("overlay-v3-100k-100k-half-warp-pairs", "overlay-v3-100k-100k-bucket-sort"):
        dest = in_repo / "profiles" / "event" / "overlay" / name
        shutil.copytree(src / name, dest)
        folders.append(dest)
    log = in_repo / "log.md"
    uuids = [json.loads((d / "trace.json").read_text())["device"]["uuid"] for d in folders]
    for d in folders:
        assert main(["devlog", str(d), "--file", str(log)]) == 0
    entries = log.read_text().split("**Performance** (")[1:]
    assert "different cards" not in entries[0]
    assert f"_Against the previous entry: the two profiles ran on different cards ({uuids[0]}, {uuids[1]})" in entries[1]
    assert [json.loads(m.group(1))["card"] for m in MARKER.finditer(log.read_text())] == uuids
    again = folders[1].with_name(folders[1].name + "-again")
    shutil.copytree(folders[1], again)
    assert main(["devlog", str(again), "--file", str(log)]) == 0
    last = log.read_text().split("**Performance** (")[-1]
    assert "compared with" in last and "different cards" not in last


def test_an_entry_after_one_that_recorded_no_card_reads_the_card_from_its_profile_or_says_it_is_not_known(in_repo):
    """A marker from before cards were recorded: the card comes from its profile's trace.json while that folder is
    there (two real H200 profiles from two lent nodes: "different cards"); with the folder gone, the next GPU entry
    says under its table that one machine cannot be told from two."""
    import shutil

    src = Path(__file__).resolve().parents[2] / "docs" / "kernels" / "profiles"
    folders = []
    for name in ("overlay-v3-100k-100k-half-warp-pairs", "overlay-v3-100k-100k-bucket-sort",
                 "overlay-v3-100k-100k-bucket-sort"):
        dest = in_repo / "profiles" / "event" / "overlay" / f"{name}-{len(folders)}"
        shutil.copytree(src / name, dest)
        folders.append(dest)
    uuids = [json.loads((d / "trace.json").read_text())["device"]["uuid"] for d in folders[:2]]
    log = in_repo / "log.md"

    def drop_cards():            # every marker as one written before markers recorded the card
        text = log.read_text()
        for m in MARKER.finditer(text):
            entry = json.loads(m.group(1))
            entry.pop("card", None)
            text = text.replace(m.group(1), json.dumps(entry, sort_keys=True))
        log.write_text(text)

    assert main(["devlog", str(folders[0]), "--file", str(log)]) == 0
    drop_cards()
    assert main(["devlog", str(folders[1]), "--file", str(log)]) == 0
    last = log.read_text().split("**Performance** (")[-1]
    assert f"_Against the previous entry: the two profiles ran on different cards ({uuids[0]}, {uuids[1]})" in last
    drop_cards()
    shutil.rmtree(folders[1])
    assert main(["devlog", str(folders[2]), "--file", str(log)]) == 0
    last = log.read_text().split("**Performance** (")[-1]
    assert "compared with" in last and "different cards" not in last
    assert "_Against the previous entry: the previous entry recorded no card" in last
    assert "whether the two profiles ran on one machine is not known" in last


def test_an_entry_gives_the_hosts_pace_and_cautions_when_the_launches_moved_with_the_plan(in_repo):
    """Two real H200 profiles of the default join, back to back in two processes of identical code (the launch pace
    captures in tests/data/event): the second ran 24.5% faster while its host launched 10% faster and its loop held.
    Its entry gives both paces against the first's and the caution `compare` gives; the one-core profile after the
    second (slower, its launches quicker) gets none. On the CPU the launch pace is not measured, and says why."""
    import shutil
    import statistics

    data = Path(__file__).resolve().parents[1] / "data" / "event"
    log = in_repo / "log.md"
    for n, name in enumerate(("", "_next", "_one_core")):
        dest = in_repo / "profiles" / "event" / "join" / f"launch-pace{name or '_first'}"
        dest.mkdir(parents=True)
        shutil.copy(data / f"join_v4_100k_10k_h200_launch_pace{name}.trace.json", dest / "trace.json")
        assert main(["devlog", str(dest), "--file", str(log)]) == 0
    traces = [json.loads((data / f"join_v4_100k_10k_h200_launch_pace{n}.trace.json").read_text())
              for n in ("", "_next")]
    first, second, third = log.read_text().split("**Performance** (")[1:]

    def row(entry, name):
        return [c.strip() for c in next(ln for ln in entry.splitlines() if ln.startswith(f"| {name}")).split("|")[2:4]]

    launch = [statistics.median(t["timing"]["launch_pace"]["samples"]) * 1e6 for t in traces]
    assert row(first, "Host launch pace") == [f"{launch[0]:,.2f} us", "--"]
    value, vs = row(second, "Host launch pace")
    assert value == f"{launch[1]:,.2f} us" and vs.startswith(f"{100 * (launch[1] / launch[0] - 1):+.1f}% [")
    assert row(second, "Host CPU pace")[1].endswith("the same within its interval")
    # identical code, two processes: the runs read 24.5% faster; one process each is no verdict
    assert row(second, "Duration")[1] == "24.5% faster (no verdict: one process each)"
    assert "the duration has no verdict: one process a side" in second
    assert ("**Caution: the host's kernel launches took 10.0% less time in the new profile (an empty kernel launched "
            "before each timed run), the same way as the plan") in second
    assert "host CPU itself" not in second
    assert row(third, "Duration")[1].endswith("slower (no verdict: one process each)") and "Caution" not in third
    markers = [json.loads(m.group(1)) for m in MARKER.finditer(log.read_text())]
    assert markers[1]["launch_pace_samples"] == traces[1]["timing"]["launch_pace"]["samples"]

    assert main([*ARGS, "--devlog"]) == 0
    cpu = (in_repo / "docs" / "kernels" / "join.md").read_text()
    assert "| Host launch pace (an empty kernel launched before each timed run) | not measured (CPU run: the plan " \
           "launches no kernels) | -- |" in cpu
    assert re.search(r"\| Host CPU pace \(a fixed Python loop before each timed run\) \| \d[\d,]*\.\d us \| -- \|", cpu)


def test_nsys_entries_compare_within_one_backend(in_repo):
    """Three real nsys profiles of the default join on one H200 host (tests/data/nsys): traced by nsys, then by the
    cupti backend, then by nsys again. The cupti entry starts a series of its own (its tracer costs more, so it
    would read as a regression); the third entry compares with the first, and gives the host's paces nsys mode now
    times."""
    import shutil

    data = Path(__file__).resolve().parents[1] / "data" / "nsys"
    log = in_repo / "log.md"
    names = ("join_v4_100k_10k_h200_n1", "join_v4_100k_10k_h200_30_iterations_cupti", "join_v4_100k_10k_h200_n2")
    for name in names:
        dest = in_repo / "profiles" / "nsys" / "join" / name
        dest.mkdir(parents=True)
        shutil.copy(data / f"{name}.trace.json", dest / "trace.json")
        assert main(["devlog", str(dest), "--file", str(log)]) == 0
    first, cupti, third = log.read_text().split("**Performance** (")[1:]

    def row(entry, name):
        return [c.strip() for c in next(ln for ln in entry.splitlines() if ln.startswith(f"| {name}")).split("|")[2:4]]

    assert row(cupti, "Duration")[1] == "--"
    assert row(third, "Duration")[1].startswith("52.8% slower")
    assert row(third, "Host CPU pace")[1].startswith("+26.5% [")
    markers = [json.loads(m.group(1)) for m in MARKER.finditer(log.read_text())]
    assert [m["backend"] for m in markers] == ["nsys", "cupti", "nsys"]



@pytest.mark.parametrize("setup,devlog,fragment", [
    (lambda p: (p / "folder").mkdir(), "folder", "(it is a folder)"),
    (lambda p: (p / "binary.md").write_bytes(b"\xff entries"), "binary.md", "cannot read the devlog"),
    (lambda p: (p / "file").write_text("x"), "file/log.md", "file is not a folder)"),
    (lambda p: None, "x" * 300 + "/log.md", "(File name too long)"),
])
def test_a_bad_devlog_fails_before_the_profile_runs(in_repo, capsys, setup, devlog, fragment):
    """--devlog FILE is checked with the output folder, before any work: one line naming the flag, and no
    profile made only to be followed by an error."""
    setup(in_repo)
    assert main([*ARGS, "--out", str(in_repo / "out"), "--devlog", str(in_repo / devlog)]) == 5
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and fragment in err[0] and "pass --devlog FILE with a" in err[0], err
    assert not (in_repo / "out").exists()


def test_a_clock_state_the_reading_cannot_tell_is_logged_as_unknown(in_repo):
    """An entry says "clocks lock unknown" where the profile's clock reading could not tell (unreadable clocks),
    never "clocks not locked"; the next entry still finds its device in that line."""
    assert main(ARGS) == 0
    (d,) = (in_repo / "out").glob("profiles/event/join/*/*")
    params = json.loads((d / "params.json").read_text())
    params["clocks"] = {"locked": None, "reason": "clocks-unreadable", "detail": "lock unknown: sm_mhz unreadable"}
    (d / "params.json").write_text(json.dumps(params))
    assert main(["devlog", str(d)]) == 0
    text = (in_repo / "docs" / "kernels" / "join.md").read_text()
    assert ", clocks lock unknown," in text and "clocks not locked" not in text
    from app.report.devlog import PERFORMANCE_DEVICE
    assert PERFORMANCE_DEVICE.search(text)


def test_an_entry_names_the_settings_that_differ_from_the_previous_ones(in_repo):
    """As compare warns: the previous entry's profile ran no warm-up runs and this one did, so the first's timed
    runs include cold ones; its settings come from its marker (its profile may be gone). Edited into no object,
    the marker's settings are ignored, not a failure."""
    import shutil

    assert main([*ARGS, "--warmup", "0", "--devlog"]) == 0
    first = next((in_repo / "out").glob("profiles/event/join/*/*"))
    shutil.rmtree(first)                                     # the marker alone holds what it ran with
    assert main([*ARGS, "--warmup", "2", "--devlog"]) == 0
    log = in_repo / "docs" / "kernels" / "join.md"
    entries = log.read_text().split("**Performance** (")[1:]
    assert "warm-up" not in entries[0]
    assert "Against the previous entry: one profile ran no warm-up runs and another did" in entries[1]
    markers = [json.loads(m.group(1)) for m in MARKER.finditer(log.read_text())]
    assert [m["settings"]["warmup_runs"] for m in markers] == [0, 2]
    log.write_text(log.read_text().replace('"settings": {', '"settings": 7, "x": {'))
    assert main([*ARGS, "--warmup", "2", "--devlog"]) == 0
    assert "warm-up" not in log.read_text().split("**Performance** (")[-1]


def test_two_profiles_with_one_folder_name_are_two_entries(in_repo):
    """A folder is named for its second: two real profiles under two out roots (or one written in the second of a
    deleted one) share mode/kernel/params/timestamp. The second was once skipped as "already in"; the trace's
    digest tells them apart, and the same profile twice is still one entry."""
    assert main([*ARGS, "--out", "a"]) == 0 and main([*ARGS, "--out", "b"]) == 0
    first = next((in_repo / "a").glob("profiles/event/join/*/*"))
    other = next((in_repo / "b").glob("profiles/event/join/*/*"))
    if other.name != first.name:
        other = other.rename(other.with_name(first.name))
    log = in_repo / "log.md"
    for d in (first, other, first, other):
        assert main(["devlog", str(d), "--file", str(log)]) == 0
    markers = [json.loads(m.group(1)) for m in MARKER.finditer(log.read_text())]
    assert len(markers) == 2 and markers[0]["key"] == markers[1]["key"]
    assert markers[0]["trace_sha256"] != markers[1]["trace_sha256"]


PROFILES = Path(__file__).resolve().parents[2] / "docs" / "kernels" / "profiles"


def test_a_rate_is_not_compared_across_a_changed_cost_model(in_repo, monkeypatch):
    """Event mode's rates are the cost model's counts over the measured time. Two real H200 profiles of join v4 at
    the default sizes, before and after refine's FLOPs were counted as the kernel runs them (the model's FLOPs
    8.293 M, then 1.115 M; its bytes the same): the GB/s change is given, the TFLOP/s change is not, and the note
    says why. An entry whose marker predates the model's totals has them read from its profile where it is there."""
    old, new = PROFILES / "join-v4-100k-10k-ready-for-next-run", PROFILES / "join-v4-100k-10k-refine-flops-counted"
    log = in_repo / "log.md"
    for d in (old, new):
        assert main(["devlog", str(d), "--file", str(log)]) == 0
    text = log.read_text()
    second = text.split("**Performance** (")[2]
    row = {ln.split("|")[1].strip(): ln.split("|")[3].strip() for ln in second.splitlines() if ln.startswith("| ")}
    assert row["Achieved TFLOP/s"] == "-- (the cost model changed)"
    assert re.fullmatch(r"[+-]\d+\.\d%", row["Achieved GB/s"])
    assert "FLOPs 8.293 M then, 1.115 M now" in second and "bytes" not in second.split("FLOPs 8.293")[1][:30]
    markers = [json.loads(m.group(1)) for m in MARKER.finditer(text)]
    trace = json.loads((new / "trace.json").read_text())
    assert markers[1]["model"] == {k: trace["roofline"]["end_to_end"][k] for k in ("bytes", "flops")}
    # The first entry as an older version wrote it (no totals in its marker): its profile, found from the
    # repository's root by its key, gives them. With the profile not there, nothing is said.
    first = markers[0]
    assert first.pop("model")["flops"] == 8293208.0
    old_text = text.split("**Performance** (")[0] + "**Performance** (" + text.split("**Performance** (")[1]
    old_text = MARKER.sub(lambda m: f"<!-- app-kernel devlog entry {json.dumps(first, sort_keys=True)} -->", old_text)
    for where, said in ((PROFILES.parents[2], True), (in_repo, False)):
        monkeypatch.chdir(where)
        log.write_text(old_text)
        assert main(["devlog", str(new), "--file", str(log)]) == 0
        again = log.read_text().split("**Performance** (")[2]
        assert ("-- (the cost model changed)" in again) is said
