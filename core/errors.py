"""The one error type for bad user input, and the value checks every config field uses."""

from typing import Any


class ConfigError(ValueError):
    """Bad user input (a config value, a data path, a corrupt file).

    The message is one line that names the field or path and says what is allowed. `run.py`
    prints it without a traceback and exits with status 2, before any process group starts.
    """


def check_int(value: Any, field: str, low: int = 1, high: int | None = None) -> int:
    """``value`` as an int >= ``low`` (and <= ``high``), or a ConfigError naming ``field``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (
            high is not None and value > high):
        allowed = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ConfigError(f"{field}: expected an integer {allowed}, got {value!r}")
    return int(value)


def check_ratio(value: Any, field: str) -> float:
    """``value`` as a float in (0, 1], or a ConfigError naming ``field``."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise ConfigError(f"{field}: expected a number in (0, 1], got {value!r}")
    return float(value)


def check_bool(value: Any, field: str) -> bool:
    """``value`` if it is a bool, or a ConfigError naming ``field``."""
    if not isinstance(value, bool):
        raise ConfigError(f"{field}: expected true or false, got {value!r}")
    return value


def check_choice(value: Any, field: str, choices: tuple[str, ...]) -> str:
    """``value`` if it is one of ``choices``, or a ConfigError naming ``field``."""
    if value not in choices:
        raise ConfigError(f"{field}: expected one of {list(choices)}, got {value!r}")
    return value


def check_number(value: Any, field: str, low: float | None = None, high: float | None = None,
                 low_open: bool = False, high_open: bool = False) -> float:
    """``value`` as a float within [low, high] (``low_open`` / ``high_open``: excluding that
    end; None: unbounded), or a ConfigError naming ``field``. NaN and inf are never accepted."""
    ok = (not isinstance(value, bool) and isinstance(value, int | float)
          and abs(value) < float("inf"))
    if ok and low is not None:
        ok = value > low if low_open else value >= low
    if ok and high is not None:
        ok = value < high if high_open else value <= high
    if not ok:
        lo = "(-inf" if low is None else f"{'(' if low_open else '['}{low:g}"
        hi = "inf)" if high is None else f"{high:g}{')' if high_open else ']'}"
        raise ConfigError(f"{field}: expected a number in {lo}, {hi}, got {value!r}")
    return float(value)


def check_int_list(value: Any, field: str, length: int | None = None, low: int = 1) -> list[int]:
    """``value`` as a list of integers >= ``low`` (of ``length`` items if given), or a
    ConfigError naming ``field``."""
    items = list(value) if isinstance(value, list | tuple) or _is_list_node(value) else None
    if items is None or (length is not None and len(items) != length) or any(
            isinstance(v, bool) or not isinstance(v, int) or v < low for v in items):
        size = f"{length} " if length is not None else ""
        raise ConfigError(f"{field}: expected a list of {size}integers >= {low}, got {value!r}")
    return items


def check_str(value: Any, field: str, optional: bool = False, max_length: int | None = None
              ) -> str | None:
    """``value`` if it is a string (at most ``max_length`` characters; None too if
    ``optional``), or a ConfigError naming ``field``."""
    if value is None and optional:
        return None
    if not isinstance(value, str) or (max_length is not None and len(value) > max_length):
        limit = f" of at most {max_length} characters" if max_length is not None else ""
        null = " or null" if optional else ""
        raise ConfigError(f"{field}: expected a string{limit}{null}, got {value!r}")
    return value


def _is_list_node(value: Any) -> bool:
    """An omegaconf ListConfig (imported lazily: this module imports nothing else)."""
    return type(value).__name__ == "ListConfig"
