"""`python -m app.kernel ab BASE_REV NEW_REV [--processes N] [--out DIR] [compare options] -- KERNEL [ARGS...]`.

Is a code change faster? Profiles the same command at two git revisions of this checkout, each in a git worktree
of its own (the checkout itself is left alone, uncommitted changes included), in fresh processes, the two
revisions in turns (A B, then B A, ...), then compares them as sets of processes (``compare``). A lent host's
speed changes from one process to the next by more than many code changes (six processes of the default join's
identical code read 373 to 597 us on an H200 host), so one profile a side can call the host's change the code's;
sets of processes, in turns, put that change in the interval, and compare draws a verdict from MIN_PROCESSES a side
or more (analysis.compare says why). The profiles are kept under ``--out``, also when ab is stopped.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from app.analysis.compare import MIN_PROCESSES, MIN_RUNS
from app.errors import AppError, BadParameter, OneLineParser, Terminated
from app.report.compare_command import check_percentages, run_compare
from app.report.writer import check_writable
from app.runtime.profiling.base import ONE_ITERATION_MODES


# Each process is a whole profile of each revision, run in turns: a count past this is a typo, not a plan.
MAX_PROCESSES = 100
# How long a profiling child may take to stop by itself (its own clean-up) once ab is stopped, before it is killed.
CHILD_STOP_SECONDS = 30

# Options of the profiling command that ab cannot pass through: each would change what the child prints or writes
# where ab cannot use it (the child runs in a temporary worktree that is removed at the end).
REFUSED = {
    "--out": "ab: give --out before --, not in the command: ab keeps each revision's profiles apart",
    "--json": "ab: give --json before --, not in the command: after -- it would print each profile's trace, not the "
              "comparison",
    "--devlog": "ab: --devlog after -- would append to a devlog in the temporary worktree, which is removed; append "
                "the kept profiles afterwards (python -m app.kernel devlog PROFILE)",
    "--help": "ab: --help after -- asks the kernel for its help, not a profile: run python -m app.kernel KERNEL --help",
    "-h": "ab: -h after -- asks the kernel for its help, not a profile: run python -m app.kernel KERNEL --help",
}
# The modes that time one warm iteration: compare never judges their single run, so ab would make 2 x N profiles
# for a certain "noise" (the profiles' own list: app.runtime.profiling.base.ONE_ITERATION_MODES).


def parser() -> OneLineParser:
    p = OneLineParser(prog="python -m app.kernel ab", allow_abbrev=False,
                      description="Profile one command at two git revisions of this checkout, in turns, in fresh "
                                  "processes (a worktree each), and compare the two as sets of processes: is the "
                                  "change faster, slower, or noise on this host?",
                      epilog=f"example: python -m app.kernel ab HEAD~1 HEAD -- join v4 --bench_runs 20 (the "
                             f"command after -- takes no --out, --json, --devlog or --help; --bench_runs at least "
                             f"{MIN_RUNS})")
    p.add_argument("base", metavar="BASE_REV", help="the earlier revision (anything git rev-parse takes)")
    p.add_argument("new", metavar="NEW_REV", help="the later revision")
    p.add_argument("--processes", type=int, default=MIN_PROCESSES, metavar="N",
                   help=f"profiles of each revision, each in its own process (default and least {MIN_PROCESSES}: "
                        f"compare draws no verdict from fewer processes a side; at most {MAX_PROCESSES})")
    p.add_argument("--out", metavar="DIR", help="where the profiles go (default out/ab/<timestamp>)")
    p.add_argument("--json", action="store_true", help="print the comparison as one JSON document")
    p.add_argument("--fail-on-regression", type=float, metavar="PCT",
                   help="as compare's: exit 1 when NEW is slower by more")
    p.add_argument("--floor", type=float, metavar="PCT", help="as compare's")
    p.add_argument("--force", action="store_true", help="as compare's")
    return p


def _option_values(command: list[str], *flags: str) -> list[str]:
    """The values given to any of ``flags`` in ``command`` (``--flag VALUE`` or ``--flag=VALUE``)."""
    values = []
    for i, arg in enumerate(command):
        for flag in flags:
            if arg == flag and i + 1 < len(command):
                values.append(command[i + 1])
            elif arg.startswith(flag + "="):
                values.append(arg[len(flag) + 1:])
    return values


def _check_command(command: list[str]) -> None:
    """Refuse, before anything runs, a command whose profiles ab cannot find or compare cannot judge."""
    if not command or command[0].startswith("-"):
        raise BadParameter("ab: the command after -- must start with a kernel, e.g. -- join v4 --bench_runs 20")
    for flag, why in REFUSED.items():
        if flag in command or any(a.startswith(flag + "=") for a in command):
            raise BadParameter(why)
    for mode in _option_values(command, "--prof_type", "--prof-type"):
        if mode in ONE_ITERATION_MODES:
            raise BadParameter(f"ab: --prof_type {mode} profiles one warm iteration, and compare judges nothing under "
                               f"{MIN_RUNS} runs in every process: use --prof_type event or nsys")
    for runs in _option_values(command, "--bench_runs", "--bench-runs"):
        if runs.isdigit() and int(runs) < MIN_RUNS:
            raise BadParameter(f"ab: --bench_runs {runs} gives each process {runs} timed run(s), and compare judges "
                               f"nothing under {MIN_RUNS} runs in every process (runs are not summed over processes): "
                               f"give --bench_runs {MIN_RUNS} or more, or leave it out (10)")


def _git(args: list[str], cwd: str) -> str:
    r = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["no message"])[-1]
        raise BadParameter(f"git {' '.join(args)}: {last}")
    return r.stdout.strip()


class ProfileFailed(AppError):
    """A profiling child that failed: ab exits with the child's own status (9 for a wrong answer, 4 for a busy
    device, ...)."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def _run_child(argv: list[str], cwd: Path, env: dict) -> tuple[int, str, str]:
    """Run one profiling child; when ab itself is stopped (Ctrl-C, SIGTERM), the child is sent SIGTERM and given
    CHILD_STOP_SECONDS for its own clean-up (it keeps a complete profile, deletes a partial one), then killed."""
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate()
    except KeyboardInterrupt:
        try:
            proc.terminate()
            proc.communicate(timeout=CHILD_STOP_SECONDS)
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            proc.kill()
            proc.wait()
        raise
    return proc.returncode, out, err


