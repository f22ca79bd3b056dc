"""--baseline is checked before any profiling starts: bad files, wrong fields, unlike profiles."""
import json
import os
import subprocess
import sys

import pytest

from app.analysis.compare import compare_traces
from app.kernel.cli import main

ARGS = ["join", "--points", "300", "--polygons", "30", "--device", "cpu", "--bench_runs", "2", "--warmup", "0"]


def write(tmp_path, doc, name="trace.json"):
    p = tmp_path / name
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return p


@pytest.mark.parametrize("mutate,fragment", [
    (lambda t: {**t, "kernel": "overlay"}, "measured for kernel overlay (this run: join)"),
    (lambda t: {**t, "version": "v2"}, "measured for version v2 (this run: v5)"),
    (lambda t: {**t, "metadata": {**t["metadata"], "params": {**t["metadata"]["params"], "points": 999}}},
     "points=999 vs 300"),
    (lambda t: {**t, "device": {**t["device"], "name": "NVIDIA H100 80GB HBM3"}}, "device NVIDIA H100 80GB HBM3"),
])
def test_unlike_baselines_are_refused_unless_forced(tmp_path, capsys, good, no_profiling, mutate, fragment):
    p = write(tmp_path, mutate(good))
    assert main([*ARGS, "--out", str(tmp_path / "out"), "--baseline", str(p)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and fragment in err[0] and "--force" in err[0]
    assert not (tmp_path / "out").exists()


def test_forced_comparison_warns_at_the_top(tmp_path, good):
    p = write(tmp_path, {**good, "kernel": "overlay"})
    out = tmp_path / "out"
    assert main([*ARGS, "--out", str(out), "--baseline", str(p), "--force"]) == 0
    (d,) = list(out.glob("profiles/event/join/*/*"))
    report = (d / "report.md").read_text().splitlines()
    assert report[2].startswith("**Warning: The baseline is not comparable: it was measured for kernel overlay")


@pytest.mark.parametrize("doc,fragment", [
    ("{not json", "not a readable profile trace"),
    ("[1, 2]", "the JSON is not an object"),
    (lambda t: {**t, "total_elapsed_seconds": "fast"}, "total_elapsed_seconds='fast' is not a finite positive"),
    ('{"kernel": "join", "version": "v2", "total_elapsed_seconds": NaN, "stages": []}', "total_elapsed_seconds=nan"),
    (lambda t: {**t, "total_elapsed_seconds": True}, "is not a finite positive number"),
    (lambda t: {**t, "total_elapsed_seconds": -1}, "is not a finite positive number"),
    (lambda t: {**t, "total_elapsed_seconds": 0}, "total_elapsed_seconds=0 is not a finite positive number"),
    (lambda t: {**t, "stages": {"bounds": 1}}, "not a list of stages"),
    (lambda t: {**t, "stages": [{"name": "bounds", "elapsed_seconds": float("inf")}]}, "no finite elapsed_seconds"),
    (lambda t: {**t, "kernel": 7}, "field 'kernel' is missing or not a string"),
    (lambda t: {**t, "device": "gpu"}, "must be objects"),
])
def test_malformed_baselines_are_one_line(tmp_path, capsys, good, no_profiling, doc, fragment):
    p = write(tmp_path, doc(good) if callable(doc) else doc)
    assert main([*ARGS, "--out", str(tmp_path / "out"), "--baseline", str(p)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and fragment in err[0], err
    assert f"--baseline {p}: " in err[0]                  # the flag and the file, then what is wrong with it


def test_special_and_huge_files_are_refused_without_reading(tmp_path, capsys, no_profiling):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)                      # opening it would block forever
    assert main([*ARGS, "--out", str(tmp_path / "out"), "--baseline", str(fifo)]) == 2
    assert "is not a regular file" in capsys.readouterr().err
    huge = tmp_path / "huge.json"
    with open(huge, "wb") as f:
        f.truncate(1 << 30)              # sparse: 1 GiB of nothing
    assert main([*ARGS, "--out", str(tmp_path / "out"), "--baseline", str(huge)]) == 2
    assert "too large to be a profile trace" in capsys.readouterr().err
    assert main([*ARGS, "--out", str(tmp_path / "out"), "--baseline", "/dev/zero"]) == 2
    assert "is not a regular file" in capsys.readouterr().err


def test_change_has_the_right_sign():
    base = {"total_elapsed_seconds": 100e-6, "stages": [{"name": "a", "elapsed_seconds": 50e-6}]}
    cur = {"total_elapsed_seconds": 110e-6, "stages": [{"name": "a", "elapsed_seconds": 40e-6}]}
    result = compare_traces(base, cur)
    assert result["total"]["change_pct"] == pytest.approx(10.0)
    assert result["stages"][0]["change_pct"] == pytest.approx(-20.0)


def test_latest_profile_is_the_newest_on_this_device(tmp_path):
    from app.analysis.baseline import latest_profile
    from app.errors import BadParameter

    for name, device in (("20261126-100000", "H200"), ("20261126-110000", "H100"), ("20261126-090000", "H200"),
                         (".20261126-120000.partial-1", "H200")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "trace.json").write_text(json.dumps({"device": {"name": device}}))
    (tmp_path / "20261126-130000").mkdir()                      # no trace.json: skipped
    assert latest_profile(tmp_path, "H200").endswith("20261126-100000")
    assert latest_profile(tmp_path, "H100").endswith("20261126-110000")
    assert latest_profile(tmp_path, None).endswith("20261126-110000")
    with pytest.raises(BadParameter, match="no earlier profile of these parameters on A100"):
        latest_profile(tmp_path, "A100")
    with pytest.raises(BadParameter, match="no earlier profile"):
        latest_profile(tmp_path / "missing", "H200")


def test_mismatch_names_every_difference():
    from app.analysis.baseline import mismatch_of

    t = {"kernel": "join", "version": "v2", "metadata": {"params": {"points": 1, "polygons": 2}},
         "device": {"name": "H200"}}
    assert mismatch_of(t, "join", "v2", {"points": 1, "polygons": 2}, "H200") == ""
    assert mismatch_of(t, "join", "v2", {"points": 1, "polygons": 2}, None) == ""
    assert mismatch_of(t, "overlay", "v2", {}, "H200") == "kernel join (this run: overlay)"
    assert mismatch_of(t, "join", "v1", {"points": 1, "polygons": 2}, "H200") == "version v2 (this run: v1)"
    assert mismatch_of(t, "join", "v2", {"points": 5, "polygons": 2}, "H100") == \
        "other parameters (points=1 vs 5); device H200 (this run: H100)"


@pytest.mark.parametrize("samples", [["1"], [float("nan")], [-1.0], "fast", [True]])
def test_timing_samples_must_be_finite_numbers(tmp_path, good, samples):
    from app.analysis.baseline import read_trace
    from app.errors import BadParameter

    doc = dict(good)
    doc["stages"] = [dict(good["stages"][0], spread={**good["stages"][0]["spread"], "samples": samples})]
    p = write(tmp_path, doc)
    name = good["stages"][0]["name"]
    with pytest.raises(BadParameter, match=f"^--baseline {p}: the timing samples of stage '{name}' are not a list "
                                           "of finite non-negative numbers; the trace is damaged: profile again"):
        read_trace(str(p))
    whole = dict(good, timing={**good["timing"], "total": {**good["timing"]["total"], "samples": samples}})
    with pytest.raises(BadParameter, match="the timing samples of the whole plan are not a list of finite "
                                           "non-negative numbers"):
        read_trace(str(write(tmp_path, whole, "whole.json")))
    assert read_trace(str(write(tmp_path, good, "ok.json")))["kernel"] == "join"
    folder = tmp_path / "profile"
    folder.mkdir()
    write(folder, good)
    assert read_trace(str(folder)) == good                  # a profile folder: its trace.json


def test_other_card_is_named_when_the_profiles_ran_on_different_cards_or_may_have():
    """Profiles of one model from two cards are two machines: the note names both cards and says what to do.
    Two GPU runs where one or both record no card (an older trace) may be two machines: the note says that is not
    known. The same card, or a CPU run: nothing is said."""
    from app.analysis.baseline import other_card

    def on(uuid, runtime="gpu"):
        return {"selected_runtime": runtime, "device": {"name": "NVIDIA H200", **({"uuid": uuid} if uuid else {})}}

    after = ("part of the change may be the machines' (host speed, clocks), not the code's; time both on one machine "
             "before crediting the code")
    assert other_card(on("GPU-a"), on("GPU-b")) == \
        f"the two profiles ran on different cards (GPU-a, GPU-b), so on different machines: {after}"
    assert other_card(on(None), on("GPU-b")) == \
        ("the baseline profile does not record the card it ran on, so whether the two ran on one machine is not "
         f"known: {after}")
    assert other_card(on("GPU-a"), on(None)).startswith("the new profile does not record the card it ran on")
    assert other_card(on(None), on(None)).startswith("neither profile records the card it ran on")
    for base, new in ((on("GPU-a"), on("GPU-a")), (on(None, "cpu"), on(None, "cpu")), ({}, {}),
                      ({"device": None}, on("GPU-b")), (on(None, "cpu"), on("GPU-b"))):
        assert other_card(base, new) == ""


def test_other_backend_names_the_backends_of_nsys_profiles():
    """Real nsys-mode profiles of the default join on one H200 (tests/data/nsys), traced by nsys and by CUPTI:
    their times differ by the tracer alone, and the warning names both; profiles of one backend, and event-mode
    profiles (no tracer), get none."""
    from pathlib import Path

    from app.analysis.baseline import other_backend

    data = Path(__file__).resolve().parents[1] / "data"
    nsys, cupti = (json.loads((data / "nsys" / f"join_v4_100k_10k_h200_30_iterations{s}.trace.json").read_text())
                   for s in ("", "_cupti"))
    event = json.loads((data / "event" / "join_v4_100k_10k_h200_launch_pace.trace.json").read_text())
    assert other_backend([nsys, cupti]) == (
        "the nsys profiles were traced by different backends (nsys vs cupti), and each tracer adds its own cost to "
        "every CUDA call: their spans and launch paces differ by the tracer alone; compare profiles of one backend")
    assert other_backend([cupti, nsys, nsys]).startswith("the nsys profiles were traced by different backends "
                                                         "(cupti vs nsys)")
    assert other_backend([nsys, nsys]) == "" and other_backend([event, nsys]) == "" and other_backend([cupti]) == ""


def test_same_cpu_stages_only_for_cpu_runs_of_different_versions_of_one_code():
    """join v3 and v4 run v1's stages on the CPU (tests/cli/test_cpu_stages.py profiles them for real)."""
    from app.analysis.baseline import same_cpu_stages, stages_ran

    def t(version, ran=None, runtime="cpu"):
        return {"version": version, "selected_runtime": runtime, "metadata": {"cpu_stages_of": ran} if ran else {}}

    assert "v3 and v4 both run v1's" in same_cpu_stages([t("v3", "v1"), t("v4", "v1")])
    assert "v1 and v3 and v4 all run v1's" in same_cpu_stages([t("v1"), t("v3", "v1"), t("v4", "v1")])
    assert same_cpu_stages([t("v4", "v1"), t("v4", "v1")]) == ""                    # one version: a plain comparison
    assert same_cpu_stages([t("v1"), t("v2")]) == ""                                # different code
    assert same_cpu_stages([t("v3", runtime="gpu"), t("v4", runtime="gpu")]) == ""  # the GPU runs their own kernels
    assert same_cpu_stages([t("v1"), t("v4", runtime="gpu")]) == ""
    assert (stages_ran(t("v4", "v1")), stages_ran(t("v2"))) == ("v1", "v2")


# A real profile (join v4 100k x 10k on an H200, tests/data/event/README.md) with every timing field a check reads:
# the spreads' samples, the host's pace and the launch pace.
REAL = os.path.join(os.path.dirname(__file__), "..", "data", "event", "join_v4_100k_10k_h200_launch_pace.trace.json")


def real():
    with open(REAL, encoding="utf-8") as f:
        return json.load(f)


def _set(path, value):
    """An edit of a real trace: the field at ``path`` (keys and list indices) set to ``value``."""
    def edit(t):
        d = t
        for k in path[:-1]:
            d = d[k]
        d[path[-1]] = value
        return t
    return edit


@pytest.mark.parametrize("edit,why", [
    (_set(["metadata", "params"], [1]), "field 'metadata.params' must be an object"),
    (_set(["metadata", "tool"], "nsys"), "field 'metadata.tool' must be an object"),
    (_set(["timing"], [1, 2]), "field 'timing' is [1, 2], not an object"),
    (_set(["timing"], list(range(30))),                      # a long value: its first 60 characters, the end cut
     "field 'timing' is [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16..., not an object"),
    (_set(["timing", "host_pace"], 5), "field 'timing.host_pace' is 5, not an object"),
    (_set(["timing", "launch_pace"], "fast"), "field 'timing.launch_pace' is \"fast\", not an object"),
    (_set(["timing", "total", "samples"], [0.0, 0.0, 1e-3]),
     "the timing samples of the whole plan have a median of 0 s"),
    (_set(["stages", 1, "spread", "samples"], [0.0, 1e-5, 0.0]),
     "the timing samples of stage 'bounds' have a median of 0 s"),
    (_set(["stages", 1, "spread"], [1e-5]), "the spread of stage 'bounds' is [1e-05], not an object"),
    (_set(["timing", "host_pace", "samples"], [7e-5, 0.0]),
     "field 'timing.host_pace.samples' must be a list of finite positive numbers (seconds), and holds 0.0"),
    (_set(["timing", "launch_pace", "samples"], [9e-6, -1.0, 0.0]),
     "field 'timing.launch_pace.samples' must be a list of finite positive numbers (seconds), and holds -1.0"),
    (_set(["timing", "launch_pace", "samples"], [9e-6, "9us"]),
     "field 'timing.launch_pace.samples' must be a list of finite positive numbers (seconds), and holds \"9us\""),
    (_set(["timing", "launch_pace", "samples"], 9e-6),
     "field 'timing.launch_pace.samples' must be a list of finite positive numbers (seconds), and holds 9e-06"),
])
@pytest.mark.parametrize("what", ["--baseline", "devlog"])
def test_a_damaged_trace_is_refused_in_one_exact_line(tmp_path, edit, why, what):
    """Each damaged field of a real trace is named with its bad value, after the option (or command) and the file
    that brought it, then the fix for a damaged trace: the host's pace and the launch pace are checked alike."""
    from app.analysis.baseline import DAMAGED, read_trace
    from app.errors import BadParameter

    assert read_trace(REAL, what)["timing"]["launch_pace"]["samples"]        # the real trace itself is accepted
    p = write(tmp_path, edit(real()))
    with pytest.raises(BadParameter) as err:
        read_trace(str(p), what)
    assert str(err.value) == f"{what} {p}: {why}; {DAMAGED}"


def test_load_baseline_refuses_an_unlike_trace_unless_forced(tmp_path):
    """Not forced unless asked: the real 100k x 10k profile is no baseline for a 300 x 30 run, and with force=True
    it is one, marked with what differs."""
    from app.analysis.baseline import load_baseline
    from app.errors import BadParameter
    from app.kernel.plan import get_plan_class

    p = str(write(tmp_path, real()))
    run = get_plan_class("join", "v4")({"points": 300, "polygons": 30})
    differs = "other parameters (points=100000 vs 300, polygons=10000 vs 30)"
    with pytest.raises(BadParameter) as err:
        load_baseline(p, run, "NVIDIA H200")
    assert str(err.value) == (f"--baseline {p} was measured for {differs}; compare like with like, or pass --force to "
                              "compare anyway (the report will say so)")
    assert load_baseline(p, run, "NVIDIA H200", force=True)["_mismatch"] == differs
    assert "_mismatch" not in load_baseline(p, get_plan_class("join", "v4")({}), "NVIDIA H200")
    assert load_baseline(None, run) is None and load_baseline("", run) is None


# Reads a trace and finds the latest profile in a process whose locale encoding is ASCII (no UTF-8 mode, no
# coercion of the C locale): as a Windows user's cp1252, not UTF-8.
ASCII_LOCALE = """
import json, locale, sys
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from app.analysis.baseline import latest_profile, read_trace
print(json.dumps([locale.getpreferredencoding(False), read_trace(sys.argv[2])["device"]["name"],
                  latest_profile(Path(sys.argv[2]).parent, json.loads(sys.argv[3]))]))
"""


def test_a_trace_is_read_as_utf8_whatever_the_locale(tmp_path):
    """JSON is UTF-8: a trace holding text beyond ASCII (a hand-edited device name here) is read, and found as the
    latest profile of its device, the same under a locale whose encoding is not UTF-8."""
    from pathlib import Path

    from app.analysis.baseline import latest_profile, read_trace

    name = "NVIDIA H200 \u00ablent\u00bb"
    folder = tmp_path / "20261126-100000"
    folder.mkdir()
    (folder / "trace.json").write_text(json.dumps(_set(["device", "name"], name)(real()), ensure_ascii=False),
                                       encoding="utf-8")
    assert read_trace(str(folder))["device"]["name"] == name and latest_profile(tmp_path, name) == str(folder)
    env = {**os.environ, "LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
    src = Path(__file__).resolve().parents[2] / "src"
    done = subprocess.run([sys.executable, "-c", ASCII_LOCALE, str(src), str(folder), json.dumps(name)],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    encoding, read, latest = json.loads(done.stdout)
    assert (read, latest) == (name, str(folder)), encoding


def test_a_profile_without_a_total_time_says_why_it_cannot_be_compared(tmp_path, capsys, good, no_profiling):
    """A counter-mode profile whose kernel time ncu did not report has total_elapsed_seconds null (its report
    names the reading): compare, devlog and --baseline refuse it saying so, not as a damaged number."""
    p = write(tmp_path, {**good, "total_elapsed_seconds": None})
    assert main([*ARGS, "--out", str(tmp_path / "out"), "--baseline", str(p)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"error: --baseline {p}: the profile has no total time (a reading it needs is missing: its report.md names "
        "it), so there is nothing to compare or log; profile again")


def test_each_damaged_field_is_named_to_the_command_that_read_it(tmp_path, good):
    """The refusal names the reader (devlog here, not --baseline), the field and its value."""
    from app.analysis.baseline import read_trace
    from app.errors import BadParameter

    p = write(tmp_path, {**good, "stages": "none"})
    with pytest.raises(BadParameter, match=f"^devlog {p}: field 'stages' is missing or not a list of stages; "):
        read_trace(str(p), "devlog")
    p = write(tmp_path, {**good, "timing": {**good["timing"], "total": 5}}, "total.json")
    with pytest.raises(BadParameter, match=f"^devlog {p}: field 'timing.total' is 5, not an object; "):
        read_trace(str(p), "devlog")


def test_a_wrong_or_unchecked_output_is_no_baseline_and_latest_skips_it_saying_so(tmp_path, capsys):
    """verification_state reads every record a trace can hold; load_baseline refuses a wrong answer (and one the
    check could not run on) naming --baseline and the file; latest_profile skips each, named on stderr."""
    from app.analysis.baseline import (latest_profile, load_baseline, unverified_reason, verification_of,
                                       verification_state)
    from app.errors import VerificationFailed

    good = real()
    v = good["metadata"]["verification"]
    assert verification_of(good) is v and verification_state(v) == "ok" and unverified_reason(good) == ""
    assert verification_of({"metadata": {"verification": None}}) is None and verification_of([]) is None
    assert verification_state(None) == "skipped"
    damaged = verification_of({"metadata": {"verification": "yes"}})
    assert verification_state(damaged) == "error" and 'damaged ("yes")' in damaged["error"]
    wrong = real()
    wrong["metadata"]["verification"] |= {"matches": False, "missing": [[3, 87]], "extra": []}
    assert verification_state(verification_of(wrong)) == "mismatch"
    assert unverified_reason(wrong).startswith("its output did not match the reference (shapely")
    assert "missing: (3, 87)" in unverified_reason(wrong)
    broken = real()
    broken["metadata"]["verification"] = {"error": "ImportError: no shapely", "matches": None}
    assert unverified_reason(broken) == ("its output was not verified: the verification could not run "
                                         "(ImportError: no shapely)")
    for trace in (wrong, broken):
        p = write(tmp_path, trace)
        with pytest.raises(VerificationFailed, match=rf"^--baseline {p}: its output "):
            load_baseline(str(p))
    parent = tmp_path / "profiles"
    for name, trace in (("20261126-100000", good), ("20261126-110000", wrong), ("20261126-120000", broken)):
        (parent / name).mkdir(parents=True)
        (parent / name / "trace.json").write_text(json.dumps(trace))
    assert latest_profile(parent, None).endswith("20261126-100000")
    err = capsys.readouterr().err
    assert f"baseline latest: skipped {parent / '20261126-120000'}: its output was not verified" in err
    assert f"baseline latest: skipped {parent / '20261126-110000'}: its output did not match" in err


def test_what_differs_gives_every_count_the_record_holds(tmp_path):
    from app.analysis.baseline import check_baseline, read_trace, what_differs
    from app.errors import BadParameter
    from app.kernel.plan import get_plan_class

    assert what_differs({"pairs": 3, "expected_pairs": 2, "extra": [[1, 2]]}) == \
        "3 rows vs 2 expected: 0 missing, 1 extra; extra: (1, 2)"
    assert what_differs({"pairs": 9, "expected_pairs": 2, "extra": [[1, 2]], "extra_count": 7}).startswith(
        "9 rows vs 2 expected: 0 missing, 7 extra")
    assert what_differs({"pairs": 2, "expected_pairs": 2, "missing": [], "extra": []}) == \
        "2 rows vs 2 expected: 0 missing, 0 extra (the same rows, out of order or one repeated)"
    p = write(tmp_path, {"kernel": "join"})                              # damaged: named to --baseline by default
    with pytest.raises(BadParameter, match=rf"^--baseline {p}: "):
        read_trace(str(p))
    with pytest.raises(BadParameter, match=r"^--baseline <given>: "):
        check_baseline({"kernel": "join"}, "<given>")
    run = get_plan_class("join", "v4")({"points": 300, "polygons": 30})
    with pytest.raises(BadParameter, match=r"was measured for other parameters"):
        check_baseline(real(), "<given>", run, "NVIDIA H200")          # not forced unless asked


# --- the trace loader's one-line refusals and the settings two profiles differ in (fast: no profiling) ---------

def test_the_loader_names_the_path_and_the_fix_for_each_refusal(tmp_path, monkeypatch):
    from app.analysis import baseline as bl
    from app.errors import BadParameter

    partial = tmp_path / ".20261129-999999.partial-42"
    partial.mkdir()
    (partial / "trace.json").write_text("{}")
    with pytest.raises(BadParameter) as exc:
        bl.read_trace(str(partial))
    assert str(exc.value) == (f"--baseline {partial}: a profile folder still being written, or left by a writer that "
                              "was stopped (its name ends in .partial-<pid>); profile again, or pass a finished "
                              "profile folder")
    folder = tmp_path / "odd"
    (folder / "trace.json").mkdir(parents=True)
    with pytest.raises(BadParameter, match=rf"^NEW {folder}: {folder / 'trace.json'} is not a regular file; pass"):
        bl.read_trace(str(folder), "NEW")
    big = tmp_path / "big.trace.json"
    big.write_text("{}")
    monkeypatch.setattr(bl, "MAX_BYTES", 1)
    with pytest.raises(BadParameter, match=rf"^--baseline {big}: {big} is 0 MiB, too large to be a profile trace"):
        bl.read_trace(str(big))
    monkeypatch.setattr(bl, "MAX_BYTES", 64 << 20)
    big.write_text('{"kernel": "join", ')
    with pytest.raises(BadParameter, match=rf"^BASE {big}: not a readable profile trace .*; {bl.DAMAGED}$"):
        bl.read_trace(str(big), "BASE")


def test_the_settings_two_profiles_differ_in_are_each_named():
    from app.analysis.baseline import mismatch_of, other_settings

    def trace(l2="flush", warm=400, runtime="gpu", cpus=None):
        return {"selected_runtime": runtime, "timing": {"l2": {"mode": l2}, "warmup": {"runs": warm}},
                "device": {"name": "X"} | ({"logical_cpus": cpus} if cpus else {})}

    assert other_settings([trace(), trace(warm=813)]) == ""
    assert other_settings([trace(), trace(l2="keep")]) == (
        "the profiles treated L2 differently between timed runs (flush vs keep): a kept L2 serves repeat reads that a "
        "flushed one fetches from DRAM")
    assert other_settings([trace(warm=0), trace()]) == (
        "one profile ran no warm-up runs and another did: the timed runs of the first include cold ones")
    assert other_settings([trace(warm=0), trace(warm=0)]) == ""
    assert other_settings([trace(runtime="cpu", cpus=2), trace(runtime="cpu", cpus=64)]) == (
        "the CPU profiles ran on hosts of 2 vs 64 logical CPUs: other machines")
    assert other_settings([trace(cpus=2), trace(cpus=64)]) == ""          # GPU profiles: the card says which machine
    assert other_settings([{"device": {}}, {"timing": None, "device": {}}]) == ""      # older traces: nothing to say
    # a trace without metadata (an old one) has no parameters to differ in
    assert mismatch_of({"kernel": "join", "version": "v4"}, "join", "v4", {"points": 1}, None) == ""
