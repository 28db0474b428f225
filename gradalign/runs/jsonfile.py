"""JSON as gradalign reads it from files people may edit (manifests, golden files, tensor
headers): strict JSON, so `NaN` and `Infinity` are refused; a key written twice is refused,
never resolved silently to whichever came last; a byte-order mark an editor added is read past."""

from __future__ import annotations

import json
from typing import Any


class DuplicateKey(ValueError):
    """An object that holds one key twice; `key` is that key."""

    def __init__(self, key: str) -> None:
        super().__init__(f"the key {key!r} appears twice in one object")
        self.key = key


class NotStrict(ValueError):
    """`NaN`, `Infinity` or `-Infinity`: Python's json reads them, strict JSON has no such
    number; `constant` is the word found."""

    def __init__(self, constant: str) -> None:
        super().__init__(f"{constant} is not a number in strict JSON")
        self.constant = constant


def refuse_constant(name: str) -> None:
    """`parse_constant` that refuses what strict JSON lacks."""
    raise NotStrict(name)


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """`object_pairs_hook` that refuses a repeated key (json's own default keeps the last)."""
    found: dict[str, Any] = {}
    for key, value in pairs:
        if key in found:
            raise DuplicateKey(key)
        found[key] = value
    return found


def loads(text: str | bytes, **options: Any) -> Any:
    """`json.loads` that raises DuplicateKey (a ValueError) for a key written twice and NotStrict
    (a ValueError) for `NaN` or `Infinity`, and reads a text that an editor saved with a UTF-8
    byte-order mark (json refuses it; YAML does not)."""
    if isinstance(text, str):
        text = text.removeprefix("\ufeff")
    elif isinstance(text, bytes):
        text = text.removeprefix(b"\xef\xbb\xbf")
    options.setdefault("parse_constant", refuse_constant)
    return json.loads(text, object_pairs_hook=unique_keys, **options)
