"""ncu mode: ``--set full`` (with source) on one warm iteration of the stage kernels.

Keeps the .ncu-rep; exports its details, raw and source pages; writes report.md
(the compact diagnosis, the hottest source lines, NCU's own rule results ranked by
estimated speedup, the pictures), report-verbose.md (every section of every kernel),
sass/<kernel>.csv (every instruction), hot/<kernel>.md (CUDA source lines by
warp-stall samples, with stall reasons and the SASS under each line) and the PTX of
each stage's kernels under compiled/.
"""
from __future__ import annotations

import math
import os
import re

from app.analysis.kernel_metrics import (attribute_stages, flop_rates, kernel_table, kernel_time, kernel_time_text,
                                        opportunities, rank, reading, stage_table, stages_with_gpu_work)
from app.errors import MalformedToolOutput
from app.report.markdown import Section, fmt, render
from app.report.ncu_report import GAIN_NOTE, RULE_NOTE, render_report, stage_sections
from app.runtime.profiling import counters
from app.runtime.profiling.base import Mode, Profile, ProfileOptions, register_mode
from app.runtime.profiling.ncu_session import explain_unknown_option, run_under_ncu
from app.runtime.profiling.parsers.columns import ANNOTATION_METRICS
from app.runtime.profiling.parsers.ncu_csv import parse_details, parse_raw, parse_source
from app.runtime.profiling.parsers.ncu_rep import line_table, load_module, read_samples, render_hot_lines, short_path
from app.runtime.profiling.tools import run_tool

STALL = "Warp Stall Sampling (All Samples)"


@register_mode
class NcuMode(Mode):
    name = "ncu"

    def profile(self, plan, options: ProfileOptions) -> Profile:
        counters.check_options(options, self.name)
        rep_base = "profile"
        # The full set plus annotation mode's own metrics: both modes then read every figure of the
        # stage table from the same ncu metrics, so they cannot disagree by construction.
        with run_under_ncu(plan, options, ["--set", "full", "--metrics", ",".join(ANNOTATION_METRICS),
                                           "--import-source", "yes", "-f", "-o", "{tmp}/" + rep_base],
                           "ncu full") as run:
            rep = os.path.join(run.tmpdir, rep_base + ".ncu-rep")
            label = "ncu export"
            exports = {}
            for page, extra in (("raw", ["--print-units", "base"]), ("details", ["--print-units", "base"]),
                                ("source", ["--print-source", "sass"])):
                with explain_unknown_option(run.ncu_version):
                    exports[page], _ = run_tool([run.ncu, "--import", rep, "--csv", "--page", page, *extra],
                                                timeout=options.ncu_timeout, label=label)
            def exported(name: str) -> str:        # how a refusal names the page
                return f"the {name} page exported from {rep_base}.ncu-rep (ncu --import --csv --page {name})"

            raw, units = parse_raw(exports["raw"], run.ncu_version, source=exported("raw"))
            metrics, rules = parse_details(exports["details"], run.ncu_version, source=exported("details"))
            sources = parse_source(exports["source"], source=exported("source"), kernels=len(raw))
            check_exports_agree(raw, metrics, sources, f"{rep_base}.ncu-rep")
            names = [s.name for s in plan.stages]
            device_name = run.worker["selection"]["device_name"]
            spec = counters.device_spec(run)
            kernels = kernel_table(raw, plan.kernel, names, device_name, spec, units=units,
                                   model_bytes=counters.model_dram_bytes(run))
            stages = stage_table(kernels, names, stages_with_gpu_work(run.worker))
            trace = counters.measured_trace(plan, run, kernels, stages, self.name)
            files = counters.common_files(plan, run, trace, options, self.name)
            rules = rules.assign(stage=attribute_stages(rules, plan.kernel, names)) if len(rules) else rules
            headline = counters.headline_prefix(trace) + (
                f"`ncu --set full` on one warm iteration on {device_name}: "
                f"{kernel_time_text(stages)}; {len(rules)} rule results.")
            rules = _flag_speedups(rules)
            rule_ops = _rule_ops(rules, raw, kernels)
            ops = rule_ops or opportunities(stages, kernel_time(stages))
            trace["summary"] = flop_rates(counters.summary(stages, kernels, ops), kernels)
            # The hot spots first: a stage bound by barrier waits is named with the line its kernel waits at.
            hot_files, hot_section, barrier_lines = hot_spots(rep, run.ncu, kernels, sources)
            files |= hot_files
            kernels = with_barrier_lines(kernels, barrier_lines)
            sections = stage_sections(trace, stages, kernels, ops,
                                      spec, f"ncu {run.ncu_version or '(version unread)'} --clock-control "
                                            f"{options.clock_control}",
                                      RULE_NOTE if rule_ops else GAIN_NOTE)
            pictures, picture_sections = counters.pictures(kernels, spec, device_name, plan)
            files |= pictures
            sections += [hot_section, _rules_section(rules, raw)] + picture_sections \
                + counters.evidence_sections(trace, files["params.json"])
            files["report.md"] = render_report(trace, sections, headline)
            files["report-verbose.md"] = _verbose(plan, metrics, rules)
            with open(rep, "rb") as f:
                files["profile.ncu-rep"] = f.read()
            files["ncu_raw.csv"] = raw.drop(columns=["nvtx_stack"]).to_csv(index=False)
            files["ncu_details.csv"] = metrics.drop(columns=["nvtx_stack"], errors="ignore").to_csv(index=False)
            files["ncu_rules.csv"] = rules.drop(columns=["nvtx_stack"], errors="ignore").to_csv(index=False)
            files["kernels.csv"] = kernels.to_csv(index=False)
            summary = f"{plan.kernel} {plan.version} under ncu --set full on {device_name}: {len(kernels)} kernels, " \
                      f"{len(rules)} rule results; see report.md"
            return Profile(trace=trace, files=files, summary=summary, ok=counters.verification_ok(trace))


