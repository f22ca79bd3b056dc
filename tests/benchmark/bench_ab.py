"""A kernel's versions against each other, interleaved in one process: which is fastest, and is the default it.

    python -m tests.benchmark.bench_ab join [--versions v3,v4] [--sizes 100k:10k] [--rounds 200]

bench_all runs the versions one after another, so a host that slows down between them moves one version's
figure and not the others'. On an H200 node it read join v3 at 0.175 ms after the build and v4 at 0.267 ms
(100k x 10k). Interleaved on the same node, v4 was the faster. Here every round runs each version once, in a
shuffled order. On a GPU the L2 is flushed before each run. Each run is timed two ways:

- **after the build**: the plan's stages after the host->device build, on the plan's own clock (CUDA events on a
  GPU);
- **end to end**: host arrays in, the result back in host arrays, on the host clock. This is a run of the bare
  plan (no stage marks) plus the copy back.

Per version: the medians with their ~95% intervals. Then each version against the fastest: the median of the
rounds' paired ratios (this version's time over the fastest's in the same round) with its interval. It is
called slower where the interval lies above 1, a tie where it holds 1 (and faster where it lies below 1: the
rounds then disagree with the medians). Last, whether the kernel's
default version is the fastest or ties with it, which is what the tool promises of its default. Every version's
output is checked against shapely's before any run is timed.
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from app.errors import AppError  # noqa: E402
from app.kernel.plan import get_plan_class, kernels, same_cpu_code  # noqa: E402
from app.runtime.device import select  # noqa: E402
from app.runtime.execute import backend_for, xp_for  # noqa: E402
from app.runtime.lock import device_key, device_lock  # noqa: E402
from app.runtime.nvtx import Nvtx  # noqa: E402
from app.runtime.recorder import Recorder  # noqa: E402
from app.runtime.stats import median_interval  # noqa: E402
from app.runtime.timing import L2Flush  # noqa: E402
from tests.benchmark.bench_all import _inputs_and_reference  # noqa: E402
from tests.benchmark.bench_join import ms, parse_size  # noqa: E402

DEFAULT_SIZES = {"join": "100k:10k", "overlay": "10k:10k"}
MEASURES = ("after", "e2e")
LABEL = {"after": "after build", "e2e": "end to end"}


def shuffled_rounds(names, rounds: int, warm: int, seed: int):
    """Each round every name once, in an order shuffled afresh (seeded): ``(name, counted)``, the first ``warm``
    rounds not counted. A fixed or merely reversed order would leave some names always at a round's ends."""
    order, rng = list(names), random.Random(seed)
    for i in range(warm + rounds):
        rng.shuffle(order)
        for name in order:
            yield name, i >= warm


def against_fastest(times: dict[str, list[float]]) -> dict:
    """``times``: each version's run times, round by round (paired by index). The fastest version by median,
    and for every version the median of its paired ratios to the fastest, their ~95% interval and a verdict."""
    fastest = min(times, key=lambda v: statistics.median(times[v]))
    out = {}
    for v, ts in times.items():
        ratios = [x / y for x, y in zip(ts, times[fastest]) if y > 0]
        mid, (lo, hi) = statistics.median(ratios), median_interval(ratios)
        # Under six rounds there is no 95% interval (NaN) and nothing is judged.
        said = "fastest" if v == fastest else ("slower" if lo > 1 else "faster" if hi < 1 else
                                              "tie" if lo == lo else "not judged")
        out[v] = {"median": statistics.median(ts), "ci": median_interval(ts), "ratio": mid, "ratio_ci": (lo, hi),
                  "verdict": said}
    return {"fastest": fastest, "versions": out}


def default_text(default: str, verdicts: dict) -> str:
    """What the runs say of the default version, for one measure."""
    if default not in verdicts["versions"]:
        return f"the default {default} was not measured"
    d = verdicts["versions"][default]
    if d["verdict"] == "fastest":
        return f"the default {default} is the fastest"
    lo, hi = d["ratio_ci"]
    ratio = f"{d['ratio']:.2f}x [{lo:.2f}-{hi:.2f}] of {verdicts['fastest']}'s time"
    if d["verdict"] == "slower":
        return f"the default {default} is SLOWER than {verdicts['fastest']}: {ratio}"
    if d["verdict"] == "faster":     # paired, faster; by median, not: the rounds disagree with the medians
        return (f"the default {default} is faster than {verdicts['fastest']} round by round ({ratio}), though "
                f"{verdicts['fastest']}'s median is lower")
    if d["verdict"] == "not judged":
        return (f"the default {default} is not judged against {verdicts['fastest']} ({d['ratio']:.2f}x of its time): "
                "a 95% interval of the rounds' ratios needs at least 6 rounds")
    return f"the default {default} ties with the fastest, {verdicts['fastest']} ({ratio})"


