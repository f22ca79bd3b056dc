"""What the Dask workers a sweep starts itself (--cluster local, local-cuda) do beyond Dask's own start-up.

A Ctrl-C in a terminal sends SIGINT to the whole process group: the sweep, its workers and their
profile children. The sweep stops the cluster itself and keeps every finished point; a worker that
took the signal too would die printing a KeyboardInterrupt traceback from inside Dask, which says
nothing to the user. So the workers ignore SIGINT and are shut down by the sweep; a point's profile
child gets SIGINT back (``point.child_sigint``), so it stops on a Ctrl-C as a profile run by hand does.
Workers of a scheduler given by address are the user's own, in another process group, and untouched.

Imported only where Dask is installed.
"""
from __future__ import annotations

import signal

from distributed import WorkerPlugin


class IgnoreSigint(WorkerPlugin):
    name = "app-sweep-ignore-sigint"
    idempotent = True

    def setup(self, worker):
        from app.sweep import point

        try:
            signal.signal(signal.SIGINT, signal.SIG_IGN)   # a nanny's worker runs its event loop in its main thread
        except ValueError:                                  # not the main thread: leave the worker as Dask made it
            return
        point.restore_sigint_in_children()
