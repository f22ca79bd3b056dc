"""Running a test's second process as another user (nobody, uid 65534): what two users sharing a lock folder or a
GPU need, tested with a real second user rather than a mock."""
import os
import shutil
import subprocess
import sys
from tests.conftest import child_env

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def can_be_nobody() -> bool:
    """Root with setpriv, and nobody can import this project: else the tests that need a second user skip."""
    if os.geteuid() != 0 or not shutil.which("setpriv"):
        return False
    return subprocess.run([*NOBODY, sys.executable, "-c", "import app.runtime.lock"], capture_output=True,
                          env=child_env(), timeout=30).returncode == 0