def check_exports_agree(raw, metrics, sources: dict, rep: str) -> None:
    """The raw, details and source pages are exports of one report: each holds every kernel of it. One that
    holds fewer was cut off (at a row boundary, where no single page shows it): refused, not reported short."""
    ids = set(raw["id"].map(lambda v: int(float(v))))
    detail_ids = set(metrics["id"].map(lambda v: int(float(v)))) if len(metrics) else set()
    if detail_ids != ids:
        raise MalformedToolOutput(f"the exports of {rep} disagree: the raw page holds {len(ids)} kernels, the details "
                                  f"page {len(detail_ids)} ({len(ids ^ detail_ids)} differ): an export was cut off; "
                                  "re-run the profile")
    if len(sources) != len(raw):
        raise MalformedToolOutput(f"the exports of {rep} disagree: the raw page holds {len(raw)} kernels, the source "
                                  f"page {len(sources)}: an export was cut off; re-run the profile")
    named = [re.sub(r" #\d+$", "", k) for k in sources]
    wrong = next((i for i, (a, b) in enumerate(zip(raw["kernel"], named)) if a != b), None)
    if wrong is not None:
        raise MalformedToolOutput(f"the exports of {rep} disagree: kernel {wrong} is {raw['kernel'].iat[wrong]!r} on "
                                  f"the raw page and {named[wrong]!r} on the source page; re-run the profile")


def _slug(i: int, kname: str) -> str:
    return f"{i:03d}_{re.sub(r'[^A-Za-z0-9_]+', '_', kname)[:60]}"


def with_barrier_lines(kernels, barrier_lines: dict):
    """The kernel table with, per kernel, the source line holding most of its barrier samples (``barrier_line``) and
    the share of all its warp samples that are barrier waits on that line (``barrier_line_pct``); None and NaN where
    unknown."""
    kernels = kernels.copy()
    kernels["barrier_line"] = [barrier_lines.get(i, (None, float("nan")))[0] for i in range(len(kernels))]
    kernels["barrier_line_pct"] = [barrier_lines.get(i, (None, float("nan")))[1] for i in range(len(kernels))]
    return kernels


