"""What a profile says about its output's check, from the records the plans' oracles write (as trace.json holds
them, tuples turned to lists): the counts and the worst or first rows, and no figure the record does not hold."""
import json

import pytest

from app.analysis.baseline import unverified_reason, verification_of, verification_state, what_differs
from app.report.sections import (verification_banner, verification_line, verification_section,
                                 with_verification_headline, with_verification_summary)

OVERLAY_AREA = {"matches": False, "mismatched_pairs": 1, "worst": [((24, 31), 0.0123456, 0.0123333)],
                "pairs": 65, "expected_pairs": 65, "oracle": "shapely.intersection(a, b).area"}
OVERLAY_SHAPE = {"matches": False, "mismatched_pairs": None, "worst": [], "problem": "rows not sorted by (a, b)",
                 "pairs": 65, "expected_pairs": 65, "oracle": "shapely"}
JOIN_DROP = {"oracle": "shapely.STRtree.query", "matches": False, "pairs": 548, "expected_pairs": 549,
             "missing": [(0, 17)], "extra": []}


def trace_of(v):
    return {"metadata": {"verification": json.loads(json.dumps(v)) if v is not None else None}}


def test_an_overlay_area_mismatch_names_the_pair_both_areas_and_the_difference():
    text = what_differs(trace_of(OVERLAY_AREA)["metadata"]["verification"])
    assert text == ("1 pair differs (65 rows vs 65 expected); worst: (24, 31) area 0.0123456 vs 0.0123333 expected "
                    "(+0.0997%)")


def test_overlay_pairs_on_one_side_read_as_missing_or_extra():
    v = OVERLAY_AREA | {"mismatched_pairs": 2, "worst": [((1, 2), 0.0, 0.5), ((3, 4), 0.25, 0.0)]}
    assert what_differs(v).endswith("; worst: (1, 2) missing (area 0.5 expected); (3, 4) extra (area 0.25, none "
                                    "expected)")
    assert what_differs(v).startswith("2 pairs differ")


def test_an_invalid_overlay_answer_says_why():
    assert what_differs(OVERLAY_SHAPE) == "not a valid answer (rows not sorted by (a, b)); 65 rows vs 65 expected"


def test_join_counts_are_exact_below_five_listed_and_a_floor_at_five():
    assert what_differs(JOIN_DROP) == "548 rows vs 549 expected: 1 missing, 0 extra; missing: (0, 17)"
    five = JOIN_DROP | {"missing": [(i, 0) for i in range(5)], "extra": [(9, 9)]}
    assert what_differs(five).startswith("548 rows vs 549 expected: 5 or more missing, 1 extra; missing: (0, 0), "
                                         "(1, 0), (2, 0) ...; extra: (9, 9)")
    counted = five | {"missing_count": 12, "extra_count": 1}
    assert "12 missing, 1 extra" in what_differs(counted)
    reordered = JOIN_DROP | {"pairs": 549, "missing": [], "extra": []}
    assert "out of order or one repeated" in what_differs(reordered)


@pytest.mark.parametrize("v,state,line", [
    (None, "skipped", "  not verified (--no-verify)"),
    ({"error": "ImportError: no shapely", "matches": None}, "error", "  verification could not run: ImportError: "
                                                                     "no shapely"),
    (JOIN_DROP | {"matches": True, "missing": None}, "ok", "  verified against shapely.STRtree.query: OK (548 rows)"),
    (JOIN_DROP, "mismatch", "  verified against shapely.STRtree.query: MISMATCH, 548 rows vs 549 expected: 1 "
                            "missing, 0 extra; missing: (0, 17)"),
])
def test_every_state_has_its_summary_line(v, state, line):
    t = trace_of(v)
    assert verification_state(verification_of(t)) == state
    assert verification_line(t) == line
    assert (verification_banner(t) != "") == (state in ("mismatch", "error"))
    assert (unverified_reason(t) != "") == (state in ("mismatch", "error"))


def test_a_damaged_record_is_never_a_pass():
    t = {"metadata": {"verification": "yes"}}
    assert verification_state(verification_of(t)) == "error"
    assert "damaged" in unverified_reason(t)
    assert verification_of({"metadata": "x"}) is None


def test_the_summary_gets_the_banner_first_and_the_line_last_once():
    t = trace_of(JOIN_DROP)
    once = with_verification_summary(t, "join v4 on cpu: total 1.0 us\n  stage 1.0 us")
    assert once.splitlines()[0].startswith("OUTPUT DOES NOT MATCH THE REFERENCE (shapely.STRtree.query): 548 rows")
    assert once.splitlines()[-1].startswith("  verified against shapely.STRtree.query: MISMATCH")
    assert with_verification_summary(t, once) == once


def test_the_report_headline_leads_with_a_failure_and_ends_with_no_verify():
    head = with_verification_headline(trace_of(JOIN_DROP), "`cmd` — CPU, total 1 us.")
    assert head.startswith("**OUTPUT DOES NOT MATCH THE REFERENCE** (shapely.STRtree.query): 548 rows")
    assert head.endswith("\n\n`cmd` — CPU, total 1 us.")
    assert with_verification_headline(trace_of(None), "h.") == "h. Output not verified (`--no-verify`)."
    assert with_verification_headline(trace_of(JOIN_DROP | {"matches": True}), "h.") == "h."


def test_the_verification_section_lists_the_rows():
    s = verification_section(trace_of(OVERLAY_AREA))
    assert s.text.startswith("Output DOES NOT MATCH shapely.intersection(a, b).area: 1 pair differs")
    assert s.items == ["(24, 31) area 0.0123456 vs 0.0123333 expected (+0.0997%)"]
    err = verification_section(trace_of({"error": "ValueError: oracle failed", "matches": None}))
    assert err.text.startswith("**Verification could not run:** ValueError: oracle failed.")
