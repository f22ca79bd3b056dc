"""A fake nvidia-smi for tests: logs its argv, answers --query-gpu with CSV as the real one
prints it (``--format=csv,noheader,nounits``), keeps locked clocks in files beside its log,
and fails or lacks features on request. Never a real nvidia-smi.

Environment (all optional but FAKE_SMI_LOG):
  FAKE_SMI_LOG        where argv lines go (JSON); <log>.locked / <log>.memlocked hold the locks
  FAKE_SMI_FAIL       an argument that makes the call fail (exit 4, "Insufficient Permissions")
  FAKE_SMI_NO_LMC     -lmc/-rmc answer "not supported" and exit with this status (e.g. 3 or 0)
  FAKE_SMI_OLD_DRIVER clocks_event_reasons.* is an unknown field (older drivers: clocks_throttle_reasons.*)
  FAKE_SMI_UUID, FAKE_SMI_SM, FAKE_SMI_MEM, FAKE_SMI_MAX, FAKE_SMI_MAX_MEM, FAKE_SMI_APP,
  FAKE_SMI_DEFAULT_APP, FAKE_SMI_APP_MEM, FAKE_SMI_DEFAULT_APP_MEM, FAKE_SMI_REASONS: the values
"""
from __future__ import annotations

import sys
from pathlib import Path

UUID = "GPU-1904f39e-c822-6777-12c4-cc5de708684c"

SOURCE = """\
#!{python}
import json, os, sys

args = sys.argv[1:]
env = os.environ
with open(env["FAKE_SMI_LOG"], "a") as f:
    f.write(json.dumps(args) + "\\n")

fail = env.get("FAKE_SMI_FAIL")
if fail and fail in args:
    print("Insufficient Permissions")
    print("Terminating early due to previous errors.", file=sys.stderr)
    sys.exit(4)

locked = env["FAKE_SMI_LOG"] + ".locked"
memlocked = env["FAKE_SMI_LOG"] + ".memlocked"
def read(path, default):
    return open(path).read() if os.path.exists(path) else default

values = {{
    "uuid": env.get("FAKE_SMI_UUID", "{uuid}"),
    "name": "NVIDIA H100 80GB HBM3",
    "clocks.max.sm": env.get("FAKE_SMI_MAX", "1980"),
    "clocks.max.mem": env.get("FAKE_SMI_MAX_MEM", "2619"),
    "clocks.applications.graphics": env.get("FAKE_SMI_APP", "1755"),
    "clocks.default_applications.graphics": env.get("FAKE_SMI_DEFAULT_APP", "1755"),
    "clocks.applications.memory": env.get("FAKE_SMI_APP_MEM", "2619"),
    "clocks.default_applications.memory": env.get("FAKE_SMI_DEFAULT_APP_MEM", "2619"),
    "clocks.sm": env.get("FAKE_SMI_SM") or read(locked, "345"),
    "clocks.mem": env.get("FAKE_SMI_MEM") or read(memlocked, "2619"),
    "clocks_event_reasons.active": env.get("FAKE_SMI_REASONS", "0x0000000000000001"),
    "clocks_throttle_reasons.active": env.get("FAKE_SMI_REASONS", "0x0000000000000001"),
}}
query = [a.split("=", 1)[1] for a in args if a.startswith("--query-gpu=")]
unsupported = "Setting locked memory clocks is not supported for GPU 00000000:19:00.0.\\nTreating as warning and moving on."
if query:
    fields = query[0].split(",")
    if env.get("FAKE_SMI_OLD_DRIVER") and "clocks_event_reasons.active" in fields:
        print('Field "clocks_event_reasons.active" is not a valid field to query.')
        sys.exit(2)
    print(", ".join(values[k] for k in fields))
elif "-lgc" in args:
    with open(locked, "w") as f:
        f.write(args[args.index("-lgc") + 1].split(",")[0])
elif "-rgc" in args and os.path.exists(locked):
    os.remove(locked)
elif ("-lmc" in args or "-rmc" in args) and env.get("FAKE_SMI_NO_LMC"):
    print(unsupported)
    sys.exit(int(env["FAKE_SMI_NO_LMC"]))
elif "-lmc" in args:
    with open(memlocked, "w") as f:
        f.write(args[args.index("-lmc") + 1].split(",")[0])
elif "-rmc" in args and os.path.exists(memlocked):
    os.remove(memlocked)
"""


def install(folder: Path) -> Path:
    """Write the fake as ``folder/nvidia-smi`` (executable) and return its path."""
    folder.mkdir(parents=True, exist_ok=True)
    fake = folder / "nvidia-smi"
    fake.write_text(SOURCE.format(python=sys.executable, uuid=UUID))
    fake.chmod(0o755)
    return fake


def use(tmp_path: Path, monkeypatch) -> Path:
    """Make the fake the only clock source of this test (a real NVML must not answer); its log path."""
    fake = install(tmp_path / "bin")
    monkeypatch.setenv("NVIDIA_SMI", str(fake))
    monkeypatch.setenv("FAKE_SMI_LOG", str(tmp_path / "smi.log"))
    monkeypatch.setenv("APP_GPU_CLOCKS", "nvidia-smi")
    return tmp_path / "smi.log"
