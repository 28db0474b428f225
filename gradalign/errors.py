"""Errors that the CLI turns into a one-line message and exit code 2, and how values are shown in
such messages."""

from __future__ import annotations

from typing import Any


class BadInput(Exception):
    """Input the tool cannot work with: a missing or corrupt run, bad options, incompatible runs."""


def shown(value: Any, limit: int = 60) -> str:
    """A value for an error message, never longer than `limit` characters (a hostile input must
    not make the message itself huge)."""
    text = repr(value) if not isinstance(value, dict | list | tuple) else type(value).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."
