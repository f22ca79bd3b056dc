"""Mutation run over the modules behind the README's promises (CI calls it before the tests).

    python tests/mutation/run.py [--min-score PCT] [--all]

Copies the checkout to a temporary folder, configures mutmut there (the real
pyproject.toml is left alone), mutates only SCOPE, runs only TESTS against each
mutant, then prints the score and every surviving mutant with its diff. Exits 1
when the score (killed / tested) falls below --min-score, so a weakened test
suite fails CI.

By default it tests a fixed sample, the mutants whose number ends in 1: about 1 in 10,
every mutated function's first mutant among them, the same ones on every run of the
same code. All ~890 take about 7 minutes of a 2-core machine, too long for CI's 10
minutes beside the tests. The sample took 52 s there (77.5% killed); the mutants ending in
1 or 5, twice as many, took 85 s (74.5%). --all tests every one.
"""
from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCOPE = ["src/app/analysis/baseline.py", "src/app/analysis/intervals.py", "src/app/report/writer.py",
         "src/app/runtime/lock.py", "src/app/runtime/memory.py"]
# mutmut 3.8's own `mutmut show`, for many mutants in one process.
DIFFS = """
import sys
from mutmut.__main__ import find_mutant, get_diff_for_mutant
for name in sys.argv[1:]:
    diff = get_diff_for_mutant(name, path=find_mutant(name).path)
    changed = [ln.strip() for ln in diff.splitlines() if ln[:1] in "+-" and ln[:3] not in ("+++", "---")]
    print(name + "\\t" + " / ".join(changed)[:200])
"""
SAMPLE = "*__mutmut_*1"     # mutmut numbers each function's mutants 1, 2, ... in source order
TESTS = ["tests/cli/test_baseline.py", "tests/runtime/test_lock.py", "tests/report/test_writer.py",
         "tests/runtime/test_memory.py", "tests/analysis/test_timeline_accounting.py",
         "tests/report/test_verification_text.py", "tests/report/test_counter_profiles_compared.py"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--min-score", type=float, default=70.0, metavar="PCT")
    ap.add_argument("--all", action="store_true", help="test every mutant, not the sample (about 7 minutes)")
    args = ap.parse_args()
    mutmut = shutil.which("mutmut", path=os.path.dirname(sys.executable)) or shutil.which("mutmut")
    if not mutmut:
        print("mutation run: mutmut is not installed (pip install -e '.[mutation]')", file=sys.stderr)
        return 2
    work = Path(tempfile.mkdtemp(prefix="app-mutation-"))
    try:
        shutil.copytree(ROOT, work / "repo", ignore=shutil.ignore_patterns(".venv", ".git", "out", "mutants",
                                                                        "__pycache__", ".carry", "*.egg-info"))
        repo = work / "repo"
        others = sorted(f for f in glob.glob("src/**/*.py", root_dir=repo, recursive=True) if f not in SCOPE)
        with open(repo / "pyproject.toml", "a") as f:
            f.write("\n[tool.mutmut]\nsource_paths = [\"src/\"]\n"
                    f"do_not_mutate = {others!r}\n".replace("'", '"')
                    + f"pytest_add_cli_args_test_selection = {TESTS!r}\n".replace("'", '"')
                    + 'also_copy = ["tests", "conf"]\n')
        run = subprocess.run([mutmut, "run", *([] if args.all else [SAMPLE])], cwd=repo, capture_output=True,
                             text=True)
        results = subprocess.run([mutmut, "results", "--all", "true"], cwd=repo, capture_output=True, text=True).stdout
        status = [line.rsplit(": ", 1) for line in results.splitlines() if ": " in line]
        counts: dict[str, int] = {}
        for _, s in status:
            counts[s.strip()] = counts.get(s.strip(), 0) + 1
        killed = sum(counts.get(k, 0) for k in ("killed", "timeout", "segfault"))
        tested = killed + counts.get("survived", 0)
        score = 100 * killed / tested if tested else 0.0
        survivors = [name.strip() for name, s in status if s.strip() == "survived"]
        print(f"mutation run over {', '.join(SCOPE)}"
              + ("" if args.all else "\n  a sample: the mutants numbered ...1 (--all tests every one)"))
        print("  " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
        print(f"  score: {killed} of {tested} tested mutants killed = {score:.1f}% (minimum {args.min_score:.0f}%)")
        if survivors:
            # Every survivor's diff, from one process: `mutmut show NAME` (which prints any of them in a mutation
            # checkout) costs a process of its own, about 1.3 s a mutant on a 2-core machine.
            shown = subprocess.run([sys.executable, "-c", DIFFS, *survivors], cwd=repo, capture_output=True,
                                   text=True).stdout
            diffs = dict(line.split("\t", 1) for line in shown.splitlines() if "\t" in line)
            print(f"  {len(survivors)} surviving mutants:")
            for name in survivors:
                print(f"    {name}: {diffs.get(name, '(no diff: mutmut show NAME in a mutation checkout)')}")
        if not tested:      # mutmut checked nothing (its own test run failed, or it stopped): say what it said
            print("mutation run: mutmut tested no mutant (exit status "
                  f"{run.returncode}); the end of its output:\n" + run.stdout[-2000:] + run.stderr[-2000:],
                  file=sys.stderr)
            return 2
        return 0 if score >= args.min_score else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
