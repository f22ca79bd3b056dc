"""Source-line hot spots from an .ncu-rep, read with NVIDIA's own ``ncu_report`` module.

``ncu_report`` ships with Nsight Compute (``extras/python`` of the install) and on PyPI as
``ncu-report``; the copy beside the ncu that made the capture is preferred, since a reader
must be at least as new as the report. ncu's warp-state sampling stores, per kernel and per
program counter (PC), how many samples found a warp there and why it was stalled; the line
table that ``-lineinfo`` puts in the kernel maps each PC to a CUDA source line. The CSV
export has no per-reason split per line, which is why this reads the report itself.
"""
from __future__ import annotations

import re
import shutil
import sys
from pathlib import Path

import pandas as pd

SAMPLES = "smsp__pcsamp_sample_count"
STALL_PREFIX = "smsp__pcsamp_warps_issue_stalled_"
PIP_HINT = "pip install ncu-report (NVIDIA's reader for .ncu-rep files)"


def load_module(ncu: str | None = None):
    """(module, where) -- the ncu_report beside ``ncu``, else any Nsight Compute install, else the
    pip package; (None, why) when none imports."""
    dirs = []
    if ncu:
        real = Path(shutil.which(ncu) or ncu).resolve()
        dirs += [p / "extras" / "python" for p in list(real.parents)[:3]]
    dirs += sorted(Path("/opt/nvidia/nsight-compute").glob("*/extras/python"), reverse=True)
    errors = []
    for d in dirs:
        if (d / "ncu_report.py").is_file():
            sys.path.insert(0, str(d))
            try:
                import ncu_report
                return ncu_report, str(d)
            except ImportError as exc:
                errors.append(f"{d}: {exc}")
            finally:
                sys.path.remove(str(d))
    try:
        import ncu_report
        return ncu_report, "pip package ncu-report"
    except ImportError:
        return None, "NVIDIA's ncu_report module was not found" + (f" ({'; '.join(errors)})" if errors else "") \
            + f"; {PIP_HINT}"


def read_samples(module, path: str) -> dict[int, dict]:
    """Per kernel, keyed by its ncu ID (the order of the raw page): its name, one row per sampled PC
    (file, line, SASS, samples, one column per stall reason) and the source files ncu imported."""
    ctx = module.load_report(str(path))
    out, kid = {}, 0
    for r in range(ctx.num_ranges()):
        rng = ctx.range_by_idx(r)
        for i in range(rng.num_actions()):
            action = rng.action_by_idx(i)
            out[kid] = {"kernel": action.name(), "samples": pc_samples(action),
                        "sources": dict(action.source_files())}
            kid += 1
    return out


def _instances(metric) -> dict[int, float]:
    if metric is None or not metric.num_instances():
        return {}
    ids = metric.correlation_ids()
    return {ids.as_uint64(i): float(metric.as_uint64(i)) for i in range(metric.num_instances())}


def pc_samples(action) -> pd.DataFrame:
    total = _instances(action.metric_by_name(SAMPLES))
    reasons = {name[len(STALL_PREFIX):]: _instances(action.metric_by_name(name)) for name in action.metric_names()
               if name.startswith(STALL_PREFIX) and not name.endswith("_not_issued")}

    def where(pc: int) -> dict:
        info = action.source_info(pc)
        return {"file": info.file_name() if info else None, "line": info.line() if info else None,
                "sass": (action.sass_by_pc(pc) or "").strip()}

    rows = [{"pc": pc, **where(pc), "samples": n} | {f"stall_{k}": v.get(pc, 0.0) for k, v in reasons.items()}
            for pc, n in sorted(total.items())]
    df = pd.DataFrame(rows, columns=["pc", "file", "line", "sass", "samples"] + [f"stall_{k}" for k in reasons])
    return barrier_waits_on_the_barrier(df, where, kernel_listing(action, total))


SASS_BYTES = 16         # one SASS instruction (Volta and later): the one before a PC is 16 bytes before it


