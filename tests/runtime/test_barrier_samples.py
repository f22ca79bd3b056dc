"""Warp-stall samples of a warp waiting at a barrier sit on an instruction after the BAR (the first one it may not
issue before the other warps arrive); the hot-spot table moves them onto the BAR it waits at and its source line."""
import pandas as pd
import pytest

from app.runtime.profiling.parsers.ncu_csv import parse_source
from app.runtime.profiling.parsers.ncu_rep import (barrier_waits_on_the_barrier, branch_targets, line_table,
                                                   waited_barrier)
from tests.conftest import fixture_text

# Four instructions of join v5's output_fused as ncu's SASS listing gives them (join_fused.cu's grid barrier ends
# at line 28's __syncthreads; line 76 sorts each point's polygons), with made-up sample counts.
SASS = {0x100: ("ISETP.NE.AND P0, PT, R0, RZ, PT", 27), 0x110: ("BAR.SYNC.DEFER_BLOCKING 0x0", 28),
        0x120: ("ULDC UR4, c[0x0][0x198]", 76), 0x130: ("LDG.E R2, desc[UR4][R2.64]", 76)}
FILE = "/any/src/app/kernel/join/join_fused.cu"


def where(pc):
    sass, line = SASS[pc]
    return {"file": FILE, "line": line, "sass": sass}


def rows(*counts, sass=None):
    sass = sass or {pc: s for pc, (s, _) in SASS.items()}
    return pd.DataFrame([{"pc": pc, "file": FILE, "line": SASS.get(pc, ("", pc))[1], "sass": sass[pc],
                          "samples": b + o, "stall_barrier": b, "stall_long_scoreboard": o} for pc, (b, o) in counts])


LISTING = {pc: s for pc, (s, _) in SASS.items()}


def test_barrier_samples_on_the_instruction_after_a_bar_move_onto_it():
    got = barrier_waits_on_the_barrier(rows((0x120, (675, 12)), (0x130, (0, 40))), where, LISTING)
    assert got.set_index("pc")["samples"].to_dict() == {0x110: 675, 0x120: 12, 0x130: 40}
    lines = line_table(got).set_index("line")
    assert lines.loc[28, "samples"] == 675 and lines.loc[76, "samples"] == 52
    assert got["samples"].sum() == 727 and (got["stall_barrier"] + got["stall_long_scoreboard"] == got["samples"]).all()


def test_barrier_samples_elsewhere_and_other_stalls_stay():
    df = rows((0x110, (5, 0)), (0x130, (9, 3)))        # on the BAR itself; after an LDG, not a BAR
    assert barrier_waits_on_the_barrier(df, where, LISTING).equals(df)
    bare = df.drop(columns="stall_barrier")
    assert barrier_waits_on_the_barrier(bare, where, LISTING).equals(bare)


# output_fused's grid barrier in join v5 at 100k points (an H200 capture): the barrier's samples sat on the LDC two
# instructions after the BAR, past an IMAD that a waiting warp still issues.
DEFERRED = {0x200: "BAR.SYNC.DEFER_BLOCKING 0x0", 0x210: "IMAD.MOV.U32 R15, RZ, RZ, RZ",
            0x220: "LDC R7, c[0x0][0xc]", 0x230: "UMOV UR4, URZ"}


def test_a_wait_sampled_past_arithmetic_after_the_bar_is_the_bars():
    assert waited_barrier(0x220, DEFERRED, branch_targets(DEFERRED)) == 0x200
    assert waited_barrier(0x210, DEFERRED, set()) == 0x200
    assert waited_barrier(0x200, DEFERRED, set()) is None            # the BAR itself: nothing to move


@pytest.mark.parametrize("between, why", [
    ("LDS.64 R14, [R26+0x100]", "a shared load a waiting warp cannot have issued"),
    ("@P0 BRA 0x260", "a branch: the straight path ends"),
    ("BAR.ARV 0x1, 0x40", "another barrier operation"),
    ("MEMBAR.SC.GPU", "a fence"),
    ("WARPSYNC.ALL", "a warp's own convergence"),
])
def test_the_walk_back_stops_at_what_a_waiting_warp_does_not_issue(between, why):
    listing = DEFERRED | {0x210: between}
    assert waited_barrier(0x220, listing, branch_targets(listing)) is None, why


