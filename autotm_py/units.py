"""Units: `--ratio F:S` (fast:slow capacity), byte sizes (`--fast-mem 16GiB`), and printing
sizes. On the ground floor: the config, the memory systems and every face use them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction

from autotm_py.errors import ConfigError

_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
    "t": 10**12, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}


@dataclass(frozen=True)
class Ratio:
    """fast:slow capacity. The fast budget is fast/(fast+slow) of the unconstrained peak."""

    fast: Fraction
    slow: Fraction

    @property
    def fast_fraction(self) -> Fraction:
        return self.fast / (self.fast + self.slow)

    def __str__(self) -> str:
        return f"{_fmt(self.fast)}:{_fmt(self.slow)}"

    def budget(self, peak_bytes: int) -> int:
        return int(peak_bytes * self.fast_fraction)


def _fmt(x: Fraction) -> str:
    return str(x.numerator) if x.denominator == 1 else f"{float(x):g}"


def parse_ratio(text: str, *, flag: str = "--ratio") -> Ratio:
    """'1:4' -> fast 1, slow 4 (fast tier holds 1/5 of the peak). '1:0' all fast, '0:1' all slow."""
    parts = text.strip().split(":")
    try:
        if len(parts) != 2:
            raise ValueError
        fast, slow = Fraction(parts[0]), Fraction(parts[1])
    except (ValueError, ZeroDivisionError):
        raise ConfigError(f"{flag} {text!r}: expected FAST:SLOW with non-negative numbers, "
                          "e.g. 1:4 (fast tier holds 1/5 of the peak), 1:0 all fast") from None
    if fast < 0 or slow < 0 or fast + slow == 0:
        raise ConfigError(f"{flag} {text!r}: both parts must be >= 0 and not both 0")
    return Ratio(fast, slow)


def parse_bytes(text: str, *, flag: str = "--fast-mem") -> int:
    """'16GiB', '1.5e9', '512MB' -> bytes (SI units are powers of 10, IEC units powers of 2)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*", text)
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _UNITS:
        raise ConfigError(f"{flag} {text!r}: expected a size like 16GiB, 512MB or 2e9")
    value = float(m.group(1)) * _UNITS[unit]
    if value < 0:
        raise ConfigError(f"{flag} {text!r}: must not be negative")
    return int(value)


def format_bytes(n: float) -> str:
    """Human-readable IEC size: 1536 -> '1.50 KiB'."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{int(n)} B"