def kernel_listing(action, sampled) -> dict[int, str]:
    """{pc: SASS} of the whole kernel: ncu_report gives an instruction by its PC only, and none outside the kernel,
    so the listing is walked from the sampled PCs down and up to where it ends (on this project's captures it is
    the source page's listing, instruction for instruction). Branch targets anywhere in the kernel are read off it."""
    if not sampled:
        return {}
    out = {}
    for start, step in ((min(sampled), -SASS_BYTES), (max(sampled) + SASS_BYTES, SASS_BYTES)):
        pc = start
        while text := (action.sass_by_pc(pc) or "").strip():
            out[pc] = text
            pc += step
    lo, hi = min(out, default=0), max(out, default=-1)
    for pc in range(lo, hi + 1, SASS_BYTES):          # between the sampled PCs
        if pc not in out:
            out[pc] = (action.sass_by_pc(pc) or "").strip()
    return out


# Which SASS a warp waiting at a CTA barrier can be sampled on, and which barrier that is.
# __syncthreads compiles to BAR.SYNC.DEFER_BLOCKING (Volta and later): the warp arrives at the BAR and goes on
# issuing the arithmetic after it, and only blocks -- sampled with reason "barrier" -- at the first instruction it may
# not issue before the other warps arrive: a memory access, a branch, a special-register read. On this project's H200
# captures that was 1 to 7 instructions after the BAR: join v5's output_fused, 705 samples on `LDC R7, c[0x0][0xc]`
# after `BAR.SYNC; IMAD.MOV.U32`; refine, 85 on `BSSY` after three integer instructions; morton_fused, 95 on
# `@P1 BRA` after a LOP3. The wait is then the nearest BAR before it on the straight path there, and its samples
# belong to the BAR's source line (a grid barrier's __syncthreads), not to the line that happens to come next.
# BAR.RED (__syncthreads_count/_and/_or) waits the same way; BAR.ARV only arrives and never waits; WARPSYNC waits for
# the warp's own lanes, which ncu counts under other reasons.
BARRIER_WAIT = re.compile(r"^BAR\.(?:SYNC|RED)(?:\.|\s|$)")
# Instructions a warp cannot have issued while its barrier was pending, or where the straight path ends: an
# instruction past one of these waits on some other barrier, or came from elsewhere, so nothing is moved across it.
_CONTROL = ("BRA", "BRX", "JMP", "JMX", "CALL", "RET", "EXIT", "BSSY", "BSYNC", "BREAK", "BMOV", "WARPSYNC",
            "ENDCOLLECTIVE", "YIELD", "KILL", "NANOSLEEP", "BPT")
_ORDERING = ("BAR", "MEMBAR", "ERRBAR", "CGAERRBAR", "CCTL", "DEPBAR", "SYNCS", "FENCE", "ARRIVES")
_WARP_WIDE = ("SHFL", "VOTE", "VOTEU", "MATCH", "REDUX", "S2R", "S2UR")      # lane exchanges, special registers
_MEMORY = ("LD", "ST", "ATOM", "RED", "ULD", "UST", "UTMA", "UBLK", "SU", "TEX", "TLD", "TXQ")
# How far back the nearest BAR is looked for: the longest run seen between a BAR and a barrier sample is seven
# instructions (join v5's output_fused: a BSSY seven after a scan's BAR, six integer operations between); a
# memory access, branch or branch target ends the walk sooner anyway.
BARRIER_WINDOW = 8


def _opcode(sass: str) -> str:
    """'@!P1 BAR.SYNC.DEFER_BLOCKING 0x0' -> 'BAR.SYNC.DEFER_BLOCKING' (the guard predicate dropped)."""
    text = re.sub(r"^@!?U?P\w+\s+", "", (sass or "").strip())
    return text.split(" ", 1)[0] if text else ""


def _ends_the_wait(op: str) -> bool:
    base = op.split(".", 1)[0]
    return base in _CONTROL or base in _ORDERING or base in _WARP_WIDE or base.startswith(_MEMORY)


