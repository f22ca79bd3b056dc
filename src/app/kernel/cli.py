"""The command line: parse, pick plan and mode, profile under the device lock, write atomically.

Every failure a user can cause ends in one line on stderr naming the fix and a
non-zero exit (app.errors); Ctrl-C leaves nothing behind.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys

from app.analysis.baseline import latest_profile, load_baseline
from app.errors import AppError, BadParameter, DeviceUnavailable, OneLineParser, Terminated, VerificationCouldNotRun
from app.kernel.plan import DEFAULTS, default_version, get_plan_class, kernels
from app.report.writer import check_writable, profile_parent, write_profile
from app.runtime import device as devmod
from app.runtime.profiling import ProfileOptions, get_mode
from app.runtime.profiling.base import MAX_BENCH_RUNS, MAX_WARMUP
from app.runtime.timing import AUTO_MAX_RUNS, L2_MODES, WARMUP_MAX_RUNS

USAGE = "python -m app.kernel {list | <kernel> [<version>]} [--prof_type MODE] [options] [kernel parameters]"


def _common(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--prof_type", "--prof-type", default="event", metavar="{event,annotation,ncu,nsys}",
        help="event (default): CUDA events in process; annotation / ncu: Nsight Compute counters; "
             "nsys: timeline and wall-time accounting")
    add("--device", default="auto", choices=devmod.DEVICES,
        help="auto (default): the GPU if one is usable, else the CPU; gpu: fail if none is usable; cpu: the CPU")
    add("--bench_runs", "--bench-runs", type=bench_runs_arg, default=None, metavar="{N,auto}",
        help=f"timed runs (default 10, at most {MAX_BENCH_RUNS:,}); auto (event mode): until the median's 95%% "
             "interval is within 1%% or 10 s are spent; annotation and ncu profile one warm iteration and accept "
             "only 1")
    add("--l2", choices=L2_MODES, default="flush",
        help="event mode, GPU: flush (default) overwrites L2 before every timed run, so no run finds the previous "
             "run's data cached; keep leaves it warm")
    add("--autotune", action="store_true", help="GPU: search the stages' tunables with event timing (once per "
        "kernel, version, GPU, driver and parameters; cached and reused by every mode)")
    add("--retune", action="store_true", help="search again even when the autotune cache has an answer")
    add("--tiling", action="append", metavar="STAGE.KEY=VALUE", help="set one tunable of a stage of this kernel "
        "(stages as `list` names them) by hand, e.g. candidate_filter.block=128 for join or "
        "segment_mbr_filter.block=128 for overlay (repeatable; wins over the cache)")
    add("--graph", action="store_true", help="event mode: say whether the plan can be captured as a CUDA graph "
        "and why not; on a GPU, also time the stages after the build replayed as one graph (with the sizes an "
        "eager run read) next to the same stages launched eagerly")
    add("--overhead", choices=("precise", "quick"), default="precise",
        help="event mode, GPU: what the per-stage marks cost, from pairs of runs with and without them. precise "
             "(default): pairs until the estimate's 95%% interval is within 0.5%% (at most 400, or about 1 s); "
             "quick: 30 pairs (sweeps use it: their points share one host's measurement window)")
    add("--warmup", type=warmup_arg, default="auto", metavar="{N,auto}",
        help=f"discarded runs after the cold run: N (at most {MAX_WARMUP:,}), or auto (default): until the plan's "
             "time stops changing (two windows of 5 runs within 2%%, after at least 0.5 s; at most 5 s)")
    add("--nvtx", action="store_true", help="emit an NVTX range per stage (domain = kernel)")
    add("--out", default="out", metavar="DIR",
        help="output root (default: out, under the current folder); profiles go to "
             "DIR/profiles/<mode>/<kernel>/<params>/<time>/")
    add("--json", action="store_true", help="print trace.json to stdout")
    add("--baseline", metavar="PROFILE", help="a previous profile folder (or its trace.json) to compare against, or "
        "'latest' (the newest profile of this kernel, version, mode, parameters and device under --out whose output "
        "matched the reference: newer ones whose output did not, or could not be checked, are skipped and named); it "
        "must be of the same kernel, version, parameters and device, and a profile with a wrong output is refused")
    add("--devlog", nargs="?", const="", metavar="FILE", help="append this profile's Performance block to a devlog "
        "(default docs/kernels/<kernel>.md under the current folder); nothing is appended when the output did not "
        "match the reference or could not be checked")
    add("--force", action="store_true", help="compare with a --baseline of another kernel, version, parameters or "
        "device anyway (the report warns at the top)")
    add("--no-verify", dest="verify", action="store_false", help="skip the shapely check of the output")
    add("--ncu", metavar="PATH", help="Nsight Compute executable (default: $NCU, PATH, CUDA folders)")
    add("--ncu-timeout", type=float, default=600.0, metavar="SECONDS",
        help="seconds before ncu is stopped (default 600)")
    add("--ncu-clock-control", choices=("none", "base"), default="none",
        help="ncu's clock control: none (default; lock clocks with scripts/) or base")
    add("--nsys", metavar="PATH", help="Nsight Systems executable (default: $NSYS, PATH, Nsight install folders)")
    add("--nsys-timeout", type=float, default=600.0, metavar="SECONDS",
        help="seconds before nsys (or the cupti worker) is stopped (default 600)")
    add("--backend", choices=("nsys", "cupti"), default="nsys",
        help="nsys mode's trace source: nsys (default) or cupti (in process with cupti-python, no nsys needed)")
    # internal: the profiled subprocess of the annotation/ncu/nsys modes
    add("--worker", help=argparse.SUPPRESS)
    add("--worker-iterations", type=int, default=1, help=argparse.SUPPRESS)
    add("--worker-collect", choices=("none", "cupti"), default="none", help=argparse.SUPPRESS)
    add("--worker-tiling", help=argparse.SUPPRESS)
    add("--worker-pace", action="store_true", help=argparse.SUPPRESS)


def _count_or_auto(text: str, flag: str, least: int, most: int, why: str):
    """A run count for ``flag``: a whole number from ``least`` to ``most`` (``why``: the reason for the bound), or
    "auto"."""
    if text == "auto":
        return "auto"
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of runs or 'auto', got {text!r}") from None
    if n < least:
        raise argparse.ArgumentTypeError(f"{flag} must be >= {least}")
    if n > most:
        raise argparse.ArgumentTypeError(f"{flag} must be at most {most:,}, got {n:,}: {why}")
    return n


def bench_runs_arg(text: str):
    return _count_or_auto(text, "--bench_runs", 1, MAX_BENCH_RUNS,
                          f"each timed run's per-stage times are kept in memory and written to trace.json "
                          f"(--bench_runs auto stops by {AUTO_MAX_RUNS:,})")


def warmup_arg(text: str):
    return _count_or_auto(text, "--warmup", 0, MAX_WARMUP,
                          f"warm-up runs are discarded, more only add time (--warmup auto stops by "
                          f"{WARMUP_MAX_RUNS:,})")


def list_kernels() -> str:
    lines = []
    for kernel, versions in sorted(kernels().items()):
        default = default_version(kernel, versions)
        why = f": {DEFAULTS[kernel][1]}" if kernel in DEFAULTS and DEFAULTS[kernel][0] == default else \
            " (the latest)"
        lines.append(f"{kernel}  (default version {default}{why})")
        for v, cls in sorted(versions.items()):
            lines.append(f"  {v}: {cls.summary}")
        cls = versions[default]
        lines.append("  parameters:")
        for p in cls.params_spec:
            choices = f" {{{','.join(p.choices)}}}" if p.choices else ""
            lines.append(f"    --{p.name}{choices} (default {p.default}): {p.help}")
        lines.append("  stages: " + " -> ".join(f"{s.name}[{s.category}]" for s in cls.stages))
    return "\n".join(lines)


def parse(argv: list[str]):
    if not argv or argv[0] in ("-h", "--help"):
        return None
    kernel, rest = argv[0], argv[1:]
    version = None
    if rest and not rest[0].startswith("-"):
        version, rest = rest[0], rest[1:]
    cls = get_plan_class(kernel, version)
    parser = OneLineParser(help_command="python -m app.kernel", prog=f"python -m app.kernel {kernel}",
                           allow_abbrev=False)
    _common(parser)
    for p in cls.params_spec:
        # Checked by the plan (Param.parse), not argparse: show the choices and the default, parse nothing here.
        metavar = "{" + ",".join(map(str, p.choices)) + "}" if p.choices else ("N" if p.type is int else "VALUE")
        parser.add_argument(f"--{p.name}", dest=f"param_{p.name}", default=None, metavar=metavar,
                            help=f"{p.help} (default {p.default})")
    args = parser.parse_args(rest)
    given = {k[len("param_"):]: v for k, v in vars(args).items() if k.startswith("param_") and v is not None}
    for flag in ("ncu_timeout", "nsys_timeout"):
        if not (math.isfinite(getattr(args, flag)) and getattr(args, flag) > 0):
            raise BadParameter(f"--{flag.replace('_', '-')} must be a finite number of seconds > 0")
    return cls(given), args


def _baseline(args, plan) -> dict | None:
    """Read and check --baseline before any profiling starts (against the device this run will use)."""
    if not args.baseline:
        return None
    wanted = args.device if args.prof_type == "event" or args.device != "auto" else "gpu"
    try:
        device_name = devmod.select(wanted).device_name
    except DeviceUnavailable:
        device_name = None          # the mode itself says why it cannot run
    path = args.baseline
    if path == "latest":
        path = latest_profile(profile_parent(args.out, args.prof_type, plan.kernel, plan.slug()), device_name)
        print(f"baseline: {path}", file=sys.stderr)
    return load_baseline(path, plan, device_name, args.force)


def _devlog_command(argv: list[str]) -> int:
    from app.report.devlog import append_devlog

    p = OneLineParser(help_command="python -m app.kernel", prog="python -m app.kernel devlog", allow_abbrev=False,
                description="Append a profile's Performance block (duration, rates, occupancy, bottleneck, issues, "
                            "insights, each with its change against the previous entry) to a devlog; the same "
                            "profile is never added twice.")
    p.add_argument("profile", metavar="PROFILE", help="a profile folder (or its trace.json)")
    p.add_argument("--file", metavar="F", help="the devlog (default: docs/kernels/<kernel>.md under the current folder)")
    args = p.parse_args(argv)
    path, added = append_devlog(args.profile, args.file)
    print(f"devlog: {'appended to' if added else 'already in'} {path}")
    return 0


def _devices_command(argv: list[str]) -> int:
    from app.analysis.devices import describe, devices_path

    p = OneLineParser(help_command="python -m app.kernel", prog="python -m app.kernel devices", allow_abbrev=False,
                      description="The peak specs of conf/devices.json (the roofline's source), the GPU here marked.")
    p.add_argument("--json", action="store_true", help="print the table as JSON")
    args = p.parse_args(argv)
    usable, _, info = devmod.probe_gpu()
    rows, line = describe(info.get("name") if usable else None)
    from app.analysis.calibration import load

    cal, why = load(info.get("uuid") if usable else None)
    for r in rows:
        if r["present"] and cal:
            r["calibrated"] = {k: cal[k] for k in ("uuid", "measured_at", "memory_gbps", "fp64_tflops", "fp32_tflops")}
    if usable:
        line += (f" Calibrated peaks of this GPU ({cal['measured_at']}) are used by its rooflines." if cal else
                 f" No calibration of this GPU{f' ({why})' if why else ''}: rooflines use the datasheet peaks; "
                 "`python -m app.kernel calibrate` measures them.")
    if args.json:
        print(json.dumps({"file": str(devices_path()), "present": info.get("name") if usable else None,
                          "note": line, "devices": rows}, indent=2))
        return 0
    print(f"{devices_path()}\n")
    print(f"  {'model':<22} {'fp64 TFLOP/s':>12} {'fp32 TFLOP/s':>12} {'GB/s':>8} {'SMs':>5} {'L2 MiB':>7} "
          f"{'boost MHz':>9}  peaks")
    for r in rows:
        cells = [r["fp64_tflops"], r["fp32_tflops"], r["memory_gbps"], r["sm_count"], r["l2_mib"], r["boost_clock_mhz"]]
        # every digit devices.json holds (1.431 TFLOP/s fp64 is not "1.4"), thousands grouped
        fmt = [f"{c:,.10g}" if isinstance(c, float) else (str(c) if c is not None else "missing") for c in cells]
        print(f"{'*' if r['present'] else ' '} {r['model']:<22} {fmt[0]:>12} {fmt[1]:>12} {fmt[2]:>8} {fmt[3]:>5} "
              f"{fmt[4]:>7} {fmt[5]:>9}  {r['peaks']}")
        if r.get("calibrated"):
            c = r["calibrated"]
            print(f"  {'  calibrated here':<22} {c['fp64_tflops']:>12,.1f} {c['fp32_tflops']:>12,.1f} "
                  f"{c['memory_gbps']:>8,.1f} {'':>5} {'':>7} {'':>9}  measured {c['measured_at']}")
    print(f"\n{line}")
    return 0


def _tuned(plan, args):
    """The plan with its tiling from --tiling, the autotune cache or a search (see runtime/autotune.py)."""
    from app.runtime import autotune

    wants = args.autotune or args.retune or bool(args.tiling)
    if not wants and not autotune.cache_root().is_dir():
        return plan                             # nothing cached, nothing asked: the defaults
    device = args.device if args.prof_type == "event" or args.device != "auto" else "gpu"
    try:
        selection = devmod.select(device)
    except DeviceUnavailable:
        if args.autotune or args.retune:
            raise
        selection = devmod.select("cpu")
    return autotune.resolve(plan, selection, autotune=args.autotune, retune=args.retune, overrides=args.tiling,
                            progress=_search_progress(plan))


def _search_progress(plan):
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    state = {}

    def update(i, n, what):
        if tqdm is not None:
            bar = state.setdefault("bar", tqdm(total=n, desc=f"autotune {plan.kernel} {plan.version}",
                                               unit="config", file=sys.stderr))
            bar.set_postfix_str(what)
            bar.update(1)
            if i == n:
                bar.close()
        else:
            print(f"[autotune {plan.kernel} {plan.version}] {i}/{n}: {what}", file=sys.stderr, flush=True)

    return update


class _HungUp(Terminated):
    """SIGHUP (the terminal or SSH session closed): cleaned up as SIGTERM is; exit 129."""


def _terminate(signum, frame):
    raise _HungUp() if signum == signal.SIGHUP else Terminated()


def _ignore_signals_until_exit() -> None:
    """The run is over and reported; this process only exits now. Its interpreter's teardown takes a tenth of a
    second or more with every handler back at the default, where a SIGINT or SIGTERM would kill it with no word
    (exit -2 or -15, the complete profile looking lost): from here on both are ignored and the process ends with
    its own exit status. A signal already pending is raised by the first call, before anything changes, and is
    reported as any other after the write."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


