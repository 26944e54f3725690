"""Every exception hookwatch raises on purpose; all derive from :class:`HookwatchError`."""

from __future__ import annotations


class HookwatchError(Exception):
    """Base class of every error hookwatch raises on purpose."""


class ConfigError(HookwatchError):
    """The monitoring configuration is invalid; raised once, at model load."""


class ProfileError(HookwatchError, ValueError):
    """A drift profile that cannot be used: wrong format, version, layers or width."""


class BadInputError(HookwatchError):
    """A client sent a request the model cannot take: maps to an HTTP 4xx.

    ``reason`` is one of ``hookwatch._names.REJECT_REASONS``: the reject counter's label.
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