def branch_targets(listing: dict[int, str]) -> set[int] | None:
    """The PCs control can arrive at other than from the instruction before: every address a branch, call, BSSY
    (its reconvergence point) or collective names, and the instruction after a CALL (where RET returns). None where
    the kernel jumps indirectly (BRX, JMX): any instruction may then be a target."""
    out = set()
    for pc, sass in listing.items():
        op = _opcode(sass)
        base = op.split(".", 1)[0]
        if base in ("BRX", "JMX"):
            return None
        if base in _CONTROL:
            out.update(int(h, 16) for h in re.findall(r"\b0x[0-9a-fA-F]+\b", sass) if int(h, 16) in listing)
        if base == "CALL":
            out.add(pc + SASS_BYTES)
    return out


def waited_barrier(pc: int, listing: dict[int, str], targets: set[int] | None) -> int | None:
    """The BAR a warp sampled at ``pc`` with reason "barrier" is waiting at: the nearest BAR.SYNC / BAR.RED before
    it within BARRIER_WINDOW instructions, reached by the straight path only (no instruction from the BAR's successor
    to ``pc`` a branch target) and with only instructions between that a waiting warp issues (no memory access,
    branch, other barrier or fence). None where there is no such BAR: the samples then stay where ncu put them."""
    if targets is None or BARRIER_WAIT.match(_opcode(listing.get(pc, ""))):
        return None
    cur = pc
    for _ in range(BARRIER_WINDOW):
        if cur in targets:
            return None
        prev = cur - SASS_BYTES
        op = _opcode(listing.get(prev, ""))
        if BARRIER_WAIT.match(op):
            return prev
        if not op or _ends_the_wait(op):
            return None
        cur = prev
    return None


def barrier_waits_on_the_barrier(df: pd.DataFrame, where, listing: dict[int, str]) -> pd.DataFrame:
    """A warp sampled while it waits at a barrier carries the PC of an instruction after the BAR (see BARRIER_WAIT):
    its barrier samples are moved onto the BAR it waits at (waited_barrier), so its source line is the barrier's.
    ``where(pc)``: an instruction's file, line and SASS; ``listing``: {pc: SASS} of the whole kernel. Samples of
    every other reason stay on their instruction."""
    if "stall_barrier" not in df or df.empty:
        return df
    listing = dict(listing) | {int(pc): str(s) for pc, s in zip(df["pc"], df["sass"]) if int(pc) not in listing}
    targets = branch_targets(listing)
    moves = []                                  # (from pc, to pc, samples)
    for pc, n in zip(df["pc"].astype(int), df["stall_barrier"]):
        to = waited_barrier(pc, listing, targets) if n > 0 else None
        if to is not None:
            moves.append((pc, to, n))
    if not moves:
        return df
    stalls = [c for c in df.columns if c.startswith("stall_")]
    have = set(df["pc"].astype(int))
    new = [{"pc": to, **where(to), "samples": 0.0} | dict.fromkeys(stalls, 0.0)
           for to in sorted({to for _, to, _ in moves} - have)]
    df = pd.concat([df, pd.DataFrame(new, columns=df.columns)], ignore_index=True)
    df.index = df["pc"].astype(int).to_numpy()
    for src, to, n in moves:
        df.loc[src, ["samples", "stall_barrier"]] -= n
        df.loc[to, ["samples", "stall_barrier"]] += n
    df = df[df["samples"] > 0]
    return df.sort_values("pc").reset_index(drop=True)


def short_path(path: str | None) -> str:
    """'/any/checkout/src/app/kernel/join/join.cu' -> 'app/kernel/join/join.cu'."""
    if not path:
        return "(no line info)"
    m = re.search(r"(?:^|/)(app/.*)$", path)
    return m.group(1) if m else Path(path).name


