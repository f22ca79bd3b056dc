"""The few errors a user can meet. The CLI turns each into one line and an exit code."""
from __future__ import annotations

import argparse


class AppError(Exception):
    """Base class: the message is the one line the user sees; it names the fix."""

    exit_code = 2


class BadParameter(AppError):
    """Unknown kernel, version, mode or parameter, or a value out of range."""

    exit_code = 2


class DeviceUnavailable(AppError):
    """An explicit device was asked for and cannot be used (never a silent fallback)."""

    exit_code = 3


class ProfileBusy(AppError):
    """Another profile holds the device lock (one profiling at a time per device)."""

    exit_code = 4


class LockUnusable(AppError):
    """The device lock's folder or file cannot be used safely (missing, foreign, a symbolic link)."""

    exit_code = 4


class OutputNotWritable(AppError):
    """The output folder cannot be created or written."""

    exit_code = 5


class ToolNotFound(AppError):
    """ncu or nsys is missing."""

    exit_code = 6


class CounterPermission(AppError):
    """The profiler may not read GPU performance counters (ERR_NVGPUCTRPERM)."""

    exit_code = 7


class MalformedToolOutput(AppError):
    """A CSV export from ncu/nsys does not have the shape the column map expects."""

    exit_code = 8


class VerificationFailed(AppError):
    """The kernel's output differs from the oracle: the profile would time a wrong answer."""

    exit_code = 9


class VerificationCouldNotRun(VerificationFailed):
    """The oracle could not run: the output is unverified, neither a pass nor a mismatch (a VerificationFailed too,
    so a caller that refuses wrong answers refuses these)."""

    exit_code = 10


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so the same clean-up runs: child process groups are stopped,
    temporary folders removed, half-written profiles deleted."""


class OneLineParser(argparse.ArgumentParser):
    """argparse whose usage errors are the tool's one-line BadParameter (no usage dump, exit 2)."""

    def __init__(self, *args, help_command: str | None = None, **kwargs):
        self.help_command = help_command
        super().__init__(*args, **kwargs)

    def error(self, message):
        raise BadParameter(f"{message} (see {self.help_command or self.prog} --help)")