def hot_spots(rep: str, ncu: str, kernels, sources: dict) -> tuple[dict, Section, dict]:
    """Per kernel: sass/<kernel>.csv (every instruction, from the CSV export) and hot/<kernel>.md -- the
    CUDA source lines by warp-stall samples with their top stall reasons and SASS, read from the .ncu-rep
    with NVIDIA's ncu_report. Without that module, the SASS-only listing, and the report says why. The third item:
    {kernel's position: (the source line holding most of its barrier samples, those samples' % of all its samples)}."""
    files = {}
    for i, (kname, sass) in enumerate(sources.items()):
        files[f"sass/{_slug(i, kname)}.csv"] = sass.to_csv(index=False)
    module, where = load_module(ncu)
    if module is None:
        for i, (kname, sass) in enumerate(sources.items()):
            files[f"hot/{_slug(i, kname)}.md"] = _hot_listing(kname, sass)
        return files, Section("Hot spots", text=f"Source lines unavailable: {where}. SASS-only listings by "
                                                "warp-stall samples are in hot/."), {}
    try:
        samples = read_samples(module, rep)
    except Exception as exc:     # a reader older than the report, or a damaged file: say so, keep the rest
        return files, Section("Hot spots", text=f"Source lines unavailable: ncu_report ({where}) could not read "
                                                f"the report ({type(exc).__name__}: {exc})."), {}
    if not samples:          # ncu exported kernels from this report: a reader that finds none cannot read it
        return files, Section("Hot spots", text=f"Source lines unavailable: ncu_report ({where}) read no kernel "
                                                "from the report."), {}
    if len(samples) != len(kernels):
        # The CSV pages lost kernels the report holds (or the report is not the one exported): every table
        # would be short of them, so nothing is reported.
        raise MalformedToolOutput(f"ncu_report ({where}) read {len(samples)} kernels from {os.path.basename(rep)}, "
                                  f"its CSV export has {len(kernels)}: an export was cut off or the report is "
                                  "damaged; re-run the profile")
    rows, barrier_lines = [], {}
    for kid, data in samples.items():
        stage = kernels["stage"].iloc[kid]
        stage = stage if isinstance(stage, str) else None
        name = f"hot/{_slug(kid, data['kernel'])}.md"
        files[name] = render_hot_lines(data["kernel"], stage, data)
        lines = line_table(data["samples"])
        if len(lines):
            top = lines.iloc[0]
            # "selected" is a warp that was issuing: no stall reason, so not among the stall reasons listed.
            stalls = [k for k, _ in top["reasons"] if k != "selected"][:2]
            rows.append((kernels["duration_us"].iloc[kid], [stage or "-", data["kernel"][:30], fmt(
                kernels["duration_us"].iloc[kid]), _line_name(top), f"{top['share_pct']:.0f}%",
                ", ".join(stalls) or "-", f"[{name}]({name})"]))
        if len(lines) and "stall_barrier" in lines and lines["stall_barrier"].max() > 0:
            at = lines.loc[lines["stall_barrier"].idxmax()]
            barrier_lines[kid] = (_line_name(at), float(100 * at["stall_barrier"] / lines["samples"].sum()))
    rows = [r for _, r in sorted(rows, key=lambda t: (t[0] != t[0], -(t[0] if t[0] == t[0] else 0)))][:8]
    return files, Section("Hot spots (CUDA source lines, by warp-stall samples)",
                          columns=["Stage", "Kernel", "us", "Hottest line", "Share of kernel's samples",
                                   "Top stall reasons", "Listing"], rows=rows,
                          note="The kernels with the most GPU time. Each listing ranks the kernel's source lines "
                               "by warp-stall samples, with the stall reasons and the SASS under each line. "
                               "Kernels are built with -lineinfo in the counter modes; it adds a line table and "
                               "leaves the machine code unchanged. Top stall reasons leave out \"selected\", a "
                               "warp sampled while issuing."), barrier_lines


def _line_name(row) -> str:
    return f"{short_path(row['file'])}:{row['line']}" if row["line"] else "(no line info)"


def _flag_speedups(rules):
    """An estimated speedup is the share of a kernel's time a rule could save: one outside 0-100% is not a
    reading. It is kept in ``speedup_flag`` with its value, blanked, and ranks nothing."""
    if not len(rules):
        return rules
    bad = rules["speedup_pct"].map(lambda v: v == v and not 0 <= v <= 100)
    rules = rules.assign(speedup_flag=[f"Estimated Speedup={v:g}% outside 0-100%, not used" if b else ""
                                       for v, b in zip(rules["speedup_pct"], bad)])
    rules.loc[bad, "speedup_pct"] = float("nan")
    return rules


