"""The input boundary: every file and number a user hands in passes here before any work.

A file is stat()ed before it is opened (a device, FIFO or socket is refused, so is a file above
the size cap), YAML is read by a SafeLoader that refuses duplicate keys and caps what aliases
may add, JSON refuses duplicate keys, and `validate` checks parsed data against its schema
(nest/schemas/<kind>.json) with integers that refuse their float form (256.0) and booleans,
every number finite, every count within the stated physical range. Errors are one SpecError
line naming the file, the key, the value (shown short) and what was expected.
"""

from __future__ import annotations

import copy
import difflib
import json
import math
import os
import re
import stat
from functools import cache
from pathlib import Path

import jsonschema
import yaml

from nest.common.errors import SpecError, one_line, short

MAX_YAML_BYTES = 256 * 1024  # a hand-written catalog file (the largest shipped: ~22 KB)
MAX_JSON_BYTES = 16 * 2**20  # a full plan of MAX_DEVICES devices is ~1 MB
MAX_ALIAS_EXPANSION = 100_000  # nodes + scalar characters YAML aliases may add, in total

SCHEMA_DIR = Path(__file__).parent.parent / "schemas"


@cache
def load_schema(kind: str) -> dict:
    return json.loads((SCHEMA_DIR / f"{kind}.json").read_text())


def limit(kind: str, key: str) -> int | float:
    """The maximum schema `kind` allows for top-level `key` (the command line's bounds)."""
    return load_schema(kind)["properties"][key]["maximum"]


# --------------------------------------------------------------------------------------------
# Parsed data against its schema
# --------------------------------------------------------------------------------------------


def _is_integer(checker, x) -> bool:
    """JSON Schema's "integer" without its float form: 256.0 and True are not integers here (a
    float width or count reaches torch / numpy shapes as a bug otherwise)."""
    return isinstance(x, int) and not isinstance(x, bool)


_Validator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine("integer", _is_integer))


def non_finite(data) -> tuple[str, float] | None:
    """(key path, value) of the first NaN or infinity in parsed JSON / YAML data, else None
    (iterative: any nesting depth the parser accepted)."""
    stack = [("", data)]
    while stack:
        key, x = stack.pop()
        if isinstance(x, float) and not math.isfinite(x):
            return key or "<top level>", x
        items = x.items() if isinstance(x, dict) else enumerate(x) if isinstance(x, list) else ()
        stack.extend(reversed([(f"{key}.{k}" if key else str(k), v) for k, v in items]))
    return None


def _range(schema: dict) -> str:
    def num(x):
        return f"{x:g}" if isinstance(x, float) else str(x)

    lows, highs = (("minimum", "<="), ("exclusiveMinimum", "<")), (("maximum", "<="),
                                                                   ("exclusiveMaximum", "<"))
    lo = next((f"{num(schema[k])} {op} " for k, op in lows if k in schema), "")
    hi = next((f" {op} {num(schema[k])}" for k, op in highs if k in schema), "")
    types = schema.get("type", "number")
    kind = "an integer" if "integer" in (types if isinstance(types, list) else [types]) \
        else "a number"
    return f"{kind} {lo}value{hi}"


_ARTICLE = {"integer": "an integer", "number": "a number", "string": "a string",
            "boolean": "true or false", "array": "a list", "object": "a mapping",
            "null": "null"}


def _describe(e: jsonschema.ValidationError) -> tuple[str, str]:
    """(key path, what is wrong) of one schema error, user values shown short."""
    path, v, inst, sch = _error_path(e), e.validator, e.instance, e.schema
    if v == "type":
        want = e.validator_value if isinstance(e.validator_value, list) else [e.validator_value]
        want_text = " or ".join(_ARTICLE.get(t, t) for t in want)
        if "integer" in want and isinstance(inst, float) and inst.is_integer():
            return path, (f"{short(inst)} is a float; expected {want_text} (write it without a "
                          f"decimal point or exponent)")
        got = "a string" if isinstance(inst, str) else _ARTICLE.get(
            {bool: "boolean", int: "integer", float: "number", list: "array", dict: "object",
             type(None): "null"}.get(type(inst), ""), type(inst).__name__)
        return path, f"{short(inst)} is {got}; expected {want_text}"
    if v in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        return path, f"{short(inst)} is out of range; expected {_range(sch)}"
    if v == "additionalProperties" and isinstance(inst, dict):
        known = list(sch.get("properties", {}))
        extra = [k for k in inst if k not in known]
        if extra:
            k = str(extra[0])
            near = difflib.get_close_matches(k, known, n=1)
            hint = f" (did you mean '{near[0]}'?)" if near else ""
            more = f" (and {len(extra) - 1} more unknown key(s))" if len(extra) > 1 else ""
            name = short(k).strip("'")  # inside the message's own quotes: key 'levels.1.x'
            where = f"{path}.{name}" if path != "<top level>" else name
            return where, f"unknown key{hint}{more}"
    if v in ("enum", "const"):
        allowed = e.validator_value if v == "enum" else [e.validator_value]
        return path, f"{short(inst)}; expected one of {', '.join(map(repr, allowed))}"
    if v in ("minItems", "maxItems") and isinstance(inst, list):
        bound = "at least" if v == "minItems" else "at most"
        return path, f"{len(inst)} item(s); expected {bound} {e.validator_value}"
    if v in ("minLength", "maxLength") and isinstance(inst, str):
        bound = "at least" if v == "minLength" else "at most"
        return path, f"{short(inst)} has {len(inst)} characters; expected {bound} " \
                     f"{e.validator_value}"
    if v == "pattern":
        return path, f"{short(inst)} does not match the pattern {e.validator_value}"
    if v in ("oneOf", "anyOf") and e.context:
        return _describe_alternatives(e)
    return path, one_line(e.message, 200)