def main(argv: list[str] | None = None) -> int:
    """The command line. ``argv`` None: this process's own (``python -m app.kernel``), which exits when main
    returns; a caller in process (a test) passes its list and keeps its signal handlers as they were."""
    exiting = argv is None
    argv = sys.argv[1:] if argv is None else argv
    previous = signal.signal(signal.SIGTERM, _terminate)
    previous_hup = signal.getsignal(signal.SIGHUP)
    if previous_hup != signal.SIG_IGN:        # under nohup SIGHUP stays ignored, as asked
        signal.signal(signal.SIGHUP, _terminate)
    try:
        return _main(argv, exiting)
    except AppError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:                   # output piped into `head` and the like: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except KeyboardInterrupt as exc:          # Ctrl-C, or SIGTERM/SIGHUP (Terminated)
        what, code = (("hung up", 129) if isinstance(exc, _HungUp) else ("terminated", 143)
                      if isinstance(exc, Terminated) else ("interrupted", 130))
        written = getattr(exc, "profile_dir", None)
        try:                                  # after a hang-up the terminal may be gone
            print(f"{what}: " + (f"the profile was complete and is kept at {written}" if written
                                 else "no profile was written"), file=sys.stderr)
        except OSError:
            pass
        return code
    finally:
        if not (exiting and signal.getsignal(signal.SIGTERM) == signal.SIG_IGN):   # ignored until exit: stays so
            signal.signal(signal.SIGTERM, previous)
            signal.signal(signal.SIGHUP, previous_hup)


