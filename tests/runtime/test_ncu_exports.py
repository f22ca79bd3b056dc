"""ncu mode's three CSV pages and its .ncu-rep are one capture: on this project's own --set full capture of
join v2 (tests/fixtures/ncu), a page or report short of kernels is refused -- every table would be short of
them -- where before the hot-spot listing alone was dropped and the profile written."""
import gzip
import shutil

import pytest

from app.analysis.kernel_metrics import kernel_table
from app.errors import MalformedToolOutput
from app.kernel.plan import get_plan_class
from app.runtime.profiling.ncu import check_exports_agree, hot_spots
from app.runtime.profiling.parsers.ncu_csv import parse_details, parse_raw, parse_source
from tests.conftest import OWN_FIXTURES, fixture_text

STAGES = [s.name for s in get_plan_class("join", "v2")().stages]
KERNELS = 16                             # kernels in the capture's one warm iteration of join v2


@pytest.fixture(scope="module")
def pages():
    raw, _ = parse_raw(fixture_text("ncu/join.full.raw.csv"))
    metrics, _ = parse_details(fixture_text("ncu/join.full.details.csv"))
    return raw, metrics, parse_source(fixture_text("ncu/join.full.source.csv"))


def test_the_committed_exports_agree(pages):
    check_exports_agree(*pages, "profile.ncu-rep")


def test_a_page_short_of_kernels_is_refused(pages):
    raw, metrics, sources = pages
    with pytest.raises(MalformedToolOutput, match=f"the raw page holds 12 kernels, the details page {KERNELS}"):
        check_exports_agree(raw.iloc[:12], metrics, sources, "profile.ncu-rep")
    with pytest.raises(MalformedToolOutput, match=f"the raw page holds {KERNELS} kernels, the details page {KERNELS - 1}"):
        check_exports_agree(raw, metrics[metrics["id"].astype(int) != 7], sources, "profile.ncu-rep")
    with pytest.raises(MalformedToolOutput, match=f"the raw page holds {KERNELS} kernels, the source page {KERNELS - 1}"):
        check_exports_agree(raw, metrics, dict(list(sources.items())[:KERNELS - 1]), "profile.ncu-rep")


def test_a_report_holding_more_kernels_than_its_export_is_refused(tmp_path, pages):
    raw, _, sources = pages
    rep = tmp_path / "profile.ncu-rep"
    with gzip.open(OWN_FIXTURES / "ncu" / "join.full.ncu-rep.gz", "rb") as src, open(rep, "wb") as dst:
        shutil.copyfileobj(src, dst)
    short = raw.iloc[:12].reset_index(drop=True)
    with pytest.raises(MalformedToolOutput, match=f"read {KERNELS} kernels from profile.ncu-rep, its CSV export has 12"):
        hot_spots(str(rep), None, kernel_table(short, "join", STAGES, "NVIDIA H200"),
                  dict(list(sources.items())[:12]))
