"""Typed config trees from YAML/dicts, with dotted command-line overrides and clear errors.

Every config is a tree of `@dataclass(kw_only=True, slots=True)` classes. This module turns plain
dicts (from YAML or JSON) into such a tree, checking every key and type on the way, and back:

    cfg = from_dict(RunConfig, yaml.safe_load(text))          # unknown/mistyped keys -> ConfigError
    cfg = apply_overrides(cfg, ["model.d_model=256", "data.sources.0.weight=0.5"])
    json.dumps(to_dict(cfg))                                    # the resolved tree, saved beside results

Errors name the full key path (`optim.lr`), the bad value and the fix, so the CLI can print one line.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from typing import Any, TypeVar

import yaml

from scalelab.errors import ConfigError

T = TypeVar("T")


def _field_types(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check/convert `value` to annotation `tp`; raise ConfigError naming `key` when impossible."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key)
            except ConfigError as e:
                errors.append(e)
        raise ConfigError(key, f"{value!r} is not a valid {_type_name(tp)}", "fix the value's type")
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, dict):
            raise ConfigError(key, f"expected a mapping for {tp.__name__}, got {value!r}", "write it as a section")
        return from_dict(tp, value, prefix=key)
    if origin is list:
        (item_tp,) = typing.get_args(tp) or (Any,)
        if not isinstance(value, list | tuple):
            raise ConfigError(key, f"expected a list, got {value!r}", "write a YAML list")
        return [_coerce(v, item_tp, f"{key}.{i}") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(key, f"expected a mapping, got {value!r}", "write a YAML mapping")
        _, val_tp = typing.get_args(tp) or (Any, Any)
        return {str(k): _coerce(v, val_tp, f"{key}.{k}") for k, v in value.items()}
    if origin is typing.Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise ConfigError(key, f"{value!r} is not one of {list(allowed)}", f"use one of {list(allowed)}")
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(key, f"expected true/false, got {value!r}", "write true or false")
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(key, f"expected an integer, got {value!r}", "write an integer")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():  # 1e6 in YAML is a float
            return int(value)
        if isinstance(value, str):
            try:
                f = float(value)
            except ValueError:
                f = None
            if f is not None and f.is_integer():
                return int(f)
        raise ConfigError(key, f"expected an integer, got {value!r}", "write an integer")
    if tp is float:
        if isinstance(value, bool):
            raise ConfigError(key, f"expected a number, got {value!r}", "write a number")
        if isinstance(value, int | float):
            return float(value)
        if isinstance(value, str):  # YAML reads 3e-4 without a dot as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(key, f"expected a number, got {value!r}", "write a number")
    if tp is str:
        if isinstance(value, str):
            return value
        if isinstance(value, int | float) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(key, f"expected a string, got {value!r}", "write a string")
    return value


def typed_values(cls: type, data: dict[str, Any] | None, prefix: str = "", known=None) -> dict[str, Any]:
    """`data`'s values checked and converted to the types of dataclass `cls`'s fields (key paths in
    errors); a key that is not a field, or not in `known` when given, is refused with a suggestion."""
    hints = _field_types(cls)
    fields = [f.name for f in dataclasses.fields(cls) if f.init] if known is None else list(known)
    kwargs = {}
    for key, value in dict(data or {}).items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if key not in fields:
            close = difflib.get_close_matches(str(key), fields, n=1)
            hint = f"did you mean '{close[0]}'?" if close else f"known keys: {', '.join(sorted(fields))}"
            raise ConfigError(path, "unknown key", hint)
        kwargs[key] = _coerce(value, hints[key], path)
    return kwargs


def from_dict(cls: type[T], data: dict[str, Any] | None, prefix: str = "") -> T:
    """Build dataclass `cls` from a dict, rejecting unknown keys and wrong types (key paths in errors)."""
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs = typed_values(cls, data, prefix)
    missing = [
        n
        for n, f in fields.items()
        if n not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        path = f"{prefix}.{missing[0]}" if prefix else missing[0]
        raise ConfigError(path, "is required", "set it in the config or with --set")
    return cls(**kwargs)


def to_dict(cfg: Any) -> Any:
    """The plain (JSON-ready) form of a config tree."""
    if dataclasses.is_dataclass(cfg):
        return {f.name: to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, list | tuple):
        return [to_dict(v) for v in cfg]
    if isinstance(cfg, dict):
        return {k: to_dict(v) for k, v in cfg.items()}
    return cfg


def parse_override(text: str) -> tuple[list[str], Any]:
    """'a.b.0.c=value' -> (['a','b','0','c'], parsed YAML value)."""
    if "=" not in text:
        raise ConfigError(text, "an override must look like key.path=value", "e.g. --set optim.lr=3e-4")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(text, "empty key in override", "e.g. --set optim.lr=3e-4")
    try:
        value = safe_yaml(raw, key) if raw.strip() else ""
    except yaml.YAMLError as e:
        raise ConfigError(key, f"value {raw!r} is not valid YAML ({yaml_error_text(e)})", "quote it") from None
    return key.split("."), value


def set_in_dict(data: dict[str, Any], path: list[str], value: Any) -> None:
    """Set data[p0][p1]... = value, creating sections; numeric parts index lists."""
    node: Any = data
    for i, part in enumerate(path[:-1]):
        key_so_far = ".".join(path[: i + 1])
        if isinstance(node, list):
            node = _list_item(node, part, key_so_far)
            continue
        if node.get(part) is None:
            node[part] = {}
        node = node[part]
        if not isinstance(node, dict | list):
            raise ConfigError(key_so_far, f"is a value ({node!r}), not a section", "override a leaf key")
    last = path[-1]
    if isinstance(node, list):
        idx = _list_index(node, last, ".".join(path))
        node[idx] = value
    else:
        node[last] = value


def _list_index(node: list, part: str, key: str) -> int:
    if not (part.isascii() and part.isdigit()) or int(part) >= len(node):
        raise ConfigError(key, f"list index {part!r} out of range (length {len(node)})", "use a valid index")
    return int(part)


def _list_item(node: list, part: str, key: str) -> Any:
    return node[_list_index(node, part, key)]


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply 'a.b=c' overrides to a plain dict (before it becomes a typed tree)."""
    for text in overrides or []:
        path, value = parse_override(text)
        set_in_dict(data, path, value)
    return data


