"""Render report sections (plain data: title, text, columns/rows, items, note) with jinja2."""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field
from pathlib import Path

import jinja2

from app.analysis.advice import two_digits

_ENV = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
                          trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)


@dataclass
class Section:
    title: str | None = None
    text: str | None = None
    columns: list[str] = field(default_factory=list)
    rows: list[list] = field(default_factory=list)
    items: list[str] = field(default_factory=list)
    note: str | None = None


def render(kernel: str, version: str, headline: str, sections: list[Section]) -> str:
    return _ENV.get_template("report.md.j2").render(kernel=kernel, version=version,
                                                     headline=headline, sections=sections)


def fmt_reading(v, digits: int = 1) -> str:
    """As fmt, but a reading with fewer than two significant digits at ``digits`` decimals keeps two instead:
    never read as zero (init_run's 8 FLOPs in 1.8 us are 4.5e-06 TFLOP/s, not 0.0000), nor rounded to nearly
    twice itself (waves/SM 0.05 read 0.1): the rounding stays within 5% of the reading."""
    if isinstance(v, float) and math.isfinite(v) and 0 < abs(v) < 10 ** (1 - digits):
        return two_digits(v)
    return fmt(v, digits)


def fmt_pct(v) -> str:
    """A share of a peak (or a small ratio, as FLOP/byte) to one decimal, as fmt_reading gives it: a reading under
    1 keeps two significant digits; "n/a" where there is no reading."""
    return fmt_reading(float(v), 1) if isinstance(v, numbers.Real) and not isinstance(v, bool) else "n/a"


def fmt(v, digits: int = 1, suffix: str = "") -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        # A missing reading (NaN) reads "n/a", never "nan".
        return f"{v:,.{digits}f}{suffix}" if math.isfinite(v) else "n/a"
    if isinstance(v, int):
        return f"{v:,}{suffix}"
    return f"{v}{suffix}"


def us(seconds) -> str:
    return fmt(seconds * 1e6 if seconds is not None else None, 1)
