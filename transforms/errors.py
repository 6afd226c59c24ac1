"""Errors that several rooms raise (kept apart so that no two modules import each other for them)."""


class ConfigError(ValueError):
    """A setting has a value Eventide cannot use. The message names the variable and what is expected."""
