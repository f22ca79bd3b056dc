"""Autotune cache logic with a fake timer: the search, the cache, reuse, --retune and --tiling."""
import json

import pytest

from app.errors import BadParameter
from app.kernel.cli import main
from app.kernel.plan import get_plan_class
from app.runtime import autotune
from app.runtime import device as devmod
from app.runtime.profiling.session import worker_command

JOIN = get_plan_class("join", "v2")
GPU = devmod.Selection("gpu", "gpu", "gpu", "declared by the test", "NVIDIA H200",
                       {"uuid": "GPU-1904f39e-c822-6777-12c4-cc5de708684c", "driver_version": "13.0"})
# What the fake timer rewards: block 128 in bounds, level bias -1 in morton_sort; everything else neutral.
GOOD = {("bounds", "block", 128): -0.2, ("morton_sort", "level_bias", -1): -0.3, ("output_sort", "block", 512): 0.4}


def fake_timer(calls):
    def measure(tiling):
        calls.append(json.loads(json.dumps(tiling)))
        total = 1.0 + sum(d for (stage, key, value), d in GOOD.items() if tiling[stage][key] == value)
        return total, {stage: total / 6 for stage in tiling}
    return measure


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("APP_CACHE_DIR", str(tmp_path / "cache"))


def test_search_finds_each_better_value_and_keeps_the_history():
    calls = []
    result = autotune.search(JOIN, JOIN().params, fake_timer(calls))
    assert result["best"]["bounds"]["block"] == 128 and result["best"]["morton_sort"]["level_bias"] == -1
    assert result["best"]["output_sort"]["block"] == 256                     # the slower value was not kept
    assert result["best_total_seconds"] == pytest.approx(0.5) and result["default_total_seconds"] == 1.0
    n_candidates = sum(len(v) - 1 for s in JOIN.stages for v in s.tunables.values())
    assert len(calls) == 1 + n_candidates and calls[0]["bounds"]["block"] == 256     # defaults measured first
    assert [h["tiling"]["block"] for h in result["history"]["bounds"]] == [256, 128, 512]


def test_cache_is_reused_retuned_and_overridden(monkeypatch):
    calls = []
    monkeypatch.setattr(autotune, "gpu_measure", lambda cls, params, sel: fake_timer(calls))
    tuned = autotune.resolve(JOIN(), GPU, autotune=True, retune=False, overrides=[])
    assert tuned.tiling["bounds"]["block"] == 128 and tuned.tiling_source["bounds"].startswith("search (this run)")
    searched = len(calls)
    again = autotune.resolve(JOIN(), GPU, autotune=False, retune=False, overrides=[])      # a later run, any mode
    assert len(calls) == searched and again.tiling == tuned.tiling
    assert again.tiling_source["bounds"].startswith("autotune cache")
    assert again.tiling_source["owned_buffer_build"] == "defaults (no tunables)"
    hand = autotune.resolve(JOIN(), GPU, autotune=False, retune=False, overrides=["bounds.block=512"])
    assert hand.tiling["bounds"]["block"] == 512 and hand.tiling_source["bounds"] == "caller (--tiling)"
    assert hand.tiling["morton_sort"]["level_bias"] == -1                     # the rest still from the cache
    autotune.resolve(JOIN(), GPU, autotune=False, retune=True, overrides=[])
    assert len(calls) == 2 * searched
    other = devmod.Selection("gpu", "gpu", "gpu", "t", "NVIDIA H200", GPU.info | {"uuid": "GPU-other"})
    assert autotune.resolve(JOIN(), other, autotune=False, retune=False, overrides=[]).tiling == JOIN().tiling
    files = autotune.tiling_files(again)
    assert files["tiling/bounds/autotuning.json"]["tried"][1]["tiling"] == {"block": 128}
    assert files["tiling/bounds.json"]["source"].startswith("autotune cache")