def _alternative(schema: dict) -> str:
    """A short text for one alternative of a oneOf / anyOf: its enum, type, range or pattern."""
    if "enum" in schema:
        return "one of " + ", ".join(map(repr, schema["enum"]))
    t = schema.get("type")
    if t in ("integer", "number") and any(k in schema for k in ("minimum", "maximum")):
        text = _range(schema)
    else:
        text = " or ".join(_ARTICLE.get(x, x) for x in (t if isinstance(t, list) else [t])) \
            if t else "a value"
    if t == "array" and isinstance(schema.get("items"), dict):
        text += f", each {_alternative(schema['items'])}"
    return text + (f" matching {schema['pattern']}" if "pattern" in schema else "")


def _fits(schema: dict, inst) -> bool:
    """Whether `inst` is of the type an alternative is for (its type, else its enum's)."""
    t = schema.get("type")
    if t:
        checker = _Validator(schema)
        return any(checker.is_type(inst, x) for x in (t if isinstance(t, list) else [t]))
    if "enum" in schema:
        return any(type(x) is type(inst) for x in schema["enum"])
    return True


def _describe_alternatives(e: jsonschema.ValidationError) -> tuple[str, str]:
    """A oneOf / anyOf error as the alternative the value's own type was meant for (what is
    wrong there, e.g. "4 is out of range; expected an integer 0 <= value <= 3"), then the other
    alternatives; jsonschema's own message ("is not valid under any of the given schemas")
    says neither what was expected nor why."""
    alts = e.validator_value
    own = [i for i, sch in enumerate(alts) if _fits(sch, e.instance)]
    pick = own[0] if own else 0
    subs = [s for s in e.context if s.relative_schema_path[0] == pick]
    if subs:
        path, what = _describe(min(subs, key=lambda s: len(s.relative_path)))
    else:
        path, what = _error_path(e), f"{short(e.instance)}; expected {_alternative(alts[pick])}"
    others = [_alternative(sch) for i, sch in enumerate(alts) if i != pick]
    if others and path == _error_path(e):  # not inside the value (an item of a list)
        what += f" (or {'; or '.join(others)})"
    return path, what


def _error_path(err: jsonschema.ValidationError) -> str:
    return ".".join(str(p) for p in err.absolute_path) or "<top level>"


def validate(data: object, kind: str, where: str) -> None:
    """Validate `data` against schema `kind` (integers without float forms, every number finite
    and within its stated range); raise SpecError naming the file, key, value and expectation."""
    bad = non_finite(data)
    if bad is not None:
        raise SpecError(f"{where}: key '{bad[0]}': {bad[1]} is not a finite number")
    try:
        errors = sorted(_Validator(load_schema(kind)).iter_errors(data),
                        key=lambda e: list(map(str, e.absolute_path)))
    except RecursionError:
        raise SpecError(f"{where}: nested too deeply") from None
    if errors:
        key, what = _describe(errors[0])
        more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
        raise SpecError(f"{where}: key '{key}': {what}{more}")


def _node_size(node, sizes: dict) -> int:
    """Nodes plus scalar characters of a composed YAML node, aliases counted as often as they
    occur (memoised per node: an alias bomb's size is computed, never expanded)."""
    key = id(node)
    if key in sizes:
        if sizes[key] is None:
            raise yaml.composer.ComposerError(None, None, "a YAML alias refers to itself "
                                              "(a recursive structure)", node.start_mark)
        return sizes[key]
    sizes[key] = None
    if isinstance(node, yaml.ScalarNode):
        n = 1 + len(node.value)
    elif isinstance(node, yaml.SequenceNode):
        n = 1 + sum(_node_size(x, sizes) for x in node.value)
    else:
        n = 1 + sum(_node_size(k, sizes) + _node_size(x, sizes) for k, x in node.value)
    sizes[key] = n
    return n


