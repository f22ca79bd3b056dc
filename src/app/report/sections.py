"""Report sections every mode that runs the plan shows the same way: transfers and syncs,
verification against the oracle, and the device the plan ran on."""
from __future__ import annotations

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


def verification_section(trace: dict) -> Section:
    v = trace["metadata"].get("verification")
    if not v:
        return Section("Verification", text="Not verified (`--no-verify`).")
    verdict = "matches" if v["matches"] else "DOES NOT MATCH"
    return Section("Verification", text=f"Output {verdict} {v['oracle']}: {v['pairs']:,} result rows, "
                                        f"{v['expected_pairs']:,} expected.")


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
