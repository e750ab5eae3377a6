"""Read a YAML policy into a `CapabilityDeclaration`, or say exactly where it is wrong.

A policy is the boundary of untrusted code, so a typo must never be silently dropped
and a hostile file must never crash the caller with an unexpected exception: every
failure becomes one `CapabilityParseError` naming the source, the 1-based line and
the dotted field (`network_egress_rules[1].domain`).

We compose YAML nodes with a SafeLoader and build the Python data ourselves, instead
of `yaml.safe_load`, because only the node tree knows line numbers, and because
safe_load silently keeps the last of two duplicate keys.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from .errors import CapabilityParseError
from .models import CapabilityDeclaration

__all__ = ["CapabilityParser"]

# Far beyond any real policy (about five levels, a few hundred values), low enough
# that alias bombs and deep nesting stop quickly with a clear message.
MAX_DEPTH = 64
MAX_VALUES = 100_000
MAX_OTHER_ERRORS_SHOWN = 5

_TAG = "tag:yaml.org,2002:"
_MAP, _SEQ, _STR = _TAG + "map", _TAG + "seq", _TAG + "str"
_PLAIN_SCALARS = {_TAG + "null", _TAG + "bool", _TAG + "int", _TAG + "float", _STR}
# Timestamps stay text: a policy has no date fields, and a string field fed
# `2024-01-01` should get that string, not a date object.
_TEXT_SCALARS = {_STR, _TAG + "timestamp"}

DataPath = tuple[str | int, ...]


class _PolicyLoader(yaml.SafeLoader):
    """SafeLoader used only to compose nodes and to construct plain scalars."""


class _NodeBuilder:
    """Python data built from a node tree, with the line of every key and item."""

    def __init__(self, loader: _PolicyLoader, source: str) -> None:
        self._loader = loader
        self._source = source
        self._values = 0
        self._active: set[int] = set()
        self.lines: dict[DataPath, int] = {}

    def error(self, message: str, node: yaml.Node, path: DataPath) -> CapabilityParseError:
        return CapabilityParseError(
            message, source=self._source, line=_line(node), field=format_field(path) or None
        )

    def build(self, node: yaml.Node, path: DataPath = ()) -> Any:
        if len(path) > MAX_DEPTH:
            raise self.error(f"nested deeper than {MAX_DEPTH} levels", node, path)
        self._values += 1
        if self._values > MAX_VALUES:
            raise self.error(
                f"more than {MAX_VALUES:,} values (aliases expanding too far?)", node, path
            )
        if id(node) in self._active:
            raise self.error("an alias refers to the value that contains it", node, path)
        self._active.add(id(node))
        try:
            if isinstance(node, yaml.MappingNode):
                return self._mapping(node, path)
            if isinstance(node, yaml.SequenceNode):
                return self._sequence(node, path)
            return self._scalar(node, path)
        finally:
            self._active.discard(id(node))

    def _mapping(self, node: yaml.MappingNode, path: DataPath) -> dict[str, Any]:
        if node.tag != _MAP:
            raise self.error(f"unsupported YAML tag {node.tag!r} on a mapping", node, path)
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = self._key(key_node, path)
            key_path = (*path, key)
            if key in result:
                first = self.lines[key_path]
                raise self.error(
                    f"duplicate key {key!r} (first given on line {first})", key_node, key_path
                )
            self.lines[key_path] = _line(key_node)
            result[key] = self.build(value_node, key_path)
        return result

    def _key(self, node: yaml.Node, path: DataPath) -> str:
        if node.tag == _TAG + "merge":
            raise self.error("merge keys ('<<') are not supported in policies", node, path)
        if not isinstance(node, yaml.ScalarNode):
            raise self.error("keys must be plain strings, not lists or mappings", node, path)
        if node.tag not in _TEXT_SCALARS:
            read_as = _kind(self._scalar(node, path))
            raise self.error(
                f"key {node.value!r} is read by YAML as a {read_as}; quote it to use it as a name",
                node,
                path,
            )
        return node.value

    def _sequence(self, node: yaml.SequenceNode, path: DataPath) -> list[Any]:
        if node.tag != _SEQ:
            raise self.error(f"unsupported YAML tag {node.tag!r} on a list", node, path)
        items = []
        for index, item_node in enumerate(node.value):
            item_path = (*path, index)
            self.lines[item_path] = _line(item_node)
            items.append(self.build(item_node, item_path))
        return items

    def _scalar(self, node: yaml.Node, path: DataPath) -> Any:
        if node.tag in _TEXT_SCALARS:
            return node.value
        if node.tag not in _PLAIN_SCALARS:
            raise self.error(f"unsupported YAML tag {node.tag!r}", node, path)
        try:
            return self._loader.construct_object(node, deep=True)
        except (yaml.YAMLError, ValueError) as exc:  # e.g. an int past Python's digit limit
            raise self.error(f"cannot read value {node.value[:40]!r}: {exc}", node, path) from None


def _line(node: yaml.Node) -> int:
    return node.start_mark.line + 1


def format_field(path: DataPath) -> str:
    """`('network_egress_rules', 1, 'domain')` -> `network_egress_rules[1].domain`."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _located(loc: tuple[Any, ...], data: Any) -> tuple[DataPath, DataPath]:
    """Split a pydantic `loc` into the part that exists in the data and the full field path.

    Steps that are neither a present key nor a list index (a missing field, or a
    validator's union tag such as `function-after[...]`) end the walk; missing field
    names still belong to the field path, union tags do not.
    """
    found: list[str | int] = []
    field: list[str | int] = []
    walking = True
    for step in loc:
        present = (
            isinstance(data, dict) and isinstance(step, str) and step in data
        ) or (
            isinstance(data, list) and isinstance(step, int) and 0 <= step < len(data)
        )
        if walking and present:
            found.append(step)
            field.append(step)
            data = data[step]
            continue
        walking = False
        if isinstance(step, int) or (isinstance(step, str) and step.isidentifier()):
            field.append(step)
    return tuple(found), tuple(field)