class _Loader(yaml.SafeLoader):
    """safe_load with three fixes: a key given twice in one mapping is an error (PyYAML silently
    keeps the last); `5e1` / `1e9` are numbers as in YAML 1.2 (YAML 1.1 needs `5.0e+1`); and
    aliases may add at most MAX_ALIAS_EXPANSION nodes + characters in total (an alias bomb of a
    few hundred bytes is refused before anything is built; a recursive alias is refused)."""

    def __init__(self, stream):
        super().__init__(stream)
        self._alias_sizes: dict = {}
        self._alias_total = 0
        self._open_anchors: set = set()

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            if event.anchor in self._open_anchors:
                raise yaml.composer.ComposerError(
                    None, None, f"alias *{one_line(event.anchor, 40)} refers to a node that "
                    f"contains it (a recursive structure)", event.start_mark)
            node = self.anchors.get(event.anchor)
            if node is not None:
                self._alias_total += _node_size(node, self._alias_sizes)
                if self._alias_total > MAX_ALIAS_EXPANSION:
                    raise yaml.composer.ComposerError(
                        None, None, f"YAML aliases expand to more than {MAX_ALIAS_EXPANSION} "
                        f"nodes and characters (an alias bomb?)", event.start_mark)
            return super().compose_node(parent, index)
        anchor = getattr(event, "anchor", None)
        if anchor is None:
            return super().compose_node(parent, index)
        self._open_anchors.add(anchor)
        try:
            return super().compose_node(parent, index)
        finally:
            self._open_anchors.discard(anchor)

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for k, _ in node.value:
            key = self.construct_object(k, deep=True)
            try:
                hash(key)
            except TypeError:
                raise yaml.constructor.ConstructorError(
                    None, None, f"unhashable key {short(key)}", k.start_mark) from None
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {short(key)} (first at line {seen[key] + 1})",
                    k.start_mark)
            seen[key] = k.start_mark.line
        return super().construct_mapping(node, deep)


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"))


def read_text(path, what: str = "file", max_bytes: int = MAX_JSON_BYTES) -> str:
    """A text file's contents; a missing file, a folder, a device / FIFO / socket, a file above
    `max_bytes`, an unreadable or binary file is a SpecError naming the path. Checked with
    stat() before opening (opening a FIFO would block, reading /dev/zero never ends)."""
    try:
        st = os.stat(path)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError
        if not stat.S_ISREG(st.st_mode):
            raise SpecError(f"{path}: not a regular file (a device, FIFO or socket); expected "
                            f"a {what}")
        if st.st_size > max_bytes:
            raise SpecError(f"{path}: {st.st_size} bytes; a {what} may hold at most "
                            f"{max_bytes} bytes")
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)  # a file that grew (or /proc's size 0) stays bounded
        if len(data) > max_bytes:
            raise SpecError(f"{path}: more than {max_bytes} bytes; a {what} may hold at most "
                            f"{max_bytes} bytes")
        return data.decode("utf-8")
    except FileNotFoundError:
        raise SpecError(f"{path}: file not found") from None
    except IsADirectoryError:
        raise SpecError(f"{path}: is a folder, expected a {what}") from None
    except UnicodeDecodeError:
        raise SpecError(f"{path}: not a text file (UTF-8), expected a {what}") from None
    except (OSError, ValueError) as e:  # ValueError: an embedded NUL in the path
        if isinstance(e, SpecError):
            raise
        raise SpecError(f"{path}: cannot read: {getattr(e, 'strerror', None) or e}") from None


def parse_yaml(text: str, where: str):
    """YAML text -> data (`_Loader`); a syntax error, duplicate key or alias bomb is one
    SpecError line with the file, line and column."""
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        what = " ".join(x for x in (e.context, e.problem) if x)
        raise SpecError(f"{where}: malformed YAML{at}: {what}") from None
    except yaml.YAMLError as e:
        raise SpecError(f"{where}: malformed YAML: {' '.join(str(e).split())}") from None
    except RecursionError:
        raise SpecError(f"{where}: malformed YAML: nested too deeply") from None
    except ValueError as e:  # an integer beyond Python's 4300-digit conversion limit
        raise SpecError(f"{where}: malformed YAML: {e}") from None


_PARSED: dict[str, object] = {}  # YAML text -> data: the catalogs are read again and again


def read_yaml(path: Path) -> dict:
    text = read_text(path, "YAML file", MAX_YAML_BYTES)
    if text not in _PARSED:
        if len(_PARSED) >= 256:
            _PARSED.clear()
        _PARSED[text] = parse_yaml(text, str(path))
    data = copy.deepcopy(_PARSED[text])  # callers may change what they get
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


def unique_pairs(pairs: list) -> dict:
    """json's object_pairs_hook: a key given twice in one object is an error (as in YAML,
    `_Loader`), not silently the last one."""
    d = dict(pairs)
    if len(d) != len(pairs):
        seen: set = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise ValueError(f"duplicate key {short(dup)}")
    return d


def load_json(path: str | os.PathLike, what: str = "JSON file") -> dict:
    """A JSON object from a file through the input boundary (read_text's guards); a malformed
    file or another top-level value is a SpecError naming the path."""
    try:
        data = json.loads(read_text(path, what), object_pairs_hook=unique_pairs)
    except json.JSONDecodeError as e:
        raise SpecError(f"{path}: malformed JSON: {e}") from None
    except RecursionError:
        raise SpecError(f"{path}: malformed JSON: nested too deeply") from None
    except ValueError as e:  # an integer beyond Python's 4300-digit conversion limit
        if isinstance(e, SpecError):
            raise
        raise SpecError(f"{path}: malformed JSON: {e}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected an object at the top level, got "
                        f"{type(data).__name__}")
    return data