def _main(argv: list[str], exiting: bool = False) -> int:
    if argv and argv[0] == "list":
        extra = [a for a in argv[1:] if a not in ("-h", "--help")]
        if extra:       # an option meant for another command: say so rather than ignore it
            raise BadParameter(f"list takes no arguments, got {' '.join(extra)} (see python -m app.kernel --help)")
        if len(argv) > 1:       # list --help
            print("usage: python -m app.kernel list\n\nEvery kernel with its versions (and the default one), its "
                  "parameters with their defaults and choices, and its stages in order.")
            return 0
        print(list_kernels())
        return 0
    if argv and argv[0] == "timeline":
        from app.runtime.profiling.timeline_command import run_timeline

        return run_timeline(argv[1:])
    if argv and argv[0] == "compare":
        from app.report.compare_command import run_compare

        return run_compare(argv[1:])
    if argv and argv[0] == "ab":
        from app.report.ab_command import run_ab

        return run_ab(argv[1:])
    if argv and argv[0] == "devlog":
        return _devlog_command(argv[1:])
    if argv and argv[0] == "devices":
        return _devices_command(argv[1:])
    if argv and argv[0] == "sweep":
        from app.sweep.command import run_sweep

        return run_sweep(argv[1:])
    if argv and argv[0] == "calibrate":
        from app.runtime.calibrate import run_calibrate

        return run_calibrate(argv[1:])
    parsed = parse(argv)
    if parsed is None:
        print(f"usage: {USAGE}\n\n{list_kernels()}\n\ncommon options: --prof_type --device --bench_runs "
              "--warmup --nvtx --out --json --baseline --no-verify (python -m app.kernel <kernel> --help: all)\n"
              "other commands: list, devices, calibrate, compare, ab, devlog, timeline, sweep (each with --help)")
        return 0
    plan, args = parsed
    if args.worker:
        import signal

        from app.runtime.profiling.tools import set_parent_death_signal
        from app.runtime.profiling.worker import run_worker

        # The tool (ncu, nsys) running this worker dies with the profile (run_tool's parent-death signal), but that
        # is not inherited: without its own, a worker would keep the GPU busy after a killed profile released the
        # device lock.
        set_parent_death_signal(signal.SIGKILL)
        if args.worker_tiling:           # the parent's tiling (cache, search or --tiling), exactly
            plan = type(plan)(plan.params, json.loads(args.worker_tiling))
        return run_worker(plan, args.device, args.warmup, args.worker, args.worker_iterations, args.worker_collect,
                          args.verify, args.worker_pace)
    mode = get_mode(args.prof_type)
    plan = _tuned(plan, args)
    parent = profile_parent(args.out, mode.name, plan.kernel, plan.slug())
    check_writable(parent)
    if args.devlog is not None:
        from app.report.devlog import check_devlog

        check_devlog(plan.kernel, args.devlog or None)
    options = ProfileOptions(device=args.device, bench_runs=args.bench_runs, warmup=args.warmup,
                             nvtx=args.nvtx, verify=args.verify, baseline=_baseline(args, plan),
                             argv=["python -m app.kernel", *argv], ncu=args.ncu, ncu_timeout=args.ncu_timeout,
                             clock_control=args.ncu_clock_control, nsys=args.nsys,
                             nsys_timeout=args.nsys_timeout, backend=args.backend, l2=args.l2, graph=args.graph,
                             overhead=args.overhead)
    profile = mode.profile(plan, options)
    out_dir = write_profile(parent, profile.files)
    try:
        code = _report_written(profile, out_dir, args)
        if exiting:
            _ignore_signals_until_exit()
        return code
    except KeyboardInterrupt as exc:    # the profile is on disk: never claim otherwise
        exc.profile_dir = out_dir
        raise


