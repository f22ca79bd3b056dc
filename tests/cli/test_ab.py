"""ab: one command profiled at two git revisions, in turns, in fresh processes, compared as sets. A real git
repository of this tool's code in a temporary folder: revision A as it is, revision B with a real code change (a
50 ms sleep in the CPU join's candidate_filter), so B is slower in that stage and nowhere else it could hide; and,
on a branch of its own, revision W whose join drops a row of its answer (a wrong output, the CLI's exit 9)."""
import json
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.analysis.compare import MIN_PROCESSES, MIN_RUNS
from app.kernel.cli import main
from app.report import ab_command
from tests.signals import sigint_default
from tests.conftest import child_env

ROOT = Path(__file__).resolve().parents[2]
# MIN_PROCESSES processes a side (ab's default) of MIN_RUNS runs each: the fewest compare draws a verdict from
COMMAND = ["--", "join", "--points", "2000", "--polygons", "200", "--device", "cpu", "--bench_runs", str(MIN_RUNS),
           "--warmup", "0", "--no-verify"]


def git(repo, *args):
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    repo = tmp_path_factory.mktemp("ab") / "repo"
    repo.mkdir()
    shutil.copytree(ROOT / "src", repo / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    shutil.copytree(ROOT / "conf", repo / "conf")
    git(repo, "init", "-q")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "add", "-A")
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "A")
    cpu = repo / "src" / "app" / "kernel" / "join" / "cpu.py"
    text = cpu.read_text()
    head = "    def candidate_filter(self, state, st, tiling):\n"
    assert head in text
    cpu.write_text(text.replace(head, head + "        __import__('time').sleep(0.05)\n"))
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "B: a sleep in candidate_filter")
    git(repo, "branch", "wrong", "HEAD~1")
    git(repo, "checkout", "-q", "wrong")
    text = cpu.read_text()
    head = "    def output_sort(self, state, st, tiling):\n"
    assert head in text
    cpu.write_text(text.replace(head, "    def output_sort(self, state, st, tiling):\n"
                                      "        self._output_sort(state, st, tiling)\n"
                                      "        p, q = state['output']\n"
                                      "        state['output'] = (p[1:], q[1:])\n\n"
                                      "    def _output_sort(self, state, st, tiling):\n"))
    git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "W: a row dropped from the answer")
    git(repo, "checkout", "-q", "-")
    return repo


def test_the_slower_revision_is_slower_in_the_stage_that_changed(repo, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(repo)
    out = tmp_path / "out"
    assert main(["ab", "HEAD~1", "HEAD", "--out", str(out), "--json", *COMMAND]) == 0     # --processes: default
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    by = {s["name"]: s for s in doc["stages"]}
    assert doc["verdict"] == "slower" and by["candidate_filter"]["verdict"] == "slower"
    assert doc["total"]["processes"] == [MIN_PROCESSES, MIN_PROCESSES]
    # the revisions ran in turns, A B then B A, each profile made by its revision's code (params.json says which)
    order = [line.split("profiling ")[1].split(" (")[0] for line in captured.err.splitlines() if "profiling" in line]
    assert order == (["HEAD~1", "HEAD", "HEAD", "HEAD~1"] * MIN_PROCESSES)[:2 * MIN_PROCESSES]
    commits = {side: {json.loads(p.read_text())["git"]["commit"]
                      for p in (out / side).glob("profiles/event/join/*/*/params.json")} for side in ("base", "new")}
    assert commits == {"base": {git(repo, "rev-parse", "HEAD~1")}, "new": {git(repo, "rev-parse", "HEAD")}}
    # the worktrees are gone and the checkout untouched
    assert git(repo, "worktree", "list").count("\n") == 0 and git(repo, "status", "--porcelain") == ""


@pytest.mark.parametrize("argv,fragment", [
    (["ab", "HEAD", "nope-rev", *COMMAND], "NEW_REV 'nope-rev' names no commit of"),
    (["ab", "HEAD~1", "HEAD", "join"], "give the command to profile after --"),
    (["ab", "HEAD~1", "HEAD", "--", "join", "--points", "-5"], "the profile at HEAD~1"),
])
def test_bad_input_is_one_line_and_leaves_no_worktree(repo, monkeypatch, capsys, argv, fragment):
    monkeypatch.chdir(repo)
    assert main(argv) == 2
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("ab: profiling")]
    assert len(err) == 1 and fragment in err[0], err
    assert git(repo, "worktree", "list").count("\n") == 0


