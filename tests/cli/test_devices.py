"""`python -m app.kernel devices` and finding conf/devices.json in a checkout or an installed copy."""
import json

import pytest

from app.analysis.devices import candidate_paths, describe, load_devices
from app.kernel.cli import main


def test_lists_every_model_with_its_peaks(capsys):
    assert main(["devices", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    table = load_devices(doc["file"])
    assert [r["model"] for r in doc["devices"]] == list(table["devices"])
    h200 = next(r for r in doc["devices"] if r["model"] == "H200")
    assert h200["memory_gbps"] == table["devices"]["H200"]["memory_gbps"] and h200["peaks"] == "datasheet"
    assert main(["devices"]) == 0
    out = capsys.readouterr().out
    assert "fp64 TFLOP/s" in out
    # every digit of the table: L40S's fp64 peak is 1.431, not "1.4"
    for model, spec in table["devices"].items():
        line = next(x for x in out.splitlines() if x[2:].startswith(model + " "))
        assert f"{spec['peak_tflops']['fp64']:,.10g}" in line.split()[-7:], (model, line)


@pytest.mark.parametrize("name,marked,fragment", [
    ("NVIDIA H200", "H200", "matches 'H200'"),
    ("NVIDIA H100 PCIe", "H100 PCIe", "matches 'H100 PCIe'"),
    ("NVIDIA B200", None, "matches no entry: it still profiles"),
    (None, None, "No usable GPU here"),
])
def test_the_present_gpu_is_marked(name, marked, fragment):
    rows, line = describe(name)
    assert [r["model"] for r in rows if r["present"]] == ([marked] if marked else [])
    assert fragment in line


def test_installed_copy_is_looked_for(monkeypatch):
    monkeypatch.delenv("APP_DEVICES_JSON", raising=False)
    paths = [str(p) for p in candidate_paths()]
    assert paths[0].endswith("conf/devices.json")
    assert any(p.endswith("share/app-kernel-rails/devices.json") for p in paths[1:])


@pytest.mark.parametrize("content,fragment", [
    (None, "conf/devices.json was not found"),
    ("{broken", "is not a readable devices table"),
])
def test_missing_or_broken_table_is_one_line(tmp_path, monkeypatch, capsys, content, fragment):
    p = tmp_path / "devices.json"
    if content is not None:
        p.write_text(content)
    monkeypatch.setenv("APP_DEVICES_JSON", str(p))
    load_devices.cache_clear()
    try:
        assert main(["devices"]) == 2
    finally:
        load_devices.cache_clear()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and fragment in err[0]