def test_a_cache_entry_that_no_longer_fits_the_plan_is_dropped_with_a_warning(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(autotune, "gpu_measure", lambda cls, params, sel: fake_timer(calls))
    autotune.resolve(JOIN(), GPU, autotune=True, retune=False, overrides=[])
    path = autotune.cache_path(autotune.cache_key(JOIN(), GPU))
    doc = json.loads(path.read_text())
    doc["best"]["bounds"]["block"] = 96                                       # not a value the stage offers
    path.write_text(json.dumps(doc))
    assert autotune.resolve(JOIN(), GPU, autotune=False, retune=False, overrides=[]).tiling == JOIN().tiling
    assert "no longer has" in capsys.readouterr().err
    doc["best"]["bounds"]["block"], doc["sources"] = 128, "0" * 16          # searched with other kernel sources
    path.write_text(json.dumps(doc))
    assert autotune.resolve(JOIN(), GPU, autotune=False, retune=False, overrides=[]).tiling == JOIN().tiling
    assert "searched with other kernel sources" in capsys.readouterr().err
    path.write_text("{torn")
    entry, why = autotune.load(autotune.cache_key(JOIN(), GPU), JOIN)
    assert entry is None and "unreadable" in why


@pytest.mark.parametrize("change, fragment", [
    (lambda d: d.pop("measured_at"), "has no 'measured_at'"),
    (lambda d: d.pop("method"), "has no 'method'"),
    (lambda d: d.pop("best_total_seconds"), "has no 'best_total_seconds'"),
    (lambda d: d.update(measured_at=None), "'measured_at' has the wrong type"),
    (lambda d: d["best"]["bounds"].update(block=128.0), "no longer has"),       # a float is not the int 128
    (lambda d: d["best"]["bounds"].update(block=True), "no longer has"),
])
def test_an_incomplete_or_inexact_cache_entry_is_dropped_with_a_warning(monkeypatch, capsys, change, fragment):
    monkeypatch.setattr(autotune, "gpu_measure", lambda cls, params, sel: fake_timer([]))
    autotune.resolve(JOIN(), GPU, autotune=True, retune=False, overrides=[])
    path = autotune.cache_path(autotune.cache_key(JOIN(), GPU))
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))
    capsys.readouterr()
    tuned = autotune.resolve(JOIN(), GPU, autotune=False, retune=False, overrides=[])
    assert tuned.tiling == JOIN().tiling and tuned.tiling_source["bounds"] == "defaults"
    assert "autotune cache entry dropped" in (err := capsys.readouterr().err) and fragment in err, err


def test_failing_or_wrong_configurations_are_recorded_never_chosen():
    def measure(tiling):
        if tiling["bounds"]["block"] == 128:
            raise RuntimeError("CUDA_ERROR_INVALID_VALUE: too many resources requested for launch")
        if tiling["output_sort"]["block"] == 512:
            return 0.1, {}, False                     # fastest of all, but the oracle rejects its output
        return 1.0 - 0.1 * (tiling["morton_sort"]["block"] == 512), {}
    result = autotune.search(JOIN, JOIN().params, measure)
    assert result["best"]["bounds"]["block"] == 256 and result["best"]["output_sort"]["block"] == 256
    assert result["best"]["morton_sort"]["block"] == 512
    notes = [h.get("note", "") for h in result["history"]["bounds"] + result["history"]["output_sort"]]
    assert any(n.startswith("failed: RuntimeError: CUDA_ERROR_INVALID_VALUE") for n in notes)
    assert "rejected: the output differs from the oracle's" in notes
    with pytest.raises(BadParameter, match="the default configuration itself failed"):
        autotune.search(JOIN, JOIN().params, lambda tiling: 1 / 0)


@pytest.mark.parametrize("item,fragment", [("bounds.block", "expected STAGE.KEY=VALUE"),
                                           ("nope.block=128", "no stage 'nope'"),
                                           ("bounds.block=100", "must be one of 256, 128, 512"),
                                           ("bounds.block=big", "block expects int")])
def test_bad_overrides_are_one_line(item, fragment):
    with pytest.raises(BadParameter, match=fragment):
        autotune.parse_overrides([item], JOIN)


def test_tiling_reaches_the_worker_and_the_profile(tmp_path):
    plan = JOIN({}, {"bounds": {"block": 128}})
    cmd = worker_command(plan, "w.json", 1)
    assert json.loads(cmd[cmd.index("--worker-tiling") + 1])["bounds"] == {"block": 128}
    out = tmp_path / "out"
    assert main(["join", "v2", "--points", "2000", "--polygons", "200", "--device", "cpu", "--bench_runs", "2",
                 "--tiling", "bounds.block=128", "--out", str(out), "--worker", str(tmp_path / "w.json"),
                 "--worker-tiling", json.dumps(plan.tiling)]) == 0
    assert json.loads((tmp_path / "w.json").read_text())["tiling"]["bounds"] == {"block": 128}


def test_the_cache_follows_the_launch_code_and_the_kernels_own_headers(tmp_path):
    """A tiling searched with other launch code (gpu.py chooses grids) or another kernel header is not this code's:
    the hash that keys the cache changes with either."""
    import shutil
    from pathlib import Path

    from app.kernel.plan import get_plan_class
    from app.runtime.autotune import sources_hash

    src = Path(__file__).resolve().parents[2] / "src" / "app" / "kernel"
    copy = tmp_path / "kernel"
    shutil.copytree(src, copy, ignore=shutil.ignore_patterns("__pycache__"))
    plan_cls = get_plan_class("join", "v4")
    first = sources_hash(plan_cls, copy)
    assert first == sources_hash(plan_cls) and first == sources_hash(plan_cls, copy)
    (copy / "join" / "gpu.py").write_text((copy / "join" / "gpu.py").read_text() + "\n# another grid choice\n")
    second = sources_hash(plan_cls, copy)
    (copy / "join" / "extra.cuh").write_text("// a header of the join's own\n")
    third = sources_hash(plan_cls, copy)
    assert len({first, second, third}) == 3
    (copy / "overlay" / "gpu.py").write_text("# another kernel's launch code\n")
    assert sources_hash(plan_cls, copy) == third                  # another kernel's code leaves the join's cache be
