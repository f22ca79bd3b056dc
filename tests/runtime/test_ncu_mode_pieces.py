"""ncu mode's report pieces on the real --set full capture (shared/fixtures/ncu/full_*)."""
import pytest

from app.analysis.kernel_metrics import attribute_stages
from app.runtime.profiling.ncu import _hot_listing, _rule_ops, _rules_section, _verbose
from app.runtime.profiling.parsers.ncu_csv import parse_details, parse_raw, parse_source
from tests.conftest import FIXTURES

NCU = FIXTURES / "ncu"
pytestmark = pytest.mark.skipif(not NCU.exists(), reason="fixtures missing")


class _Plan:
    kernel, version = "probe", "v1"


@pytest.fixture(scope="module")
def capture():
    raw, _ = parse_raw((NCU / "full_raw.csv").read_text())
    metrics, rules = parse_details((NCU / "full_details.csv").read_text())
    rules = rules.assign(stage=attribute_stages(rules, "probe", ["stage:axpy"]))
    return raw, metrics, rules


def test_rule_gains_are_speedup_times_kernel_share(capture):
    raw, _, rules = capture
    ops = _rule_ops(rules, raw)
    top = ops[0]
    assert top["name"].startswith("HighPipeUtilization in stage:axpy")
    # Two saxpy kernels of near-equal time: each holds about half the iteration.
    assert 40 < top["gain_pct"] < 55 and "speedup=94.7" in top["trigger"]
    assert [o["gain_pct"] for o in ops] == sorted((o["gain_pct"] for o in ops), reverse=True)


def test_rules_table_verbose_report_and_hot_listing(capture):
    _, metrics, rules = capture
    section = _rules_section(rules)
    assert len(section.rows) == len(rules) and section.rows[0][3] == "HighPipeUtilization"
    verbose = _verbose(_Plan, metrics, rules)
    assert "GPU Speed Of Light Throughput" in verbose and "DRAM Frequency" in verbose
    sass = parse_source((NCU / "source_sass.csv").read_text())["saxpy"]
    hot = _hot_listing("saxpy", sass)
    assert hot.startswith("# saxpy") and hot.count("\n| 0x") == 20
