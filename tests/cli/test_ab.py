"""ab: one command profiled at two git revisions, in turns, in fresh processes, compared as sets. A real git
repository of this tool's code in a temporary folder: revision A as it is, revision B with a real code change (a
50 ms sleep in the CPU join's candidate_filter), so B is slower in that stage and nowhere else it could hide."""
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from app.kernel.cli import main

ROOT = Path(__file__).resolve().parents[2]
COMMAND = ["--", "join", "--points", "2000", "--polygons", "200", "--device", "cpu", "--bench_runs", "3",
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
    return repo


def test_the_slower_revision_is_slower_in_the_stage_that_changed(repo, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(repo)
    out = tmp_path / "out"
    assert main(["ab", "HEAD~1", "HEAD", "--processes", "2", "--out", str(out), "--json", *COMMAND]) == 0
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    by = {s["name"]: s for s in doc["stages"]}
    assert doc["verdict"] == "slower" and by["candidate_filter"]["verdict"] == "slower"
    assert doc["total"]["processes"] == [2, 2]
    # the revisions ran in turns, A B then B A, each profile made by its revision's code (params.json says which)
    order = [line.split("profiling ")[1].split(" (")[0] for line in captured.err.splitlines() if "profiling" in line]
    assert order == ["HEAD~1", "HEAD", "HEAD", "HEAD~1"]
    commits = {side: {json.loads(p.read_text())["git"]["commit"]
                      for p in (out / side).glob("profiles/event/join/*/*/params.json")} for side in ("base", "new")}
    assert commits == {"base": {git(repo, "rev-parse", "HEAD~1")}, "new": {git(repo, "rev-parse", "HEAD")}}
    # the worktrees are gone and the checkout untouched
    assert git(repo, "worktree", "list").count("\n") == 0 and git(repo, "status", "--porcelain") == ""


@pytest.mark.parametrize("argv,fragment", [
    (["ab", "HEAD", "nope-rev", *COMMAND], "NEW_REV 'nope-rev' names no commit of"),
    (["ab", "HEAD~1", "HEAD", "join"], "give the command to profile after --"),
    (["ab", "HEAD~1", "HEAD", "--processes", "1", *COMMAND], "--processes expects a whole number >= 2"),
    (["ab", "HEAD~1", "HEAD", *COMMAND, "--out", "x"], "give --out before --"),
    (["ab", "HEAD~1", "HEAD", "--", "join", "--points", "-5"], "the profile at HEAD~1"),
])
def test_bad_input_is_one_line_and_leaves_no_worktree(repo, monkeypatch, capsys, argv, fragment):
    monkeypatch.chdir(repo)
    assert main(argv) == 2
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("ab: profiling")]
    assert len(err) == 1 and fragment in err[0], err
    assert git(repo, "worktree", "list").count("\n") == 0
