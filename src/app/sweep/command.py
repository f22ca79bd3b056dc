"""``python -m app.kernel sweep``: parse, start the cluster, run the points, write the table and report.

The sweep folder fills as points finish (each point's profile, then results.csv), so an
interrupted or crashed sweep keeps every finished point and ``--resume`` runs the rest.
"""
from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path

from app.errors import BadParameter, OneLineParser, Terminated
from app.kernel.cli import bench_runs_arg, warmup_arg
from app.kernel.plan import get_plan_class
from app.report.writer import check_writable, claim_folder
from app.runtime import device as devmod
from app.runtime.cache import write_atomic
from app.runtime.stats import MIN_CI_SAMPLES
from app.runtime.timing import L2_MODES
from app.sweep import engine
from app.sweep.results import DONE, read_rows, read_runs, to_frame, write_results, write_runs
from app.sweep.spec import SPEC_FILE, SweepSpec, check_points, load_spec, parse_grid, parse_versions

USAGE = ("python -m app.kernel sweep KERNEL [VERSIONS] --grid NAME=V1,V2,... [--grid ...] [--cluster "
         "local|local-cuda|tcp://HOST:PORT] [--workers N] [options]")


def _parser(kernel: str | None) -> OneLineParser:
    p = OneLineParser(help_command="python -m app.kernel sweep", prog="python -m app.kernel sweep",
                      usage=USAGE, allow_abbrev=False,
                      description="Profile a grid of parameter values for one or more versions, side by side on "
                                  "Dask workers, then fit how time grows with each axis and find where versions "
                                  "cross. Writes OUT/sweeps/<kernel>/<axes>/<time>/: results.csv, report.md, "
                                  "scaling.png, speedup.png, and each point's profile under points/.")
    add = p.add_argument
    add("--grid", action="append", metavar="NAME=V1,V2,...", help="a kernel parameter and its values, e.g. "
        "points=10k,100k,1M (k, M, G by 1000); repeat for more axes: every combination is a point; "
        "left,right=1k,10k sets both parameters to each value")
    add("--cluster", default="local", metavar="{local,local-cuda,tcp://HOST:PORT}",
        help="local (default): Dask worker processes here (--workers 1: one point after another, no Dask); "
             "local-cuda: one worker pinned to each visible GPU (dask-cuda); an address: an existing Dask "
             "scheduler and its workers, here or on a cluster")
    add("--workers", type=_positive, metavar="N", help="local: worker processes (default 2); local-cuda: GPUs "
        "to use (default all visible)")
    add("--prof_type", "--prof-type", default="event", metavar="{event,annotation,ncu,nsys}",
        help="the mode of every point (default event)")
    add("--device", default="auto", choices=devmod.DEVICES, help="every point's --device (default auto)")
    add("--bench_runs", "--bench-runs", type=bench_runs_arg, default=None, metavar="{N,auto}",
        help="every point's timed runs")
    add("--warmup", type=warmup_arg, default="auto", metavar="{N,auto}",
        help="every point's discarded runs after the cold run: N, or auto (default): until its time stops changing")
    add("--l2", choices=L2_MODES, default="flush", help="event mode's L2 policy between timed runs (default flush)")
    add("--point-timeout", type=float, default=1800.0, metavar="SECONDS",
        help="a point still running after this is stopped and counts as failed (default 1800)")
    add("--out", default="out", metavar="DIR", help="output root (default out/)")
    add("--resume", metavar="SWEEP_DIR", help="a sweep folder to finish: its points already done are skipped; the "
        "rest run with the kernel, grid and profiling options the sweep was started with (its sweep.json); "
        "other ones given here are refused")
    if kernel is not None:
        for param in get_plan_class(kernel).params_spec:
            metavar = "{" + ",".join(map(str, param.choices)) + "}" if param.choices else param.type.__name__.upper()
            add(f"--{param.name}", dest=f"param_{param.name}", metavar=metavar,
                help=f"fixed at every point: {param.help}")
    return p


# Local worker processes are started on this machine: thousands would exhaust it before a point ran.
MAX_WORKERS = 256


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise BadParameter(f"--workers expects a whole number >= 1, got {text!r}")
    if n > MAX_WORKERS:
        raise BadParameter(f"--workers {n:,}: at most {MAX_WORKERS:,} (each local worker is a process of its own; "
                           "for more, start a Dask scheduler and its workers and pass --cluster tcp://HOST:PORT)")
    return n


def _split(argv: list[str]):
    kernel = versions = None
    rest = list(argv)
    if rest and not rest[0].startswith("-"):
        kernel, rest = rest[0], rest[1:]
        if rest and not rest[0].startswith("-"):
            versions, rest = rest[0], rest[1:]
    return kernel, versions, rest


