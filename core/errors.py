"""The one error type for bad user input, and the value checks every config field uses."""

from typing import Any


class ConfigError(ValueError):
    """Bad user input (a config value, a data path, a corrupt file).

    The message is one line that names the field or path and says what is allowed. `run.py`
    prints it without a traceback and exits with status 2, before any process group starts.
    """


def check_int(value: Any, field: str, low: int = 1) -> int:
    """``value`` as an int >= ``low``, or a ConfigError naming ``field``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"{field}: expected an integer >= {low}, got {value!r}")
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
