"""A signal while the profile is written leaves the output root as the run found it; a signal after the profile is
reported leaves the profile complete and the process ends sanely. Real processes and real signals, as a user's
Ctrl-C, a scheduler's SIGTERM or a closed terminal's SIGHUP would come."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.kernel.plan import get_plan_class
from app.report import writer
from app.report.writer import make_folders, write_profile
from tests.signals import sigint_default
from tests.conftest import child_env

ARGS = ["join", "--points", "300", "--polygons", "30", "--device", "cpu", "--warmup", "0", "--no-verify"]
# Many timed runs of a tiny plan: about 2 s on a CPU, and a trace.json of about 1 MB whose writing keeps the
# .partial folder there for some tens of milliseconds (5 ms at 200 runs), long enough to catch by polling.
WRITE_RUNS = "3000"
SLUG = get_plan_class("join", None)({"points": 300, "polygons": 30}).slug()
NAMES = {signal.SIGTERM: ("terminated", 143), signal.SIGINT: ("interrupted", 130), signal.SIGHUP: ("hung up", 129)}


def start(out: Path, runs: str, cwd: Path, preexec_fn=sigint_default) -> subprocess.Popen:
    env = child_env(PYTHONUNBUFFERED="1")
    # SIGINT at its default, as a terminal's foreground job has it (tests/signals.py says why)
    return subprocess.Popen([sys.executable, "-m", "app.kernel", *ARGS, "--bench_runs", runs, "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd,
                            preexec_fn=preexec_fn)


def signal_when_partial(p: subprocess.Popen, parent: Path, signum: int, timeout: float = 60) -> bool:
    """Send ``signum`` the moment a .partial folder shows under ``parent``; False when the run ended first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and p.poll() is None:
        try:
            if any(".partial-" in name for name in os.listdir(parent)):
                p.send_signal(signum)
                return True
        except FileNotFoundError:
            pass
        time.sleep(0.0005)
    return False


def tree(root: Path) -> set:
    return {str(x.relative_to(root)) for x in root.rglob("*")} if root.exists() else set()


@pytest.mark.parametrize("signum,existing", [(signal.SIGTERM, False), (signal.SIGINT, True), (signal.SIGHUP, False)],
                         ids=["SIGTERM, new --out", "SIGINT, --out with folders of its own", "SIGHUP, new --out"])
def test_a_signal_during_the_write_leaves_no_folders_behind(tmp_path, signum, existing):
    """The signal lands while the profile is written aside: exit 143/130, one line saying no profile was written,
    and under --out exactly what was there before -- no empty profiles/event/join/<slug>/ chain; the folders that
    were there before the run (empty or not) stay."""
    what, code = NAMES[signum]
    for attempt in range(3):              # a signal that came after the rename finds the profile complete: again
        root = tmp_path / f"try{attempt}"
        root.mkdir()
        out = root / "out"
        if existing:
            (out / "profiles" / "event").mkdir(parents=True)          # made before the run, empty: it stays
            (out / "notes.txt").write_text("mine")
        before = tree(out)
        p = start(out, WRITE_RUNS, root)
        sent = signal_when_partial(p, out / "profiles" / "event" / "join" / SLUG, signum)
        stdout, stderr = p.communicate(timeout=60)
        assert sent, f"the run ended (exit {p.returncode}) before any .partial folder showed: {stderr[-2000:]}"
        if "profile: " in stdout or "the profile was complete" in stderr:
            continue                      # too late: the window was missed, not the rule broken
        lines = [ln for ln in stderr.splitlines() if ln.strip() and not ln.startswith("[")]   # not progress lines
        assert p.returncode == code and "Traceback" not in stderr, stderr[-3000:]
        assert lines == [f"{what}: no profile was written"], stderr[-3000:]
        assert tree(out) == before, sorted(tree(out) - before)
        if existing:
            assert (out / "profiles" / "event").is_dir() and (out / "notes.txt").read_text() == "mine"
        else:
            assert not out.exists()
        return
    pytest.fail("in 3 runs the signal never landed while the profile was being written")


@pytest.mark.parametrize("signum,delay", [(signal.SIGTERM, 0.0), (signal.SIGINT, 0.0), (signal.SIGTERM, 0.05),
                                          (signal.SIGHUP, 0.0)])
def test_a_signal_after_the_profile_is_reported_keeps_it_and_ends_sanely(tmp_path, signum, delay):
    """Once "profile: <path>" is printed the profile is complete; a signal then must not kill the process with no
    word (it was exit -15/-2). The run ends with its own exit status, or -- where the signal still finds it
    reporting -- with 143/130 and one line that the profile is complete and where it is."""
    what, code = NAMES[signum]
    out = tmp_path / "out"
    p = start(out, "2", tmp_path)
    path = None
    for line in p.stdout:
        if line.startswith("profile: "):
            path = Path(line.split("profile: ", 1)[1].strip())
            time.sleep(delay)
            p.send_signal(signum)
            break
    stdout, stderr = p.communicate(timeout=60)
    assert path is not None, stderr[-3000:]
    lines = [ln for ln in stderr.splitlines() if ln.strip() and not ln.startswith("[")]
    assert "Traceback" not in stderr, stderr[-3000:]
    if p.returncode == 0:
        assert lines == [], stderr
    else:
        assert p.returncode == code and lines == [f"{what}: the profile was complete and is kept at {path}"], \
            (p.returncode, stderr[-3000:])
    assert json.loads((path / "trace.json").read_text())["kernel"] == "join"
    assert (path / "report.md").is_file() and not list(out.rglob(".*partial*"))


def test_only_the_folders_the_write_made_are_removed_and_only_while_empty(tmp_path, monkeypatch):
    """In process: an interrupt before the rename removes the chain of folders the write created, innermost first,
    stops at one that something else was put in meanwhile, and never touches a folder that was there before."""
    root = tmp_path / "root"
    root.mkdir()
    other = root / "a" / "other.txt"

    def interrupted(parent, stamp):
        other.write_text("another run's")          # put in a folder this write made, while it wrote
        raise KeyboardInterrupt
    monkeypatch.setattr(writer, "claim_folder", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_profile(root / "a" / "b" / "c", {"trace.json": {}})
    assert tree(tmp_path) == {"root", "root/a", "root/a/other.txt"}

    def interrupted_plain(parent, stamp):
        raise KeyboardInterrupt
    monkeypatch.setattr(writer, "claim_folder", interrupted_plain)
    with pytest.raises(KeyboardInterrupt):
        write_profile(root / "x" / "y", {"trace.json": {}})
    assert tree(tmp_path) == {"root", "root/a", "root/a/other.txt"}


def test_make_folders_lists_only_what_it_made(tmp_path):
    (tmp_path / "a").mkdir()
    made = []
    make_folders(tmp_path / "a" / "b" / "c", made)
    assert made == [tmp_path / "a" / "b", tmp_path / "a" / "b" / "c"] and made[-1].is_dir()
    again = []
    make_folders(tmp_path / "a" / "b" / "c", again)
    assert again == []