def _rule_ops(rules, raw, kernels) -> list[dict]:
    """NCU's own OPT rules with an estimated speedup, ranked by what they would save of the whole
    iteration: the rule's global speedup (a share of its kernel's time) times that kernel's share of the kernel
    time; a local speedup (of the unit the rule measures) gives no gain. The times are
    the kernel table's (a missing or flagged one is NaN); with any missing, every share is unknown and so is
    every gain (None), since the total they divide by is."""
    if not len(rules):
        return []
    opt = rules[(rules["rule_type"] == "OPT") & rules["speedup_pct"].notna()]
    dur = dict(zip(raw["id"].astype(int).astype(str), kernels["duration_us"]))
    total = float(kernels["duration_us"].sum()) if kernels["duration_us"].notna().all() else float("nan")
    ops = []
    by_id = _raw_by_id(raw)
    for r in opt.itertuples():
        kid = str(int(float(r.id)))
        share = dur.get(kid, float("nan")) / total if total > 0 else float("nan")   # of the kernel time
        gain = r.speedup_pct * share
        stage = r.stage if isinstance(r.stage, str) else "unstaged kernel"
        trigger = f"ncu {r.rule} est. {r.speedup_type} speedup={r.speedup_pct:.1f}%"
        row = by_id.get(kid)
        note = _grid_note(r.rule, row)
        if note:
            trigger += f" ({note})"
            beyond = _beyond_the_grid(row)
            if beyond is not None:
                # ncu's estimate is of the whole gap; the grid's cap is no scheduling overhead to recover.
                gain *= beyond
                trigger += f"; the gain counts the {100 * beyond:.0f}% of the gap beyond that cap"
        tail = _tail_share(row) if r.rule == "LaunchConfiguration" else None
        if tail is not None and gain > 100 * tail[0] * share:
            # ncu's tail estimate is the last partial wave's share of the runtime; with blocks of equal time what a
            # better grid recovers is the block-slot time that wave leaves empty (candidate_fill at 1.89 waves: ncu
            # said up to 50%, the empty slot-time is 5.5% of the kernel).
            gain = 100 * tail[0] * share
            trigger += f" ({tail[1]})"
        if str(r.speedup_type).strip().lower() != "global":
            # A local estimate is of the hardware unit or metric the rule looks at (93% on a kernel that cannot run in
            # a tenth of its time), not of the kernel's duration: no share of the iteration is drawn from it.
            gain, trigger = float("nan"), trigger + " (of the unit the rule measures, not the kernel's time)"
        ops.append({"name": f"{r.rule} in {stage} ({r.kernel[:30]})", "gain_pct": gain if gain == gain else None,
                    "trigger": trigger})
    return rank(ops)


def _raw_by_id(raw) -> dict:
    """{ncu's kernel id: its row of the raw page}."""
    if raw is None or "id" not in raw:
        return {}
    return {str(int(float(i))): raw.iloc[n] for n, i in enumerate(raw["id"])}


# The raw page's limits on resident blocks a multiprocessor (the least of them is the kernel's).
BLOCK_LIMITS = ("launch__occupancy_limit_blocks", "launch__occupancy_limit_registers",
                "launch__occupancy_limit_shared_mem", "launch__occupancy_limit_warps",
                "launch__occupancy_limit_barriers")


def _grid_shape(row) -> tuple[float, float, float] | None:
    """(blocks of the launch, SMs, blocks an SM holds by its tightest limit) from the raw page, or None where the row
    or a figure is missing."""
    if row is None:
        return None
    num = {c: reading(row.get(c)) for c in ("grid_blocks", "launch__sm_count") + BLOCK_LIMITS}
    shape = num["grid_blocks"], num["launch__sm_count"], min(num[c] for c in BLOCK_LIMITS)
    return shape if all(v > 0 for v in shape) else None


def _grid_cap(row) -> tuple[float, str] | None:
    """(the cap on achieved occupancy, as a fraction of the theoretical, that a grid under one wave sets; its
    sentence), or None where the grid fills a wave or the raw page lacks the figures. Every block is then resident
    at once, and a busy SM holds only its share of them: grid / min(grid, SMs) of the blocks its limits allow, which
    caps achieved occupancy (measured over busy SMs) at that fraction of the theoretical (morton_fused at 100k
    points on an H200: 391 blocks, 132 SMs, 6 a SM, a cap of 49%; ncu measured 35.1% of a theoretical 75%, 47%).
    The cap is the launch's threads over the slots its limits allow, whatever the block size: only more threads
    for the same work (less work per thread) would lift it."""
    shape = _grid_shape(row)
    if shape is None or shape[0] >= shape[1] * shape[2]:
        return None
    grid, sms, most = shape
    busy = grid / min(grid, sms)
    blocks = f"{grid:,.0f} blocks are" if grid != 1 else "1 block is"
    return busy / most, (f"this tool: its {blocks} under one wave on {sms:,.0f} SMs, {busy:.1f} a busy SM of the "
                         f"{most:,.0f} it could hold: that caps achieved occupancy at about {100 * busy / most:.0f}% "
                         "of the theoretical whatever the scheduling; only more threads for the same work (less work "
                         "per thread) would lift the cap")


