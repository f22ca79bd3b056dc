"""Warp-stall samples of a warp waiting at a barrier sit on the instruction after the BAR (the one it will issue
next); the hot-spot table moves them onto the barrier's own instruction and source line."""
import pandas as pd

from app.runtime.profiling.parsers.ncu_rep import barrier_waits_on_the_barrier, line_table

# Four instructions of join v5's output_fused as ncu's SASS listing gives them (join_fused.cu's grid barrier ends
# at line 28's __syncthreads; line 76 sorts each point's polygons), with made-up sample counts.
SASS = {0x100: ("ISETP.NE.AND P0, PT, R0, RZ, PT", 27), 0x110: ("BAR.SYNC.DEFER_BLOCKING 0x0", 28),
        0x120: ("ULDC UR4, c[0x0][0x198]", 76), 0x130: ("LDG.E R2, desc[UR4][R2.64]", 76)}
FILE = "/any/src/app/kernel/join/join_fused.cu"


def where(pc):
    sass, line = SASS[pc]
    return {"file": FILE, "line": line, "sass": sass}


def rows(*counts):
    return pd.DataFrame([{"pc": pc, **where(pc), "samples": b + o, "stall_barrier": b, "stall_long_scoreboard": o}
                         for pc, (b, o) in counts])


def test_barrier_samples_on_the_instruction_after_a_bar_move_onto_it():
    got = barrier_waits_on_the_barrier(rows((0x120, (675, 12)), (0x130, (0, 40))), where)
    assert got.set_index("pc")["samples"].to_dict() == {0x110: 675, 0x120: 12, 0x130: 40}
    lines = line_table(got).set_index("line")
    assert lines.loc[28, "samples"] == 675 and lines.loc[76, "samples"] == 52
    assert got["samples"].sum() == 727 and (got["stall_barrier"] + got["stall_long_scoreboard"] == got["samples"]).all()


def test_barrier_samples_elsewhere_and_other_stalls_stay():
    df = rows((0x110, (5, 0)), (0x130, (9, 3)))        # on the BAR itself; after an LDG, not a BAR
    assert barrier_waits_on_the_barrier(df, where).equals(df)
    assert barrier_waits_on_the_barrier(df.drop(columns="stall_barrier"), where).equals(df.drop(columns="stall_barrier"))
