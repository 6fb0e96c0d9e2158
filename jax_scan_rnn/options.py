"""One source for every option: a dataclass field holds its name, default, bounds or choices and help; the
checks and the command line are generated from it.

    @dataclass(frozen=True)
    class Task:
        hidden_size: int = option(32, "H of every LSTM layer", lo=1)
        objective: str = option("utility", "what to optimise", choices=("utility", "mse"))

        def __post_init__(self):
            check(self)                     # ValueError "hidden_size: expected an int >= 1, got 0"

    add_arguments(parser, Task)             # --hidden-size N, --objective {utility,mse}, with help and default
    task = from_args(Task, args)

A small generator over argparse rather than a library (tyro, simple-parsing): it adds no dependency, and
the CLI's contract (a bad value exits 2 with one line naming the flag) comes from the same checks the
library runs, instead of from a second set of argparse types.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import typing
from typing import Any

from jax_scan_rnn import validate


def option(default: Any = dataclasses.MISSING, help: str = "", *, lo: float | None = None, hi: float | None = None,
           lo_open: bool = False, hi_open: bool = False, choices: tuple | None = None, flag: str | None = None,
           none: str = "off", metavar: str | None = None) -> Any:
    """A dataclass field with what `check` and `add_arguments` need. `flag` replaces `--field-name`; `none` is
    what a None default means, as the help's "(default: ...)" says it; `metavar` names the value in the help
    (`--data FILE`; by default N for an int, X for a float, the field name's last word for a string). A field not
    made by `option` is checked but kept off the command line."""
    meta = {"help": help, "lo": lo, "hi": hi, "lo_open": lo_open, "hi_open": hi_open, "choices": choices,
            "flag": flag, "cli": True, "none": none, "metavar": metavar}
    return dataclasses.field(default=default, metadata=meta)


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)  # evaluates every string annotation: once per class, not per field


def _kind(cls: type, field: dataclasses.Field) -> tuple[type, bool]:
    """(int | float | bool | str | a dataclass, whether None is allowed) from the field's annotation."""
    hint = _hints(cls)[field.name]
    args = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
    return args[0], type(None) in typing.get_args(hint)


def check(obj: Any, prefix: str = "") -> None:
    """Check every field of `obj` against its annotation and `option` metadata; errors name `prefix + field`. Each
    number is kept as the Python int or float its annotation names (a NumPy scalar is not JSON, and configs are
    saved as JSON in every checkpoint)."""
    for field in dataclasses.fields(obj):
        value = _check_value(prefix + field.name, getattr(obj, field.name), *_kind(type(obj), field), field.metadata)
        object.__setattr__(obj, field.name, value)  # (frozen dataclasses too)


def _check_value(name: str, value: Any, kind: type, none: bool, meta: Any) -> Any:
    bounds = {"lo": meta.get("lo"), "hi": meta.get("hi")}
    if meta.get("choices") is not None:
        return validate.choice(name, value, meta["choices"])
    if kind is bool:
        return value if none and value is None else validate.boolean(name, value)
    if kind is int:
        return validate.integer(name, value, **bounds, none=none)
    if kind is float:
        return validate.real(name, value, **bounds, lo_open=meta.get("lo_open", False),
                             hi_open=meta.get("hi_open", False), none=none)
    if kind is str:
        return value if none and value is None else validate.instance(name, value, kind)
    return value


def flag(cls: type, name: str) -> str:
    """The command-line flag of field `name`: its `option(flag=...)`, else `--name-with-dashes`."""
    field = next((f for f in dataclasses.fields(cls) if f.name == name), None)
    return (field and field.metadata.get("flag")) or f"--{name.replace('_', '-')}"


def add_arguments(group: Any, cls: type, defaults: dict[str, Any] | None = None,
                  shown: dict[str, str] | None = None) -> None:
    """One flag per command-line field of `cls`; `defaults` replaces a field's default for this command, and
    `shown` the description of a None default in the help (for a None the command resolves itself)."""
    defaults, shown = defaults or {}, shown or {}
    for field in dataclasses.fields(cls):
        kind, none = _kind(cls, field)
        if not field.metadata.get("cli", False) or kind not in (int, float, bool, str):
            continue
        default = defaults.get(field.name, field.default)
        kwargs: dict[str, Any] = {"dest": field.name, "default": default}
        if kind is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = _parser(kind, none, field.metadata)
            kwargs["metavar"] = field.metadata.get("metavar") or (
                "N" if kind is int else "X" if kind is float else field.name.split("_")[-1].upper())
            if field.metadata.get("choices") is not None:
                kwargs["choices"], kwargs["metavar"] = field.metadata["choices"], None
        text = shown.get(field.name, field.metadata.get("none", "off")) if default is None else default
        help_text = field.metadata.get("help", "")
        help_text = f"{help_text} (default: {text})" if kind is not bool else help_text
        kwargs["help"] = help_text.replace("%", "%%")  # argparse formats help with %: a literal % would raise
        group.add_argument(flag(cls, field.name), **kwargs)


def argument_type(kind: type, **meta: Any):
    """The argparse `type` an option of `kind` with `option`'s bounds or choices (`meta`) gets, for a flag that is
    not a dataclass field (`check --seed`): the same checks and the same one-line message."""
    return _parser(kind, False, meta)


def _parser(kind: type, none: bool, meta: Any):
    """Text -> checked value, for argparse: a bad value exits 2 with "argument --flag: expected ..., got TEXT"."""

    def parse(text: str):
        try:
            value = None if none and text.lower() == "none" else kind(text)
        except ValueError:
            if not none:
                raise  # argparse's "invalid int value: 'x'"
            value = text  # refused below, by a message that names none as well as the numbers
        try:
            return _check_value("", value, kind, none, meta)
        except (TypeError, ValueError) as err:  # the text as typed, not its parsed form ("got 0", not "got 0.0")
            # The library's None is `none` on the command line.
            expected = str(err)[2:].rsplit(", got ", 1)[0].replace("expected None or", "expected none or")
            raise argparse.ArgumentTypeError(f"{expected}, got {text}") from None

    parse.__name__ = kind.__name__  # argparse's "invalid int value: 'x'"
    return parse


def from_args(cls: type, args: argparse.Namespace, **extra: Any) -> Any:
    """`cls(...)` from the parsed command line: every command-line field of `cls` present in `args`, plus `extra`."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls)
              if f.metadata.get("cli", False) and hasattr(args, f.name)}
    return cls(**{**values, **extra})
