"""Checks shared by the sections of a sweep spec: each raises ConfigError naming the key and the fix.

check_keys(section, ("fractions", "max_checkpoints"), "cooldowns")   # unknown key -> a suggestion
number(value, "cooldowns.fractions[0]")                              # a finite number > 0
as_list(value, "cooldowns.fractions")                                # a non-empty YAML list
"""

from __future__ import annotations

import difflib
import math
from typing import Any

from scalelab.errors import ConfigError


def unknown_key(key: str, known) -> ConfigError:
    close = difflib.get_close_matches(key.split(".")[-1], list(known), n=1)
    hint = f"did you mean '{close[0]}'?" if close else f"known keys: {', '.join(known)}"
    return ConfigError(key, "unknown key", hint)


def check_keys(section: dict, known, prefix: str) -> None:
    if not isinstance(section, dict):
        raise ConfigError(prefix, f"expected a mapping, got {section!r}", "write it as a YAML mapping")
    for key in section:
        if key not in known:
            raise unknown_key(f"{prefix}.{key}" if prefix else str(key), known)


def number(value: Any, key: str, *, positive: bool = True, example: str = "1e12") -> float:
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ConfigError(key, f"{value!r} is not a number", f"write a number, e.g. {example}") from None
    if not math.isfinite(x) or (positive and x <= 0):
        raise ConfigError(key, f"{value!r} must be a finite number > 0", f"e.g. {example}")
    return x


def as_list(value: Any, key: str, *, min_len: int = 1) -> list:
    if not isinstance(value, list) or len(value) < min_len:
        raise ConfigError(key, f"expected a list of at least {min_len} value(s), got {value!r}", "write a YAML list")
    return value