# The exit status of a profile whose oracle could not run: neither a pass (0) nor a wrong output (9,
# VerificationFailed).
VERIFICATION_COULD_NOT_RUN = VerificationCouldNotRun.exit_code


def _report_written(profile, out_dir, args) -> int:
    from app.analysis.baseline import verification_of, verification_state, what_differs
    from app.report.sections import with_verification_summary

    where = sys.stderr if args.json else sys.stdout
    v = verification_of(profile.trace)
    state = verification_state(v)
    # A mode's own verdict of a wrong output stands even where its trace holds no failed check: never a pass.
    differs = what_differs(v) if state == "mismatch" else "the profile's mode reported it wrong"
    if not profile.ok and state in ("ok", "skipped"):
        state, v = "mismatch", {"oracle": (v or {}).get("oracle", "the reference")}
    # Every mode's summary ends with the check's line and, where the output is wrong or unverified, opens with it.
    print(with_verification_summary(profile.trace, profile.summary), file=where)
    print(f"profile: {out_dir}", file=where)
    if args.devlog is not None:
        from app.report.devlog import append_devlog, devlog_path

        if state in ("mismatch", "error"):       # a wrong or unverified answer's timings are no entry
            why = "did not match the reference" if state == "mismatch" else "could not be verified"
            print(f"devlog: nothing appended to {devlog_path(profile.trace['kernel'], args.devlog or None)}: the "
                  f"profile's output {why}", file=where)
        else:
            path, added = append_devlog(str(out_dir), args.devlog or None)
            print(f"devlog: {'appended to' if added else 'already in'} {path}", file=where)
    if args.json:
        print(json.dumps(profile.trace, indent=2, default=str))
    if state == "error":
        print(f"error: verification could not run ({v['error']}); the profile is kept at {out_dir} with its output "
              "unverified: install or fix the oracle and profile again, or pass --no-verify to time without a "
              "check", file=sys.stderr)
        return VERIFICATION_COULD_NOT_RUN
    if state == "mismatch":
        print(f"error: output does not match {v.get('oracle')}: {differs}; the profile is kept at {out_dir} "
              "for inspection", file=sys.stderr)
        return 9
    return 0
