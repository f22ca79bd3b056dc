"""`python -m app.kernel ab BASE_REV NEW_REV [--processes N] [--out DIR] [compare options] -- KERNEL [ARGS...]`.

Is a code change faster? Profiles the same command at two git revisions of this checkout, each in a git worktree
of its own (the checkout itself is left alone, uncommitted changes included), in fresh processes, the two
revisions in turns (A B, then B A, ...), then compares them as sets of processes (``compare``). A lent host's
speed changes from one process to the next by more than many code changes (six processes of the default join's
identical code read 373 to 597 us on an H200 host), so one profile a side can call the host's change the code's;
three or more a side, in turns, put that change in the interval. The profiles are kept under ``--out``.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from app.errors import BadParameter, OneLineParser
from app.report.compare_command import run_compare


# Each process is a whole profile of each revision, run in turns: a count past this is a typo, not a plan.
MAX_PROCESSES = 100


def parser() -> OneLineParser:
    p = OneLineParser(prog="python -m app.kernel ab", allow_abbrev=False,
                      description="Profile one command at two git revisions of this checkout, in turns, in fresh "
                                  "processes (a worktree each), and compare the two as sets of processes: is the "
                                  "change faster, slower, or noise on this host?",
                      epilog="example: python -m app.kernel ab HEAD~1 HEAD --processes 3 -- join v4 --bench_runs 20")
    p.add_argument("base", metavar="BASE_REV", help="the earlier revision (anything git rev-parse takes)")
    p.add_argument("new", metavar="NEW_REV", help="the later revision")
    p.add_argument("--processes", type=int, default=3, metavar="N",
                   help=f"profiles of each revision, each in its own process (default 3; 2 to {MAX_PROCESSES})")
    p.add_argument("--out", metavar="DIR", help="where the profiles go (default out/ab/<timestamp>)")
    p.add_argument("--json", action="store_true", help="print the comparison as one JSON document")
    p.add_argument("--fail-on-regression", metavar="PCT", help="as compare's: exit 1 when NEW is slower by more")
    p.add_argument("--floor", metavar="PCT", help="as compare's")
    p.add_argument("--force", action="store_true", help="as compare's")
    return p


def _git(args: list[str], cwd: str) -> str:
    r = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["no message"])[-1]
        raise BadParameter(f"git {' '.join(args)}: {last}")
    return r.stdout.strip()


def _profile(tree: Path, command: list[str], out: Path, label: str) -> str:
    """One profile of ``command`` by the code of ``tree``, in a fresh process; its folder."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(tree / "src"), os.environ.get("PYTHONPATH"))
                                                      if p))
    r = subprocess.run([sys.executable, "-m", "app.kernel", *command, "--out", str(out)], cwd=tree, env=env,
                       capture_output=True, text=True)
    lines = r.stdout.strip().splitlines()
    if r.returncode != 0 or not lines or "profile: " not in lines[-1]:
        why = (r.stderr.strip().splitlines() or lines or ["no output"])[-1]
        raise BadParameter(f"the profile at {label} failed (exit {r.returncode}): {why}")
    found = Path(lines[-1].split("profile: ", 1)[1])
    return str(found if found.is_absolute() else tree / found)


def run_ab(argv: list[str]) -> int:
    if "--" not in argv:
        parser().parse_known_args(argv)                                  # --help answers here
        raise BadParameter("ab: give the command to profile after --, e.g. ab HEAD~1 HEAD -- join v4")
    split = argv.index("--")
    args, command = parser().parse_args(argv[:split]), argv[split + 1:]
    if not command or command[0].startswith("-"):
        raise BadParameter("ab: the command after -- must start with a kernel, e.g. -- join v4 --bench_runs 20")
    if args.processes < 2:
        raise BadParameter("--processes expects a whole number >= 2: one process a side cannot show how much the "
                           "host changes from one process to the next")
    if args.processes > MAX_PROCESSES:
        raise BadParameter(f"--processes {args.processes:,}: at most {MAX_PROCESSES} (each is a whole profile of each "
                           "revision, run one after another; a dozen a side already resolves a host's spread)")
    if "--out" in command or any(a.startswith("--out=") for a in command):
        raise BadParameter("ab: give --out before --, not in the command: ab keeps each revision's profiles apart")
    root = _git(["rev-parse", "--show-toplevel"], os.getcwd())
    revs = {}
    for side, rev in (("base", args.base), ("new", args.new)):
        found = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"], cwd=root,
                               capture_output=True, text=True)
        if found.returncode != 0:
            raise BadParameter(f"{'BASE_REV' if side == 'base' else 'NEW_REV'} {rev!r} names no commit of {root}")
        revs[side] = found.stdout.strip()
    out = Path(args.out or Path("out") / "ab" / time.strftime("%Y%m%d-%H%M%S")).resolve()
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
    finally:
        for tree in trees.values():
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=root, capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
        subprocess.run(["git", "worktree", "prune"], cwd=root, capture_output=True)    # one half-made stays no entry
    print(f"ab: {args.processes} profiles of each revision in {out}", file=sys.stderr)
    flags = (["--json"] if args.json else []) + (["--force"] if args.force else []) + [
        x for flag, value in (("--fail-on-regression", args.fail_on_regression), ("--floor", args.floor))
        if value is not None for x in (flag, value)]
    return run_compare([",".join(profiles["base"]), ",".join(profiles["new"]), *flags])