class CapabilityParser:
    """Parse YAML capability policies (aumai-sandbox's API) with line-accurate errors."""

    @staticmethod
    def from_file(path: str | Path) -> CapabilityDeclaration:
        """Parse a policy file; relative roots in `paths:` resolve next to the file."""
        source = str(path)
        try:
            policy_path = Path(path)
            text = policy_path.read_text(encoding="utf-8")
            base_path = policy_path.parent.resolve()
        except FileNotFoundError:
            raise CapabilityParseError("policy file does not exist", source=source) from None
        except UnicodeDecodeError as exc:
            raise CapabilityParseError(
                f"policy file is not UTF-8 text ({exc.reason} at byte {exc.start})", source=source
            ) from None
        except (OSError, TypeError, ValueError, RuntimeError) as exc:
            raise CapabilityParseError(
                f"cannot read policy file: {exc.__class__.__name__}: {exc}", source=source
            ) from None
        declaration = CapabilityParser.from_string(text, source=source)
        declaration._base_path = base_path
        declaration._source_file = Path(os.path.realpath(policy_path))
        return declaration

    @staticmethod
    def from_string(yaml_text: str, *, source: str = "<string>") -> CapabilityDeclaration:
        """Parse policy text; empty text or `null` gives the all-default policy."""
        try:
            return _parse(yaml_text, source)
        except CapabilityParseError:
            raise
        except RecursionError:
            raise CapabilityParseError("policy is nested too deeply", source=source) from None
        except Exception as exc:  # the promise is one exception type, whatever the input
            raise CapabilityParseError(
                f"cannot parse policy: {exc.__class__.__name__}: {exc}", source=source
            ) from None


def _parse(yaml_text: str, source: str) -> CapabilityDeclaration:
    if not isinstance(yaml_text, str):
        raise CapabilityParseError(
            f"policy text must be str, not {type(yaml_text).__name__}", source=source
        )
    loader: _PolicyLoader | None = None
    try:
        loader = _PolicyLoader(yaml_text)  # its reader rejects control characters at once
        root = loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        raise _syntax_error(exc, source) from None
    except yaml.reader.ReaderError as exc:
        line = yaml_text.count("\n", 0, exc.position) + 1
        raise CapabilityParseError(
            f"YAML syntax error: {exc.reason} (found {_codepoint(exc.character)})",
            source=source,
            line=line,
        ) from None
    except yaml.YAMLError as exc:
        raise CapabilityParseError(f"YAML syntax error: {exc}", source=source) from None
    finally:
        if loader is not None:
            loader.dispose()

    if root is None:
        return CapabilityDeclaration()
    built = _NodeBuilder(loader, source)
    data = built.build(root)
    if data is None:
        return CapabilityDeclaration()
    if not isinstance(data, dict):
        raise CapabilityParseError(
            f"a policy must be a mapping of fields, not a {_kind(data)}",
            source=source,
            line=_line(root),
        )
    built.lines[()] = _line(root)
    try:
        declaration = CapabilityDeclaration.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        raise _validation_error(errors, data, built.lines, source) from None
    return declaration


def _syntax_error(exc: yaml.MarkedYAMLError, source: str) -> CapabilityParseError:
    mark = exc.problem_mark or exc.context_mark
    parts = [exc.problem or "invalid YAML"]
    if exc.context:
        context_line = f" (line {exc.context_mark.line + 1})" if exc.context_mark else ""
        parts.insert(0, exc.context + context_line)
    return CapabilityParseError(
        "YAML syntax error: " + ", ".join(parts),
        source=source,
        line=mark.line + 1 if mark else None,
    )


def _codepoint(character: int | bytes | str) -> str:
    return f"U+{character:04X}" if isinstance(character, int) else repr(character)


def _kind(value: Any) -> str:
    kinds = {list: "list", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else kinds.get(type(value), type(value).__name__)


def _validation_error(
    errors: list[Any], data: dict[str, Any], lines: dict[DataPath, int], source: str
) -> CapabilityParseError:
    """The error earliest in the file, with the others summarised in its message."""
    located = sorted(_describe(errors, data, lines), key=lambda item: item[0])
    line, field, message = located[0]
    others = [
        f"line {other_line}, {other_field or 'policy'}: {other_message}"
        for other_line, other_field, other_message in located[1 : 1 + MAX_OTHER_ERRORS_SHOWN]
    ]
    if others:
        more = len(located) - 1 - len(others)
        message += "; also " + "; ".join(others) + (f"; and {more} more" if more else "")
    return CapabilityParseError(message, source=source, line=line, field=field or None)


def _describe(
    errors: list[Any], data: dict[str, Any], lines: dict[DataPath, int]
) -> Iterator[tuple[int, str, str]]:
    for error in errors:
        found, field = _located(tuple(error["loc"]), data)
        message = error["msg"]
        if error["type"] == "extra_forbidden":
            message = f"unknown field {field[-1]!r} ({message})"
        yield lines.get(found, lines[()]), format_field(field), message