def _spec(kernel, versions_text, args) -> SweepSpec:
    versions = parse_versions(kernel, versions_text)
    fixed = {k[len("param_"):]: v for k, v in vars(args).items() if k.startswith("param_") and v is not None}
    axes = parse_grid(kernel, versions, args.grid)
    clash = sorted(set(fixed) & {n for axis in axes for n in axis.split(",")})
    if clash:
        raise BadParameter(f"--{clash[0]} is both fixed and a --grid axis; give it once")
    if args.prof_type not in ("event", "annotation", "ncu", "nsys"):
        raise BadParameter(f"unknown --prof_type {args.prof_type!r}; use event, annotation, ncu or nsys")
    if args.prof_type in ("annotation", "ncu") and args.bench_runs not in (None, 1):
        raise BadParameter(f"--bench_runs {args.bench_runs}: {args.prof_type} mode profiles one warm iteration; "
                           "drop it")
    if args.bench_runs == "auto" and args.prof_type != "event":
        raise BadParameter("--bench_runs auto is event mode's; give a number of runs")
    if args.prof_type != "event" and args.l2 != "flush":
        raise BadParameter(f"--l2 {args.l2}: only event mode has an L2 policy between runs")
    plan_cls = get_plan_class(kernel, versions[0])
    fixed = {p.name: p.parse(fixed[p.name]) for p in plan_cls.params_spec if p.name in fixed}
    spec = SweepSpec(kernel, versions, axes, fixed, args.prof_type, args.device, args.bench_runs, args.warmup, args.l2)
    check_points(spec, local=args.cluster in engine.CLUSTERS)
    return spec


# The options that make a sweep's data what it is: a --resume takes them from sweep.json, never from its own line.
_SPEC_OPTIONS = ("prof_type", "device", "bench_runs", "warmup", "l2")


def _resume_changes(parser, args, versions_text, spec: SweepSpec) -> list[str]:
    """The options of a --resume's line that differ from the sweep's own (as `--name value`): finishing a sweep with
    other options would mix two kinds of data in one table and report. An option left at its default is not
    "given": the sweep's own value is used."""
    changed = []
    if versions_text is not None and parse_versions(spec.kernel, versions_text) != spec.versions:
        changed.append(f"the version list {versions_text}")
    for name in _SPEC_OPTIONS:
        value = getattr(args, name)
        if value != parser.get_default(name) and value != getattr(spec, name):
            changed.append(f"--{name} {value}")
    params = {p.name: p for p in get_plan_class(spec.kernel, spec.versions[0]).params_spec}
    for key, value in vars(args).items():
        name = key[len("param_"):]
        if key.startswith("param_") and value is not None and name in params:
            if params[name].parse(value) != spec.fixed.get(name, params[name].default):
                changed.append(f"--{name} {value}")
    return changed


def _spec_options(spec: SweepSpec, parser) -> str:
    given = [f"--{n} {getattr(spec, n)}" for n in _SPEC_OPTIONS if getattr(spec, n) != parser.get_default(n)]
    given += [f"--{n} {v}" for n, v in spec.fixed.items()]
    return " ".join(given) or "the default options"


def _plan(parser, args, kernel, versions_text):
    """(spec, the folder of a --resume or None, rows already there) -- nothing is created yet."""
    if args.resume:
        folder = Path(args.resume)
        spec = load_spec(folder)
        if kernel is not None and kernel != spec.kernel:
            raise BadParameter(f"--resume {folder} is a sweep of {spec.kernel}, not {kernel}")
        if args.grid and parse_grid(spec.kernel, spec.versions, args.grid) != spec.axes:
            raise BadParameter(f"--resume {folder} was started with another grid; drop --grid to finish it, or start "
                               "a new sweep")
        changed = _resume_changes(parser, args, versions_text, spec)
        if changed:
            raise BadParameter(f"--resume {folder} was started with {_spec_options(spec, parser)}: drop "
                               f"{', '.join(changed)} to finish it with those, or start a new sweep")
        check_points(spec, local=args.cluster in engine.CLUSTERS)
        return spec, folder, read_rows(folder)
    if kernel is None:
        raise BadParameter(f"name a kernel (python -m app.kernel list), or --resume SWEEP_DIR; usage: {USAGE}")
    spec = _spec(kernel, versions_text, args)
    check_writable(Path(args.out) / "sweeps" / spec.kernel / spec.name)
    return spec, None, []


def _new_folder(spec, out: str) -> Path:
    parent = Path(out) / "sweeps" / spec.kernel / spec.name
    parent.mkdir(parents=True, exist_ok=True)
    folder = claim_folder(parent, time.strftime("%Y%m%d-%H%M%S", time.gmtime()))
    (folder / SPEC_FILE).write_text(spec.to_json() + "\n")
    return folder


