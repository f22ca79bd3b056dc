"""Report sections every mode that runs the plan shows the same way: transfers and syncs,
verification against the oracle, and the device the plan ran on."""
from __future__ import annotations

from app.analysis.baseline import pair_text, verification_of, verification_state, what_differs, worst_text
from app.report.clock_text import lock_word
from app.report.markdown import Section, fmt

TRANSFER_KEYS = ("h2d_copies", "h2d_bytes", "d2h_copies", "d2h_bytes", "syncs", "allocation_size_reads",
                 "result_size_reads")


def transfers_section(trace: dict) -> Section:
    residency = trace["metadata"].get("output_residency", "device")
    return Section("Transfers and syncs", columns=["Stage", "H2D copies", "H2D bytes", "D2H copies", "D2H bytes",
                                                   "syncs", "allocation-size reads", "of them, result length"],
                   rows=[[s["name"]] + [fmt(s["metadata"].get(k, 0)) for k in TRANSFER_KEYS[:-1]]
                         + [fmt(s["metadata"]["result_size_reads"]) if "result_size_reads" in s["metadata"]
                            else "result_size_reads not recorded"]
                         for s in trace["stages"]],
                   note=f"Counted per run of the plan. Output stays {residency}-resident; copying results to the "
                        "host is outside the plan. A result-length read comes after the stage's last launch: "
                        "nothing on the device waits for it.")


def verification_line(trace: dict) -> str:
    """The terminal summary's line on the check, for every mode."""
    v = verification_of(trace)
    state = verification_state(v)
    if state == "skipped":
        return "  not verified (--no-verify)"
    if state == "error":
        return f"  verification could not run: {v['error']}"
    if state == "ok":
        return f"  verified against {v['oracle']}: OK ({v.get('pairs', 0):,} rows)"
    return f"  verified against {v.get('oracle')}: MISMATCH, {what_differs(v)}"


def verification_banner(trace: dict, markdown: bool = False) -> str:
    """The line that leads a profile's summary and report.md when its output is wrong or unverified ('' when the
    check passed or was not asked for): every figure below it times an answer that is wrong, or not known right."""
    v = verification_of(trace)
    state = verification_state(v)
    if state == "mismatch":
        head = "OUTPUT DOES NOT MATCH THE REFERENCE"
        return (f"{'**' + head + '**' if markdown else head} ({v.get('oracle')}): {what_differs(v)}. The figures "
                "below time a wrong answer: fix the output before reading them (no devlog entry, compare or "
                "--baseline takes this profile).")
    if state == "error":
        head = "VERIFICATION COULD NOT RUN"
        return (f"{'**' + head + '**' if markdown else head}: {v['error']}. The output is unverified: the figures "
                "below may time a wrong answer (no devlog entry, compare or --baseline takes this profile).")
    return ""


def with_verification_headline(trace: dict, headline: str) -> str:
    """A report's headline with the verification's word: the banner first where the output is wrong or unverified,
    and a closing sentence where no check was made."""
    banner = verification_banner(trace, markdown=True)
    if banner:
        return f"{banner}\n\n{headline}"
    if verification_state(verification_of(trace)) == "skipped":
        return f"{headline} Output not verified (`--no-verify`)."
    return headline


def with_verification_summary(trace: dict, summary: str) -> str:
    """A terminal summary with the verification's line at its end and, where the output is wrong or unverified, its
    banner first. Idempotent: a summary that has them already is returned as it is."""
    line, banner = verification_line(trace), verification_banner(trace)
    if line.strip() not in summary:
        summary = f"{summary}\n{line}"
    if banner and not summary.startswith(banner):
        summary = f"{banner}\n{summary}"
    return summary


def verification_section(trace: dict) -> Section:
    v = verification_of(trace)
    state = verification_state(v)
    if state == "skipped":
        return Section("Verification", text="Not verified (`--no-verify`).")
    if state == "error":
        return Section("Verification", text=f"**Verification could not run:** {v['error']}. The output is "
                                            "unverified: neither a pass nor a mismatch.")
    if state == "ok":
        return Section("Verification", text=f"Output matches {v['oracle']}: {v['pairs']:,} result rows, "
                                            f"{v['expected_pairs']:,} expected.")
    items = [worst_text(r) for r in v.get("worst") or []]
    items += [f"{pair_text(k)} missing" for k in v.get("missing") or []] + [f"{pair_text(k)} extra"
                                                                          for k in v.get("extra") or []]
    return Section("Verification", text=f"Output DOES NOT MATCH {v.get('oracle')}: {what_differs(v)}.",
                   items=items, note="The rows listed are the oracle's worst (or first) five of each kind; "
                                     "trace.json holds them under metadata.verification." if items else None)


def device_section(trace: dict, params_json: dict) -> Section:
    rows = [["selected runtime (ran)", trace["selected_runtime"]],
            ["planner selected runtime", trace["metadata"]["planner_selected_runtime"]],
            ["requested", trace["requested_runtime"]],
            ["why", trace["metadata"]["selection_reason"]]]
    rows += [[k, fmt(v)] for k, v in trace["device"].items() if k != "name" and v is not None]
    clocks = params_json.get("clocks", {})
    rows.append(["clocks locked", f"{lock_word(clocks)} ({clocks.get('detail') or 'no clock record'})"])
    if trace["metadata"].get("compile_options"):
        rows.append(["kernel compile options", " ".join(trace["metadata"]["compile_options"])])
    nv = trace["metadata"]["nvtx"]
    rows.append(["NVTX", f"{'emitted' if nv['emitted'] else 'not emitted'}: {nv['ranges']} ranges, "
                         f"domain {nv['domain']!r} ({nv['detail']})"])
    return Section("Device", columns=["what", "value"], rows=rows)
