"""params.json's host block records the glibc tunables the process started with: they change the build's time."""
from app.runtime.provenance import host_info


def test_host_info_records_the_glibc_tunables_the_process_runs_with(monkeypatch):
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.cpu.x86_non_temporal_threshold=0x100000")
    assert host_info()["glibc_tunables"] == "glibc.cpu.x86_non_temporal_threshold=0x100000"
    monkeypatch.delenv("GLIBC_TUNABLES")
    info = host_info()
    assert info["glibc_tunables"] is None and info["hostname"] and info["platform"]
