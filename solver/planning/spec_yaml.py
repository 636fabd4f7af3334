"""Reading a spec file: its text, its YAML (duplicate keys are errors) and
one-line error messages that name the file, the line or the field. The
spec models themselves are `solver.planning.spec`'s."""

from __future__ import annotations

import os
import pathlib
import types
import typing
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ValidationError

from ir.core import IRError


class SpecError(IRError):
    """A malformed spec; the message is one line naming the file and the field."""


class _SpecLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys, which PyYAML would resolve by
    silently keeping the last one."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[tuple[str, str]] = set()
        for key_node, _ in node.value:
            # Merge keys (<<) may legitimately repeat and be overridden.
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = (key_node.tag, key_node.value)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key_node.value!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def read_spec_text(path: str | os.PathLike[str]) -> str:
    """The text of the spec file `path` (OSError if unreadable, SpecError if not UTF-8)."""
    filename = os.fspath(path)
    data = pathlib.Path(filename).read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"{filename}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc


def parse_yaml(text: str, filename: str) -> dict[Any, Any]:
    """The top-level mapping of the YAML text."""
    try:
        data = yaml.load(text, Loader=_SpecLoader)
    except yaml.YAMLError as exc:
        raise SpecError(yaml_message(filename, text, exc)) from exc
    if data is None:
        raise SpecError(f"{filename}: empty spec; expected a mapping with model, mesh and hardware")
    if not isinstance(data, dict):
        raise SpecError(
            f"{filename}: a spec must be a mapping with model, mesh and hardware, not a {type(data).__name__}"
        )
    return data


def yaml_message(filename: str, text: str, exc: yaml.YAMLError) -> str:
    """`file:line:col: problem (context)` for a YAML error, on one line."""
    if isinstance(exc, yaml.reader.ReaderError):  # a control character: it has an offset, not a mark
        line = text.count("\n", 0, exc.position) + 1
        column = exc.position - text.rfind("\n", 0, exc.position)
        return f"{filename}:{line}:{column}: unacceptable character #x{exc.character:04x}: {exc.reason}"
    mark = getattr(exc, "problem_mark", None)
    if mark is None:
        return f"{filename}: {_one_line(str(exc))}"
    problem = exc.problem or exc.context or "invalid YAML"
    context = f" ({exc.context})" if exc.problem and exc.context else ""
    return f"{filename}:{mark.line + 1}:{mark.column + 1}: {_one_line(problem + context)}"


def validation_message(filename: str, exc: ValidationError, root: type[BaseModel]) -> str:
    """`file: dotted.field: message` for the first error of validating the
    model `root`, noting how many more."""
    errors = exc.errors()
    # A misspelt key also makes the key it stands for missing; the misspelling
    # is the error to show.
    first = next((e for e in errors if e["type"] == "extra_forbidden"), errors[0])
    loc = first["loc"]
    where = ".".join(map(str, loc))
    if first["type"] == "value_error":  # our validators: drop pydantic's "Value error, " prefix
        message = str(first["ctx"]["error"])
    elif first["type"] == "extra_forbidden":
        message = f"unknown key; valid keys: {', '.join(_fields_at(root, loc[:-1]))}"
    else:
        message = first["msg"]
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    # A whole-spec check (empty loc) names its field in its own message.
    return f"{filename}: {where + ': ' if where else ''}{_one_line(message)}{more}"


def _fields_at(root: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """The field names of the spec model found by following `loc` from `root`
    through fields, list indices (schedule.0) and mapping keys (hardware.links.batch)."""
    annotation: Any = root
    for part in loc:
        annotation = _unwrap(annotation)
        if typing.get_origin(annotation) in (list, dict):
            annotation = typing.get_args(annotation)[-1]  # the element: an index or a key was consumed
        else:
            annotation = _model_of(annotation).model_fields[str(part)].annotation
    return list(_model_of(annotation).model_fields)


def _unwrap(annotation: Any) -> Any:
    """`annotation` without Annotated[...] metadata."""
    while typing.get_origin(annotation) is Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation


def _model_of(annotation: Any) -> type[BaseModel]:
    """The spec model in `annotation`: itself, or the model member of a union (`ManualSpec | None`)."""
    annotation = _unwrap(annotation)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return next(m for m in map(_unwrap, typing.get_args(annotation))
                    if isinstance(m, type) and issubclass(m, BaseModel))
    return annotation


def _one_line(text: str) -> str:
    return " ".join(text.split())