def measure(kernel: str, versions: list[str], a: int, b: int, rounds: int, warm: int, seed: int,
            device: str) -> dict:
    params, inputs, _, ok = _inputs_and_reference(kernel, versions[-1], a, b, 16, 1)
    sel = select(device)
    arms, checked = {}, {}
    for v in versions:
        plan = get_plan_class(kernel, v)(params)
        backend, _ = backend_for(plan, sel)
        xp = xp_for(sel.selected)
        rec = Recorder(sel.selected, xp, Nvtx(False, kernel))
        bare = Recorder(sel.selected, xp, Nvtx(False, kernel), per_stage=False)
        out, _ = rec.run(plan, inputs, backend)
        checked[v] = ok(backend.outputs_to_host(out))     # read now: the next run reuses the result's buffers
        arms[v] = (plan, backend, rec, bare)
    flush = L2Flush(sel.selected, "flush", sel.info.get("l2_bytes"))
    times = {m: {v: [] for v in versions} for m in MEASURES}
    for v, counted in shuffled_rounds(versions, rounds, warm, seed):
        plan, backend, rec, bare = arms[v]
        flush()
        _, r = rec.run(plan, inputs, backend)
        flush()
        t0 = time.perf_counter()
        out, _ = bare.run(plan, inputs, backend)
        backend.outputs_to_host(out)
        e2e = time.perf_counter() - t0
        if counted:
            times["after"][v].append(r.total_seconds - r.stages[0]["seconds"])
            times["e2e"][v].append(e2e)
    return {"kernel": kernel, "size": f"{a:,} x {b:,}", "rounds": rounds, "device": sel.device_name,
            "runtime": sel.selected,
            "l2": flush.describe()["mode"], "default": get_plan_class(kernel).version, "ok": checked,
            "first_stage": r.stages[0]["name"], **{m: against_fastest(times[m]) for m in MEASURES}}


def lines(r: dict) -> list[str]:
    l2 = "L2 flushed before each run" if r["l2"] == "flush" else "no GPU L2 to flush"
    out = [f"{r['kernel']} {r['size']} ({r['device']}, {r['rounds']} rounds, versions in a shuffled order each "
           f"round, {l2}; after the build = the run less its first stage, {r['first_stage']})"]
    for v in r["after"]["versions"]:
        parts = []
        for m in MEASURES:
            x = r[m]["versions"][v]
            rel = "fastest" if x["verdict"] == "fastest" else (
                f"{x['ratio']:.2f}x of {r[m]['fastest']}'s time, not judged: under 6 rounds"
                if x["verdict"] == "not judged" else
                f"{x['ratio']:.2f}x [{x['ratio_ci'][0]:.2f}-{x['ratio_ci'][1]:.2f}] of "
                f"{r[m]['fastest']}'s time, {x['verdict']}")
            parts.append(f"{LABEL[m]} {ms(x['median'], x['ci'])} ({rel})")
        out.append(f"  {v:<4} " + "  ".join(parts) + f"  ok={r['ok'][v]}")
    out.append("  " + "; ".join(f"{LABEL[m]}: {default_text(r['default'], r[m])}" for m in MEASURES))
    return out + _same_code(r)


def _same_code(r: dict) -> list[str]:
    """On the CPU, the versions that run one version's stages (they differ in their GPU kernels only): their ratios
    to each other are the runs' noise, not the versions'."""
    if r.get("runtime") != "cpu":
        return []
    return [f"  on the CPU {' and '.join(vs)} run {ran}'s stages (the versions differ in their GPU kernels only): "
            "they time the same code, so their ratios to each other are noise"
            for ran, vs in same_cpu_code(r["kernel"], r["after"]["versions"]).items()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kernel", choices=sorted(kernels()), help="the kernel whose versions to compare")
    ap.add_argument("--versions", metavar="V1,V2,...", help="versions to compare (default: every version)")
    ap.add_argument("--sizes", metavar="A:B[,A:B...]",
                    help="sizes (points:polygons for join, left:right for overlay; default: the default sizes, "
                         + ", ".join(f"{k} {v}" for k, v in DEFAULT_SIZES.items()) + ")")
    ap.add_argument("--rounds", type=int, default=200, metavar="N", help="rounds of every version once (default 200)")
    ap.add_argument("--warm", type=int, default=20, metavar="N", help="rounds run first and not counted (default 20)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the rounds' shuffled order")
    ap.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto")
    args = ap.parse_args(argv)
    known = sorted(kernels()[args.kernel])
    versions = args.versions.split(",") if args.versions else known
    unknown = [v for v in versions if v not in known]
    if unknown or len(versions) < 2 or args.rounds < 3:
        why = (f"unknown version {unknown[0]} of {args.kernel} (known: {', '.join(known)})" if unknown else
               "--versions needs two versions or more" if len(versions) < 2 else
               "--rounds must be at least 3 (a median's interval needs them)")
        print(f"bench_ab: {why}", file=sys.stderr)
        return 2
    try:
        sizes = [tuple(parse_size(x) for x in s.split(":"))
                 for s in (args.sizes or DEFAULT_SIZES[args.kernel]).split(",")]
        if any(len(s) != 2 for s in sizes):
            raise ValueError
    except (ValueError, IndexError):
        print(f"bench_ab: --sizes {args.sizes!r}: expected A:B[,A:B...], e.g. 100k:10k", file=sys.stderr)
        return 2
    try:
        sel = select(args.device)
    except AppError as exc:
        print(f"bench_ab: {exc}", file=sys.stderr)
        return 2
    with device_lock(device_key(sel)):
        results = [measure(args.kernel, versions, a, b, args.rounds, args.warm, args.seed, args.device)
                   for a, b in sizes]
    print("\nVersions interleaved (medians with ~95% intervals in brackets; against the fastest: the median of "
          "the rounds' paired ratios)")
    for r in results:
        print("\n".join(lines(r)))
    return 0 if all(all(r["ok"].values()) for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