def _tail_share(row) -> tuple[float, str] | None:
    """(the share of a kernel's block-slot time its last, partial wave leaves empty, blocks taking equal time; its
    sentence) for a grid of more than one wave, from the raw page's grid and block limits; None otherwise."""
    shape = _grid_shape(row)
    if shape is None or shape[0] <= shape[1] * shape[2]:
        return None
    grid, slots = shape[0], shape[1] * shape[2]
    waves = grid / slots
    empty = (math.ceil(waves) - waves) / math.ceil(waves)
    return empty, (f"this tool: {grid:,.0f} blocks on {slots:,.0f} block slots are {waves:.2f} waves; with blocks of "
                   f"equal time the last wave leaves {100 * empty:.1f}% of the kernel's block-slot time empty, the most "
                   "a grid of whole waves recovers: the gain counts that, not ncu's bound")


def _grid_note(rule: str, row) -> str:
    """The tool's note beside ncu's AchievedOccupancy rule, which puts the gap to the theoretical occupancy down to
    scheduling overheads or imbalance, where the kernel's grid explains part of it (_grid_cap); "" elsewhere."""
    cap = _grid_cap(row) if rule == "AchievedOccupancy" else None
    return cap[1] if cap else ""


def _beyond_the_grid(row) -> float | None:
    """The share of the gap from achieved to theoretical occupancy that the grid's cap does not explain (what
    scheduling could still recover), from the raw page's own figures; None where there is no cap or no figures."""
    cap = _grid_cap(row)
    if cap is None:
        return None
    theory = reading(row.get("sm__maximum_warps_per_active_cycle_pct"))
    achieved = reading(row.get("achieved_occupancy_pct",
                               row.get("sm__warps_active.avg.pct_of_peak_sustained_active")))
    if not (theory > achieved >= 0):
        return None
    return max(0.0, cap[0] * theory - achieved) / (theory - achieved)


def _rules_section(rules, raw=None) -> Section:
    """NCU's rule results, ranked; the tool's own note before a rule's text where the kernel's grid explains what
    the rule puts down to other causes (_grid_note)."""
    if not len(rules):
        return Section("NCU rule results", text="No rule results.")
    r = rules.sort_values("speedup_pct", ascending=False, na_position="last")
    by_id = _raw_by_id(raw)

    def advice(x) -> str:
        note = _grid_note(x.rule, by_id.get(str(int(float(x.id))))) if by_id else ""
        text = x.rule_description[:160].replace("|", "/")
        return f"{note[:1].upper() + note[1:]}. NCU: {text}" if note else text

    return Section("NCU rule results", columns=["Stage", "Kernel", "Type", "Rule", "Est. speedup", "Advice"],
                   rows=[[x.stage if isinstance(x.stage, str) else "-", x.kernel[:30], x.rule_type, x.rule,
                          f"{x.speedup_pct:.1f}% ({x.speedup_type})" if x.speedup_pct == x.speedup_pct else
                          getattr(x, "speedup_flag", "") or "-", advice(x)] for x in r.itertuples()])


def _verbose(plan, metrics, rules) -> str:
    sections = []
    for (kid, kname), grp in metrics.groupby(["id", "kernel"], sort=False):
        for sec, rows in grp.groupby("section", sort=False):
            sections.append(Section(f"{kid} {kname[:60]} — {sec}", columns=["Metric", "Unit", "Value"],
                                    rows=[[m.metric, m.unit, m.value] for m in rows.itertuples()]))
    return render(plan.kernel, plan.version + " (verbose)", "Every ncu section of every profiled kernel.", sections)


def _hot_listing(kname: str, sass) -> str:
    if STALL not in sass:
        return f"# {kname}\n\nNo warp stall samples in this export.\n"
    top = sass.sort_values(STALL, ascending=False).head(20)
    total = sass[STALL].sum() or 1
    lines = [f"# {kname}", "", f"Hottest SASS instructions by warp-stall samples ({int(total)} samples).", "",
             "| Address | Instruction | Samples | Share |", "|---|---|---|---|"]
    lines += [f"| {r.Address} | `{str(r.Source).strip()}` | {fmt(r[STALL], 0)} | {100 * r[STALL] / total:.1f}% |"
              for _, r in top.iterrows()]
    return "\n".join(lines) + "\n"


def ncu_profile_plan(plan, out_dir=None, version=None, bench_runs=None, **options):
    """Profile ``plan`` (or its kernel at ``version``) in ncu mode; ``bench_runs`` may only be 1."""
    return counters.profile_api(NcuMode(), plan, out_dir, version, bench_runs, options)