def yaml_error_text(e: yaml.YAMLError) -> str:
    """'line L, column C: problem' for a YAML syntax error (1-based, as editors count)."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    context = getattr(e, "context", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    return f"{where}{problem}" + (f" ({context})" if context else "")


# Limits on a YAML document (a run config, a sweep spec: specs can come from a bucket), each checked
# before the next stage costs more: its bytes before parsing, its nesting while its events stream
# (libyaml's composer recurses per level), what its aliases expand to before Python objects are
# built. A run config or a spec is a few KB and nests fewer than 10 levels; docs/store.md has the
# figures (bench/yaml_limits.py).
MAX_YAML_BYTES = 1 << 20  # 1 MiB: ~10,000 runs listed one per line
MAX_YAML_DEPTH = 64  # nested mappings and lists
MAX_YAML_VALUES = 1_000_000  # values the document may expand to through its aliases
MAX_YAML_EXPANDED_BYTES = 16 << 20  # scalar text it may expand to (a 20 KB string referenced 111k times: 2.2 GB)

# libyaml when PyYAML was built with it (parsing ~4x faster); the pure-Python loader otherwise.
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def safe_yaml(stream: Any, where: str) -> Any:
    """yaml.safe_load within the limits above: a document over MAX_YAML_BYTES, nested deeper than
    MAX_YAML_DEPTH, whose aliases expand it beyond MAX_YAML_VALUES values or MAX_YAML_EXPANDED_BYTES
    of text (an "alias bomb": a few KB that expand to gigabytes), or that refers to itself, is refused.

    The events are streamed first (no recursion: the depth is counted as they come); then the node
    graph is composed (aliases stay shared, so it is as small as the text) and its expanded size
    counted with each node's size computed once; only then are Python objects built.

    Raises:
        ConfigError: naming `where`.
        yaml.YAMLError: the text is not YAML.
    """
    text = stream.read(MAX_YAML_BYTES + 1) if hasattr(stream, "read") else stream
    if len(text) > MAX_YAML_BYTES or (isinstance(text, str) and len(text.encode()) > MAX_YAML_BYTES):
        raise ConfigError(
            where, f"larger than {MAX_YAML_BYTES:,} bytes, the limit for a config or spec", "trim it or split it"
        )
    if isinstance(text, bytes):
        text = text.decode()
    depth = 0
    for event in yaml.parse(text, Loader=_Loader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_YAML_DEPTH:
                raise ConfigError(where, f"nested more than {MAX_YAML_DEPTH} levels deep", "write a flatter document")
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(node, {}, set(), where)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _expanded_size(node: yaml.Node, sizes: dict[int, tuple[int, int]], active: set[int], where: str) -> tuple[int, int]:
    """(values, scalar bytes) of `node` with every alias expanded; ConfigError past the limits."""
    if id(node) in sizes:
        return sizes[id(node)]
    if id(node) in active:
        raise ConfigError(where, "a YAML alias refers to the node that contains it", "write the values out")
    active.add(id(node))
    if isinstance(node, yaml.SequenceNode):
        children = node.value
    elif isinstance(node, yaml.MappingNode):
        children = [part for pair in node.value for part in pair]
    else:
        children = []
    values, size = 1, len(node.value) if isinstance(node, yaml.ScalarNode) else 0
    for child in children:
        child_values, child_size = _expanded_size(child, sizes, active, where)
        values, size = values + child_values, size + child_size
        if values > MAX_YAML_VALUES or size > MAX_YAML_EXPANDED_BYTES:
            what = f"{MAX_YAML_VALUES:,} values" if values > MAX_YAML_VALUES else f"{MAX_YAML_EXPANDED_BYTES:,} bytes"
            raise ConfigError(
                where,
                f"its YAML aliases expand it to more than {what} (an alias bomb?)",
                "write the values out, or use fewer alias references",
            )
    active.discard(id(node))
    sizes[id(node)] = (values, size)
    return values, size


def load_yaml(path: str) -> dict[str, Any]:
    """Read a YAML mapping; missing file or bad YAML -> ConfigError naming the file (and line, column)."""
    try:
        with open(path, "rb") as f:
            data = safe_yaml(f, str(path))
    except FileNotFoundError:
        raise ConfigError(str(path), "config file not found", "check the path") from None
    except IsADirectoryError:
        raise ConfigError(str(path), "is a directory, not a config file", "give the YAML file's path") from None
    except UnicodeDecodeError:
        raise ConfigError(str(path), "is not a text file", "give a YAML file") from None
    except OSError as e:
        raise ConfigError(str(path), f"cannot be read ({e.strerror})", "check the path and its permissions") from None
    except yaml.YAMLError as e:
        raise ConfigError(str(path), f"invalid YAML at {yaml_error_text(e)}", "fix the syntax") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(str(path), "the top level must be a mapping of sections", "see the README")
    return data