def line_table(samples: pd.DataFrame) -> pd.DataFrame:
    """One row per CUDA source line: samples, share of the kernel's samples, stall reasons ranked."""
    if samples.empty or samples["samples"].sum() <= 0:
        return pd.DataFrame(columns=["file", "line", "samples", "share_pct", "reasons", "pcs"])
    reason_cols = [c for c in samples if c.startswith("stall_")]
    s = samples.assign(file=samples["file"].fillna(""), line=samples["line"].fillna(0).astype(int))
    g = s.groupby(["file", "line"], sort=False)
    table = g[["samples"] + reason_cols].sum().reset_index()
    table["pcs"] = g["pc"].apply(list).values
    total = samples["samples"].sum()
    table["share_pct"] = 100 * table["samples"] / total
    table["reasons"] = [sorted(((c[len("stall_"):], row[c]) for c in reason_cols if row[c] > 0),
                               key=lambda kv: -kv[1]) for _, row in table.iterrows()]
    return table.sort_values("samples", ascending=False, kind="stable").reset_index(drop=True)


def _reason_text(reasons, samples: float, top: int = 3) -> str:
    # "selected" is the sample of a warp that was issuing, not a stall; name it so.
    return ", ".join(f"{'selected (issuing)' if k == 'selected' else k} {100 * v / samples:.0f}%"
                     for k, v in reasons[:top]) or "-"


def _code(sources: dict, file: str, line: int) -> str:
    text = sources.get(file)
    if text is None or line < 1:
        return "(source not imported)"
    lines = text.splitlines()
    return lines[line - 1].strip().replace("|", "\\|") if line <= len(lines) else "(line past end of file)"


def render_hot_lines(kernel: str, stage: str | None, data: dict, top: int = 15, sass_lines: int = 5) -> str:
    samples, sources = data["samples"], data["sources"]
    table = line_table(samples)
    head = [f"# {kernel}" + (f" (stage {stage})" if stage else " (outside every stage)"), ""]
    if table.empty:
        return "\n".join(head + ["No warp-stall samples for this kernel (it ran too briefly to be sampled).", ""])
    total = samples["samples"].sum()
    no_lines = samples["line"].isna().all()
    head += [f"{int(total):,} warp-stall samples on {len(samples)} instructions and {len(table)} source "
             f"line{'s' if len(table) != 1 else ''}. Share = the line's part of the kernel's samples; reasons = "
             "what the sampled warps were doing -- the stall that kept them from issuing, or 'selected' when "
             "issuing -- as shares of the line's samples." +
             (" This kernel carries no line table (not compiled with -lineinfo, e.g. a library kernel): "
              "the SASS is listed without source lines." if no_lines else ""), "",
             "| # | Source line | Share | Samples | Top stall reasons | Code |", "|---|---|---|---|---|---|"]
    shown = table.head(top)
    for i, r in enumerate(shown.itertuples(), 1):
        where = f"{short_path(r.file)}:{r.line}" if r.line else "(no line info)"
        head.append(f"| {i} | {where} | {r.share_pct:.1f}% | {int(r.samples):,} | "
                    f"{_reason_text(r.reasons, r.samples)} | `{_code(sources, r.file, r.line)}` |")
    head += ["", "## SASS under the hottest lines", ""]
    by_pc = samples.set_index("pc")
    for r in shown.head(5).itertuples():
        where = f"{short_path(r.file)}:{r.line}" if r.line else "(no line info)"
        head += [f"### {where} — {r.share_pct:.1f}% of samples", "", "| Address | Samples | Instruction |",
                 "|---|---|---|"]
        pcs = sorted(r.pcs, key=lambda pc: -by_pc.at[pc, "samples"])[:sass_lines]
        head += [f"| {pc:#x} | {int(by_pc.at[pc, 'samples']):,} | `{by_pc.at[pc, 'sass']}` |" for pc in pcs]
        if len(r.pcs) > sass_lines:
            head.append(f"| … | | {len(r.pcs) - sass_lines} more instructions on this line |")
        head.append("")
    return "\n".join(head)