@pytest.mark.parametrize("argv,fragment", [
    # fewer processes a side than compare draws a verdict from: default and least agree
    (["--processes", "1", *COMMAND], f"--processes expects a whole number >= {MIN_PROCESSES}"),
    (["--processes", str(MIN_PROCESSES - 1), *COMMAND], f"--processes expects a whole number >= {MIN_PROCESSES}"),
    # runs are judged in each process, never summed over a side: 3 processes of 2 runs are not 6 runs
    ([*COMMAND[:-6], "--bench_runs", "2"], "--bench_runs 2 gives each process 2 timed run(s)"),
    ([*COMMAND[:-6], "--bench-runs=5"], "--bench_runs 5 gives each process 5 timed run(s)"),
    ([*COMMAND, "--prof_type", "ncu"], "--prof_type ncu profiles one warm iteration"),
    # what the child would print or write where ab cannot use it
    ([*COMMAND, "--out", "x"], "give --out before --"),
    ([*COMMAND, "--json"], "give --json before --"),
    ([*COMMAND, "--devlog"], "--devlog after -- would append to a devlog in the temporary worktree"),
    ([*COMMAND, "--devlog=log.md"], "--devlog after --"),
    ([*COMMAND, "--help"], "--help after -- asks the kernel for its help"),
    ([*COMMAND, "-h"], "-h after -- asks the kernel for its help"),
    # compare's options, typed and range-checked before any profile
    (["--floor", "abc", *COMMAND], "argument --floor: invalid float value: 'abc'"),
    (["--floor", "-1", *COMMAND], "--floor must be a finite percentage >= 0"),
    (["--fail-on-regression", "nan", *COMMAND], "--fail-on-regression must be a finite percentage >= 0"),
])
def test_what_cannot_give_a_verdict_is_refused_before_any_profile(repo, tmp_path, monkeypatch, capsys, argv, fragment):
    """One line, exit 2, before any worktree is made or any profile run (it had run every profile first)."""
    monkeypatch.chdir(repo)
    made = []
    monkeypatch.setattr(ab_command, "_profile_both", lambda *a: made.append(a) or pytest.fail("profiling began"))
    assert main(["ab", "HEAD~1", "HEAD", "--out", str(tmp_path / "out"), *argv]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and fragment in err[0] and captured.out == "", err
    assert not made and not (tmp_path / "out").exists() and git(repo, "worktree", "list").count("\n") == 0


def test_the_help_says_the_default_and_the_least_processes(capsys):
    with pytest.raises(SystemExit):
        main(["ab", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"(default and least {MIN_PROCESSES}: compare draws no verdict from fewer processes a side" in text
    assert ab_command.parser().get_default("processes") == MIN_PROCESSES


def test_a_wrong_answer_stops_ab_with_the_childs_exit_and_keeps_what_was_made(repo, tmp_path, monkeypatch, capsys):
    """W's profile does not match the reference: its child exits 9, and so does ab, naming why, with the profile
    made before it kept (it had said exit 2 for every child's failure)."""
    monkeypatch.chdir(repo)
    out = tmp_path / "out"
    command = [a for a in COMMAND if a != "--no-verify"]
    assert main(["ab", "HEAD~1", "wrong", "--out", str(out), *command]) == 9
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("ab: profiling")]
    assert len(err) == 1, err
    assert err[0].startswith("error: the profile at wrong (") and "process 1 of" in err[0] and "(exit 9)" in err[0]
    assert "output does not match" in err[0]
    # W's own profile is kept too, as the CLI keeps a wrong answer's for inspection
    assert f"2 profiles kept under {out} (no comparison made): 1 of BASE_REV in base/, 1 of NEW_REV in new/" in err[0]
    assert git(repo, "worktree", "list").count("\n") == 0


def test_the_profile_is_found_by_its_line_and_an_exit_0_child_is_never_failed(tmp_path, monkeypatch):
    """The child's folder is its 'profile: ' line wherever it is (a devlog line used to follow it); a child that
    exits 0 with no such line is said to, not called failed."""
    lines = "summary\nprofile: prof/a\ndevlog: appended to docs/kernels/join.md\n"
    monkeypatch.setattr(ab_command, "_run_child", lambda *a: (0, lines, ""))
    assert ab_command._profile(tmp_path, ["join"], tmp_path / "o", "X") == str(tmp_path / "prof" / "a")
    monkeypatch.setattr(ab_command, "_run_child", lambda *a: (0, "{}\n", "profile: to stderr\n"))
    with pytest.raises(ab_command.BadParameter) as err:
        ab_command._profile(tmp_path, ["join"], tmp_path / "o", "X")
    assert "failed" not in str(err.value) and "ended with exit 0 but printed no 'profile: ' line" in str(err.value)
    monkeypatch.setattr(ab_command, "_run_child", lambda *a: (4, "", "error: another profile holds the device\n"))
    with pytest.raises(ab_command.ProfileFailed) as err:
        ab_command._profile(tmp_path, ["join"], tmp_path / "o", "X")
    assert err.value.exit_code == 4 and str(err.value) == "the profile at X failed (exit 4): another profile holds " \
                                                          "the device"


@pytest.mark.parametrize("sig,word,code", [(signal.SIGTERM, "terminated", 143), (signal.SIGINT, "interrupted", 130)])
def test_a_stopped_ab_says_which_profiles_it_kept(repo, tmp_path, sig, word, code):
    """A real ab process stopped after its first profile: it says how many complete profiles it kept under --out
    (it had said 'no profile was written'), as many as are on disk, and leaves no worktree."""
    out = tmp_path / "out"
    env = child_env(repo / "src")
    with open(tmp_path / "stdout", "w") as stdout:
        proc = subprocess.Popen([sys.executable, "-m", "app.kernel", "ab", "HEAD~1", "HEAD", "--out", str(out),
                                 *COMMAND], cwd=repo, env=env, stdout=stdout, stderr=subprocess.PIPE, text=True,
                                preexec_fn=sigint_default)
        try:
            seen = []
            while sum(line.startswith("ab: profiling") for line in seen) < 2:    # the first profile is complete
                line = proc.stderr.readline()
                assert line, seen
                seen.append(line)
            time.sleep(0.5)                                                     # the second one under way
            proc.send_signal(sig)
            seen.append(proc.stderr.read())
            assert proc.wait(timeout=120) == code
        finally:
            if proc.poll() is None:
                proc.kill()
    last = "".join(seen).strip().splitlines()[-1]
    found = re.fullmatch(rf"{word}: (\d+) profiles? kept under {re.escape(str(out))} \(no comparison made\): "
                         r"(\d+) of BASE_REV in base/, (\d+) of NEW_REV in new/", last)
    assert found, last
    on_disk = [len(list((out / side).glob("profiles/event/join/*/*/trace.json"))) for side in ("base", "new")]
    assert [int(found[2]), int(found[3])] == on_disk and int(found[1]) == sum(on_disk) >= 1
    assert not list(out.glob("**/.*partial*"))                 # the stopped child's half-made profile is gone
    assert (tmp_path / "stdout").read_text() == ""            # no comparison printed
    assert git(repo, "worktree", "list").count("\n") == 0