def _profile(tree: Path, command: list[str], out: Path, label: str) -> str:
    """One profile of ``command`` by the code of ``tree``, in a fresh process; its folder (from the child's
    ``profile:`` line, wherever it is in its output)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(tree / "src"), os.environ.get("PYTHONPATH"))
                                                      if p))
    code, stdout, stderr = _run_child([sys.executable, "-m", "app.kernel", *command, "--out", str(out)], tree, env)
    lines = stdout.strip().splitlines()
    found = [line.split("profile: ", 1)[1].strip() for line in lines if line.startswith("profile: ")]
    if code != 0:
        why = (stderr.strip().splitlines() or lines or ["no output"])[-1]
        why = why[len("error: "):] if why.startswith("error: ") else why
        status = f"exit {code}" if code > 0 else f"killed by signal {-code}"
        raise ProfileFailed(f"the profile at {label} failed ({status}): {why}", code if code > 0 else 128 - code)
    if not found:
        last = (lines or stderr.strip().splitlines() or ["no output"])[-1]
        raise BadParameter(f"the profile at {label} ended with exit 0 but printed no 'profile: ' line, so ab cannot "
                           f"tell which folder it wrote (its last line: {last})")
    path = Path(found[-1])
    return str(path if path.is_absolute() else tree / path)


def _kept(out: Path) -> dict[str, set[Path]]:
    """The complete profile folders (each with its trace.json) under OUT/base and OUT/new."""
    return {side: {p.parent for p in (out / side).glob("profiles/*/*/*/*/trace.json")
                   if not p.parent.name.startswith(".")} for side in ("base", "new")}


def _made(out: Path, before: dict[str, set[Path]]) -> tuple[int, str]:
    """What ab leaves behind when it stops before comparing: how many profiles this run made under ``out`` (found
    on disk, a child's that completed as ab was stopped too), and a line that says so."""
    now = _kept(out)
    made = {side: len(now[side] - before[side]) for side in now}
    n = made["base"] + made["new"]
    return n, (f"{n} profile{'' if n == 1 else 's'} kept under {out} (no comparison made): {made['base']} of "
               f"BASE_REV in base/, {made['new']} of NEW_REV in new/")


def run_ab(argv: list[str]) -> int:
    if "--" not in argv:
        parser().parse_known_args(argv)                                  # --help answers here
        raise BadParameter("ab: give the command to profile after --, e.g. ab HEAD~1 HEAD -- join v4")
    split = argv.index("--")
    args, command = parser().parse_args(argv[:split]), argv[split + 1:]
    if args.processes < MIN_PROCESSES:
        raise BadParameter(f"--processes expects a whole number >= {MIN_PROCESSES}: compare draws no verdict from "
                           "fewer processes a side (its interval resamples the processes, and fewer resolve too "
                           "coarsely to tell the host's change between processes from the code's)")
    if args.processes > MAX_PROCESSES:
        raise BadParameter(f"--processes {args.processes:,}: at most {MAX_PROCESSES} (each is a whole profile of each "
                           "revision, run one after another; a dozen a side already resolves a host's spread)")
    check_percentages(args)         # compare's own checks, before any worktree is made or profile run
    _check_command(command)
    root = _git(["rev-parse", "--show-toplevel"], os.getcwd())
    revs = {}
    for side, rev in (("base", args.base), ("new", args.new)):
        found = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], cwd=root,
                               capture_output=True, text=True)
        if found.returncode != 0:
            raise BadParameter(f"{'BASE_REV' if side == 'base' else 'NEW_REV'} {rev!r} names no commit of {root}")
        revs[side] = found.stdout.strip()
    out = Path(args.out or Path("out") / "ab" / time.strftime("%Y%m%d-%H%M%S")).resolve()
    check_writable(out)
    before = _kept(out)
    try:
        profiles = _profile_both(args, command, revs, root, out)
        print(f"ab: {args.processes} profiles of each revision in {out}", file=sys.stderr)
        flags = (["--json"] if args.json else []) + (["--force"] if args.force else []) + [
            x for flag, value in (("--fail-on-regression", args.fail_on_regression), ("--floor", args.floor))
            if value is not None for x in (flag, repr(value))]
        return run_compare([",".join(profiles["base"]), ",".join(profiles["new"]), *flags])
    except ProfileFailed as exc:        # the profiles made before it are kept: say so on the same line
        n, made = _made(out, before)
        if n:
            raise ProfileFailed(f"{exc}; {made}", exc.exit_code) from None
        raise
    except KeyboardInterrupt as exc:    # Ctrl-C, or SIGTERM (cli.main maps it to Terminated): what was made is kept
        terminated = isinstance(exc, Terminated)
        print(f"{'terminated' if terminated else 'interrupted'}: {_made(out, before)[1]}", file=sys.stderr)
        return 143 if terminated else 130


def _profile_both(args, command: list[str], revs: dict, root: str, out: Path) -> dict[str, list[str]]:
    """Each revision's profiles, made in turns in worktrees of their own, which are removed however this ends."""
    work = Path(tempfile.mkdtemp(prefix="app-ab-"))
    trees = {}
    try:
        for side, rev in revs.items():
            trees[side] = work / side
            _git(["worktree", "add", "--detach", str(trees[side]), rev], root)
            if not (trees[side] / "src" / "app" / "kernel" / "__main__.py").is_file():
                raise BadParameter(f"{getattr(args, side)} ({rev[:12]}) holds no src/app/kernel: not a revision "
                                   "of this tool")
        profiles = {"base": [], "new": []}
        for i in range(args.processes):
            for side in (("base", "new") if i % 2 == 0 else ("new", "base")):
                label = f"{getattr(args, side)} ({revs[side][:12]}), process {i + 1} of {args.processes}"
                print(f"ab: profiling {label}", file=sys.stderr, flush=True)
                profiles[side].append(_profile(trees[side], command, out / side, label))
        return profiles
    finally:
        for tree in trees.values():
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=root, capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
        subprocess.run(["git", "worktree", "prune"], cwd=root, capture_output=True)    # one half-made stays no entry
