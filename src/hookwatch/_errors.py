"""Every exception hookwatch raises on purpose; all derive from :class:`HookwatchError`.

::

    HookwatchError
    ├── ConfigError            the monitoring setup cannot be used (raised at model load)
    │   └── ProfileError       its drift profile cannot be used (also a ValueError)
    └── BadInputError          a client's request the model cannot take (an HTTP 4xx)
"""

from __future__ import annotations


class HookwatchError(Exception):
    """Base class of every error hookwatch raises on purpose.

    Catch it to catch them all::

        try:
            monitor = hookwatch.watch(model, config, "digits", profile="drift-profile.npz")
        except hookwatch.HookwatchError as error:
            print(f"not monitored: {error}")
    """


class ConfigError(HookwatchError):
    """The monitoring configuration is invalid; raised once, at model load, with what was
    expected and what came::

        try:
            config = hookwatch.MonitoringConfig.from_mapping({"sample_rate": 2.0})
        except hookwatch.ConfigError as error:
            print(error)
    """


class ProfileError(ConfigError, ValueError):
    """A drift profile that cannot be used: wrong format, version, layers or width.

    A :class:`ConfigError` (the profile is part of the monitoring setup, and fails the same
    load), and a :class:`ValueError` as it always was::

        try:
            profile = hookwatch.DriftProfile.load("drift-profile.npz")
        except hookwatch.ProfileError as error:
            print(f"rebuild the profile: {error}")
    """


class BadInputError(HookwatchError):
    """A client sent a request the model cannot take: maps to an HTTP 4xx.

    ``reason`` is one of ``hookwatch._names.REJECT_REASONS``: the reject counter's label::

        raise hookwatch.BadInputError("a JSON list of 4 numbers", "3 numbers", 400, "wrong_shape")
    """

    def __init__(
        self, expected: str, got: str, status: int = 400, reason: str = "unreadable"
    ) -> None:
        self.expected = expected
        self.got = got
        self.status = status
        self.reason = reason
        super().__init__(f"expected {expected}, got {got}")

    def as_dict(self) -> dict[str, str | int]:
        return {
            "error": "bad input",
            "code": self.status,
            "expected": self.expected,
            "got": self.got,
        }


for _public in (HookwatchError, ConfigError, ProfileError, BadInputError):
    _public.__module__ = "hookwatch"  # tracebacks say hookwatch.ConfigError
del _public


#: TorchScript's interpreter opens every error it re-raises with this line; the cause (the
#: model's own exception, ``builtins.ValueError: ...``) is the message's last line.
_TORCHSCRIPT = "The following operation failed in the TorchScript interpreter."


def error_line(error: BaseException) -> str:
    """The line of an exception's message that says what went wrong: the first, or the last
    for an error a TorchScript model raised; empty for an empty message."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if not lines:
        return ""
    return lines[-1] if lines[0] == _TORCHSCRIPT else lines[0]