def test_a_branch_target_between_the_bar_and_the_sample_keeps_the_samples_where_they_are():
    """A warp at 0x220 may have come from the branch at 0x250, having waited at some other barrier."""
    listing = DEFERRED | {0x240: "ISETP.NE.AND P0, PT, R0, RZ, PT", 0x250: "@P0 BRA 0x210"}
    assert 0x210 in branch_targets(listing)
    assert waited_barrier(0x220, listing, branch_targets(listing)) is None
    listing[0x250] = "BSSY B0, 0x220"                     # a reconvergence point is entered from elsewhere too
    assert waited_barrier(0x220, listing, branch_targets(listing)) is None
    listing[0x250] = "CALL.REL.NOINC 0x300"               # a call returns to the instruction after it
    assert 0x260 in branch_targets(listing) and waited_barrier(0x220, listing, branch_targets(listing)) == 0x200
    listing[0x250] = "BRX R4 -0x10"                        # an indirect jump may land anywhere
    assert branch_targets(listing) is None and waited_barrier(0x220, listing, None) is None


def test_the_bar_is_looked_for_within_a_short_window_only():
    listing = {0x100 + 16 * i: "IADD3 R1, R1, 0x1, RZ" for i in range(12)} | {0x100: "BAR.SYNC.DEFER_BLOCKING 0x0"}
    assert waited_barrier(0x100 + 16 * 8, listing, set()) == 0x100
    assert waited_barrier(0x100 + 16 * 9, listing, set()) is None


def _source_rows(sass: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """A kernel of the committed source page as the hot-spot reader sees it: its sampled instructions (barrier
    samples and the rest) and its whole listing."""
    pcs = sass["Address"].map(lambda a: int(a, 16))
    listing = dict(zip(pcs, sass["Source"].str.strip()))
    total = sass["Warp Stall Sampling (All Samples)"]
    df = pd.DataFrame({"pc": pcs, "file": "f.cu", "line": pcs, "sass": sass["Source"].str.strip(),
                       "samples": total, "stall_barrier": sass["stall_barrier"],
                       "stall_other": total - sass["stall_barrier"]})
    return df[df["samples"] > 0].reset_index(drop=True), listing


@pytest.mark.parametrize("capture", ["join", "overlay", "overlay_v3"])
def test_every_barrier_sample_of_the_committed_captures_lands_on_a_bar(capture):
    """On join and overlay v2 and overlay v3 (H200, -lineinfo), ncu put barrier samples 1 to 5 instructions after
    their BAR (refine: 17 on a BSSY after three integer instructions; scan_i64_i64: 3 on a UMOV after four). Moved,
    every one of them sits on a BAR.SYNC, and no sample is lost or made."""
    moved_far = 0
    for name, sass in parse_source(fixture_text(f"ncu/{capture}.full.source.csv")).items():
        if "stall_barrier" not in sass:
            continue
        df, listing = _source_rows(sass)
        got = barrier_waits_on_the_barrier(df, lambda pc: {"file": "f.cu", "line": pc, "sass": listing[pc]}, listing)
        assert got["samples"].sum() == df["samples"].sum() and got["stall_barrier"].sum() == df["stall_barrier"].sum()
        off = got[(got["stall_barrier"] > 0) & ~got["sass"].str.startswith("BAR.SYNC")]
        assert off.empty, (name, off[["pc", "sass", "stall_barrier"]].to_dict("records"))
        before = dict(zip(df["pc"], df["stall_barrier"]))
        moved_far += sum(n for pc, n in zip(got["pc"], got["stall_barrier"])
                         if n > before.get(pc, 0) and before.get(pc + 16, 0) == 0)
    assert moved_far > 0          # samples more than one instruction after their BAR: what a pc-16 rule left behind


def test_refines_barrier_samples_four_instructions_on_move_to_its_bar():
    df, listing = _source_rows(parse_source(fixture_text("ncu/join.full.source.csv"))["refine"])
    bssy = next(pc for pc, s in listing.items() if s.startswith("BSSY") and listing.get(pc - 64, "").startswith("BAR"))
    assert df.set_index("pc").loc[bssy, "stall_barrier"] == 17
    got = barrier_waits_on_the_barrier(df, lambda pc: {"file": "f.cu", "line": pc, "sass": listing[pc]},
                                       listing).set_index("pc")
    assert bssy not in got.index and got.loc[bssy - 64, "stall_barrier"] >= 17
