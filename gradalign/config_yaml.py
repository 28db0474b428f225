"""Config files as YAML: safe and strict (no aliases, no duplicate keys, `1e-3` a float)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from .errors import BadInput, shown
from .paths import is_stream


class _StrictLoader(yaml.SafeLoader):
    """Safe YAML with no surprises: no aliases (an alias bomb expands to gigabytes), no duplicate
    keys (the last would silently win), and `1e-3` read as the float it means (YAML 1.1 wants a
    dot)."""

    def compose_node(self, parent, index):  # type: ignore[no-untyped-def]
        if self.check_event(yaml.events.AliasEvent):
            mark = self.peek_event().start_mark
            raise yaml.constructor.ConstructorError(
                None, None, "aliases (*name) are not allowed in a gradalign config", mark
            )
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):  # type: ignore[no-untyped-def]
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, str | int | float | bool):
                continue  # unhashable keys are refused by the base class
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {shown(key)}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep)


_StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)
MAX_CONFIG_BYTES = 1 << 20


def read_yaml(path: Path) -> dict[str, Any]:
    """A config file's top-level mapping (safe, strict YAML; see _StrictLoader)."""
    try:
        if path.stat().st_size > MAX_CONFIG_BYTES:
            raise BadInput(f"{path}: a config file of over 1 MiB is not a config")
        if is_stream(path):
            raise BadInput(f"{path}: not a regular file (a device or a pipe), not a config file")
        text = path.read_text()
    except FileNotFoundError:
        raise BadInput(f"{path}: no such config file") from None
    except IsADirectoryError:
        raise BadInput(f"{path}: is a directory, not a config file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"{path}: cannot read config ({shown(str(exc), 120)})") from None
    try:
        data = yaml.load(text, Loader=_StrictLoader)
    except RecursionError:
        raise BadInput(f"{path}: YAML nested too deeply") from None
    except ValueError as exc:  # an integer of over 4300 digits: Python refuses to convert it
        raise BadInput(f"{path}: not a config value ({shown(str(exc), 80)})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None)
        why = f": {problem[:80]}" if isinstance(problem, str) else ""
        raise BadInput(f"{path}: not valid YAML{line}{why}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise BadInput(f"{path}: a config must be a mapping of keys to values")
    return data
