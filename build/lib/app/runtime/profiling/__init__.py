"""Profiling modes. Each mode implements ``Mode.profile``; MODES maps --prof_type to it."""
from app.runtime.profiling.base import MODES, Mode, ProfileOptions, Profile, get_mode  # noqa: F401
