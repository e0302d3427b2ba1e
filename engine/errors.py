"""The one error type for bad user input."""


class ConfigError(ValueError):
    """Bad user input (a config value, a data path, a corrupt file).

    The message is one line that names the field or path and says what is allowed. `run.py`
    prints it without a traceback and exits with status 2, before any process group starts.
    """
