"""Errors that the CLI turns into a one-line message and exit code 2."""

from __future__ import annotations


class BadInput(Exception):
    """Input the tool cannot work with: a missing or corrupt run, bad options, incompatible runs."""
