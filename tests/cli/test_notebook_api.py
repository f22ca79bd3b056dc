"""`from app.kernel import profile`: the notebook entry point runs the CLI's code path, returns
DataFrames, and writes nothing unless asked."""
import pytest

from app.errors import BadParameter
from app.kernel import profile


def test_profile_returns_tables_and_writes_nothing(tmp_path, monkeypatch):
    work = tmp_path / "work"                  # (tmp_path itself holds the test's device lock)
    work.mkdir()
    monkeypatch.chdir(work)
    p = profile("join", "v2", points=2000, polygons=200, device="cpu", bench_runs=3)
    assert list(work.iterdir()) == [] and p.path is None
    assert p.stages["stage"].tolist() == [s["name"] for s in p.trace["stages"]]
    assert (p.stages["elapsed_us"] > 0).all() and p.stages["rows_in"].iloc[0] == 2200
    assert p.trace["timing"]["timed_runs"] == 3 and p.report_md.startswith("# Profile: join v2")
    assert p.trace["metadata"]["verification"]["matches"] is True
    assert list(p.kernels.columns[:2]) == ["stage", "kernel"]          # CPU run: no compiled kernels


def test_profile_writes_the_cli_folder_when_asked(tmp_path):
    p = profile("overlay", left=300, right=300, device="cpu", bench_runs=2, out=str(tmp_path))
    assert p.path.is_dir() and (p.path / "report.md").read_text() == p.report_md
    assert p.path.parent.parent.parent.name == "event" and p.path.parent.parent.name == "overlay"


@pytest.mark.parametrize("kwargs,fragment", [
    ({"pointz": 10}, "'pointz': neither a parameter of join"),
    ({"points": -5}, "--points=-5 must be >="),
    ({"prof_type": "annotation", "bench_runs": 3}, "--bench_runs 3: annotation mode"),
])
def test_bad_arguments_are_refused_in_one_line(kwargs, fragment):
    with pytest.raises(BadParameter, match=fragment.replace("(", r"\(").replace("[", r"\[")):
        profile("join", device="cpu", **kwargs)