def run_sweep(argv: list[str]) -> int:
    kernel, versions_text, rest = _split(argv)
    if kernel in ("-h", "--help") or (not argv):
        _parser(None).print_help()
        return 0
    parser = _parser(kernel)
    args = parser.parse_args(rest)
    if args.cluster not in engine.CLUSTERS and ":" not in args.cluster:
        raise BadParameter(f"--cluster {args.cluster!r}: use local, local-cuda or a scheduler address "
                           "(tcp://HOST:PORT)")
    if not (args.point_timeout > 0 and args.point_timeout < float("inf")):
        raise BadParameter("--point-timeout must be a finite number of seconds > 0")
    spec, folder, rows = _plan(parser, args, kernel, versions_text)
    runs = read_runs(folder) if folder is not None else []
    if rows and not runs:                       # points from a run that kept no runs.json: said, not left out
        runs = [{"runner": None}]
    done = {r["point"] for r in rows if r.get("status") in DONE}
    todo = [p for p in spec.points() if p["id"] not in done]
    if todo and len(spec.versions) > 1 and isinstance(spec.bench_runs, int) and spec.bench_runs < MIN_CI_SAMPLES:
        print(f"sweep: warning: --bench_runs {spec.bench_runs} gives no point a 95% interval (it takes "
              f"{MIN_CI_SAMPLES} runs): which version is faster will be unresolved, possibly noise", file=sys.stderr)
    run = {"command": "python -m app.kernel sweep " + shlex.join(argv), "runner": "-", "wall_seconds": 0.0}
    t0 = time.perf_counter()
    runner = None
    try:
        # The cluster first: a scheduler that cannot be reached leaves no empty sweep folder behind.
        runner = engine.open_runner(args.cluster, args.workers) if todo else None
        run["start_seconds"] = time.perf_counter() - t0
        folder = folder or _new_folder(spec, args.out)
        print(f"sweep: {folder} -- {len(todo)} of {len(spec.points())} points to run"
              + (f" ({len(done)} done before)" if done else ""), file=sys.stderr)
        if runner is not None:
            run["runner"] = runner.description
            print(f"sweep: running on {runner.description}", file=sys.stderr)
            engine.run_points(spec, folder, todo, runner, rows, args.point_timeout, _progress(len(todo)))
        run["points_seconds"] = time.perf_counter() - t0 - run["start_seconds"]
    except KeyboardInterrupt as exc:
        if runner is not None:
            runner.close()
        if folder is None:
            print("interrupted: no point had run; nothing was written", file=sys.stderr)
            return 143 if isinstance(exc, Terminated) else 130
        run["wall_seconds"] = time.perf_counter() - t0
        run["interrupted"] = True
        _write_report(spec, folder, rows, _with_run(runs, run, todo))
        what = "terminated" if isinstance(exc, Terminated) else "interrupted"
        print(f"{what}: {sum(r['status'] in DONE for r in rows)} finished points are kept in {folder}; "
              f"`python -m app.kernel sweep --resume {folder}` runs the rest", file=sys.stderr)
        return 143 if isinstance(exc, Terminated) else 130
    except BaseException:
        if runner is not None:
            runner.close()
        raise
    if runner is not None:
        runner.close()
    run["wall_seconds"] = time.perf_counter() - t0
    run["close_seconds"] = run["wall_seconds"] - run["start_seconds"] - run.get("points_seconds", 0.0)
    _write_report(spec, folder, rows, _with_run(runs, run, todo))
    bad = [r for r in rows if r["status"] != "ok"]
    print(f"sweep: {len(rows)} point{'s' if len(rows) != 1 else ''}, {len(rows) - len(bad)} ok, {len(bad)} not ok "
          f"(failed, wrong or unverified), {run['wall_seconds']:,.1f} s\nreport: {folder / 'report.md'}")
    for r in bad:
        print(f"  {r['point']}: {r['status']}: {r.get('error', '')}")
    return 1 if bad else 0


def _with_run(runs: list[dict], run: dict, todo: list) -> list[dict]:
    """The sweep's runs with this one added where it ran points: a --resume with nothing left to run changes no
    number, and the report keeps describing the runs that made them."""
    return runs + [run] if todo else runs


def _write_report(spec, folder: Path, rows: list[dict], runs: list[dict]) -> None:
    from app.sweep.report import sweep_files

    if rows:
        write_results(folder, rows, list(spec.axes))
    write_runs(folder, runs)
    stages = [s.name for s in get_plan_class(spec.kernel, spec.versions[-1]).stages]
    for v in spec.versions[:-1]:
        stages += [s.name for s in get_plan_class(spec.kernel, v).stages if s.name not in stages]
    for name, content in sweep_files(spec, to_frame(rows, list(spec.axes)), stages, runs).items():
        write_atomic(folder / name, content if isinstance(content, bytes) else content.encode())


def _progress(total: int):
    """A live count of done, running and failed points with an ETA (tqdm if installed, else lines)."""
    try:
        from tqdm import tqdm
    except ImportError:
        tqdm = None
    state = {"shown": -1, "t0": time.monotonic()}

    def update(done: int, running: int, failed: int):
        if tqdm is not None:
            if "bar" not in state:
                state["bar"] = tqdm(total=total, desc="sweep", unit="point", file=sys.stderr)
            bar = state["bar"]
            bar.update(done - bar.n)
            bar.set_postfix_str(f"running {running}, failed {failed}", refresh=True)
            if done == total:
                bar.close()
            return
        if done != state["shown"]:
            state["shown"] = done
            elapsed = time.monotonic() - state["t0"]
            eta = f", ETA {elapsed / done * (total - done):,.0f} s" if done else ""
            print(f"[sweep] {done}/{total} done, {running} running, {failed} failed{eta}", file=sys.stderr,
                  flush=True)

    return update
