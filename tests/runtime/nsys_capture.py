"""The nsys fixtures (tests/fixtures/nsys/, made by make.sh there on the lent H200) and readings straight from
their exports, for the tests of nsys mode and of the timeline command. A missing fixture fails the test."""
import json
import sqlite3
from pathlib import Path

from app.kernel.plan import get_plan_class

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "nsys"


def fixture(name: str) -> Path:
    path = FIX / name
    assert path.is_file(), f"fixture {path} is missing: re-create it with tests/fixtures/nsys/make.sh on a GPU"
    return path


def load(kernel):
    worker = json.loads(fixture(f"{kernel}.worker.json").read_text())
    plan = get_plan_class(kernel, worker["version"])(worker["params"])
    return plan, worker


def raw_ranges(db: Path, name: str) -> list[tuple[int, int, int]]:
    """(start, end, thread) of every range called ``name``, straight from the export."""
    con = sqlite3.connect(db)
    return con.execute("SELECT n.start, n.end, n.globalTid FROM NVTX_EVENTS n JOIN StringIds s ON s.id = n.textId "
                       "WHERE s.value = ? ORDER BY n.start", (name,)).fetchall()


def raw_kernel_ns(db: Path, start: int, end: int, tid: int) -> int:
    """Kernel time launched from [start, end) on the thread: runtime record -> correlation id -> kernel."""
    con = sqlite3.connect(db)
    return con.execute("SELECT COALESCE(SUM(k.end - k.start), 0) FROM CUPTI_ACTIVITY_KIND_KERNEL k WHERE k.correlationId "
                       "IN (SELECT correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE start >= ? AND start < ? "
                       "AND globalTid = ?)", (start, end, tid)).fetchone()[0]
