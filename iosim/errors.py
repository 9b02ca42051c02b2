"""One error type for everything a user can get wrong, with a one-line message.

The CLI prints `IosimError` messages as they are and exits 2; pydantic's multi-line reports are folded into
one line by `one_line` so a bad value is named with its field and the rule it broke.
"""
from __future__ import annotations

from pydantic import ValidationError


class IosimError(ValueError):
    """Bad input from a user: a profile file, a config, a tiling, a flag."""


def one_line(err: ValidationError, where: str = "") -> str:
    """Fold a pydantic ValidationError into '<where>: field 'x' = v: rule' (first error, count of the rest)."""
    errs = err.errors(include_url=False)
    first = errs[0]
    field = ".".join(str(p) for p in first["loc"])
    msg = first["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    if field:
        text = f"field '{field}'"
        if "input" in first and not isinstance(first["input"], dict):
            text += f" = {first['input']!r}"
        text += f": {msg}"
    else:  # a rule across fields: its message names them
        text = msg
    if len(errs) > 1:
        text += f" (and {len(errs) - 1} more error{'s' if len(errs) > 2 else ''})"
    return f"{where}: {text}" if where else text
