"""scripts/profile_kernels.py prints one JSON document of real traces (seed 000's rail)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def rail(*args, tmp_path):
    env = dict(os.environ, APP_LOCK_DIR=str(tmp_path))
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "profile_kernels.py"), *args],
                          capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)


def test_all_kernels_one_json_document(tmp_path):
    r = rail("--kernel", "all", "--rows", "1500", "--repeat", "2", "--nvtx", "--device", "cpu", tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["kernel"] == "all" and doc["repeat"] == 2 and doc["nvtx_requested"] is True
    assert doc["rows"] == {"join": 1500, "overlay": 1500}
    assert [t["kernel"] for t in doc["traces"]] == ["join", "overlay"]
    for t in doc["traces"]:
        assert t["selected_runtime"] == "cpu" and t["metadata"]["planner_selected_runtime"] in ("cpu", "gpu")
        cats = {s["category"] for s in t["stages"]}
        assert {"setup", "sort", "filter", "refine"} <= cats
        for s in t["stages"]:
            assert {"name", "category", "device", "elapsed_seconds", "rows_in", "rows_out", "metadata"} <= set(s)
            assert s["spread"]["runs"] == 2
        assert t["metadata"]["nvtx"]["emitted"] is True
        assert t["metadata"]["verification"]["matches"] is True
    assert not list(tmp_path.glob("out"))   # the rail prints; it writes no profile


def test_rows_per_kernel_and_tile_size(tmp_path):
    r = rail("--kernel", "join", "--join-rows", "3000", "--tile-size", "128", "--repeat", "1", "--device", "cpu",
             tmp_path=tmp_path)
    doc = json.loads(r.stdout)
    (t,) = doc["traces"]
    assert t["metadata"]["params"]["points"] == 3000 and t["metadata"]["params"]["polygons"] == 300
    assert all(s["tiling"].get("block", 128) == 128 for s in t["stages"])


@pytest.mark.parametrize("args,fragment", [(["--tile-size", "100"], "is not allowed"),
                                           (["--repeat", "0"], "--repeat must be >= 1, got 0"),
                                           (["--rows", "0"], "--rows must be >= 1, got 0"),
                                           (["--overlay-rows", "-3"], "--overlay-rows must be >= 1, got -3"),
                                           (["--join-rows", "0"], "--join-rows must be >= 1, got 0"),
                                           (["--rows", "x"], "invalid int value")])
def test_bad_arguments_are_one_line(tmp_path, args, fragment):
    r = rail("--kernel", "join", "--rows", "10", *args, tmp_path=tmp_path)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().startswith("error: ") and fragment in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_help_speaks_to_users_and_names_every_default(tmp_path):
    r = rail("--help", tmp_path=tmp_path)
    assert r.returncode == 0
    assert r.stdout.splitlines()[0].startswith("usage: scripts/profile_kernels.py")
    assert "Profile the join and overlay kernels" in r.stdout and "seed" not in r.stdout and "rail" not in r.stdout
    for option in ("--kernel", "--rows", "--join-rows", "--overlay-rows", "--tile-size", "--repeat", "--nvtx",
                   "--device"):
        block = r.stdout.split(f"  {option}", 1)[1].split("\n  --", 1)[0]
        assert "default" in block, (option, block)
    assert "under 6" in r.stdout and "95% interval" in r.stdout
