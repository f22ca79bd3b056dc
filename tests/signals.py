"""For tests that send SIGINT to a child: start the child with SIGINT at its default, as a terminal's foreground
job has it.

A test suite started in the background by a non-interactive shell (`pytest ... &`, `nohup ... &`) inherits
SIGINT ignored, and Python then leaves it ignored in every child it starts. A Ctrl-C test would then fail on how
the suite was launched, not on the code: the child never sees its signal. Pass ``preexec_fn=sigint_default`` to
subprocess.Popen.
"""
import signal


def sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
