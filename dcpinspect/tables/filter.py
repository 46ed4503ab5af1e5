"""Display filters: one small, safe filter language over the frames table (``frames``, ``show``, ``timeline``, the explorer).

Theory of operation: :func:`compile_filter` parses the text with Python's
own parser (:func:`ast.parse`, ``mode="eval"``), walks the tree once and
builds a tree of predicates from a whitelisted grammar; anything else is a
:class:`FilterError` naming what is wrong.  Nothing is ever evaluated as
Python.  The compiled :class:`FrameFilter` answers the same question two
ways: :meth:`FrameFilter.mask` for a whole Arrow table (vectorised with
``pyarrow.compute``) and :meth:`FrameFilter.matches_row` for one row (a
mapping of column to value: live records, the explorer).  A differential
test proves the two agree.

The language (see ``dcpinspect fields`` for the field names)::

    name == 'DCP_MUTATION' and vbucket == 3
    seqno > 10 and not (status == 0)
    name in ['DCP_MUTATION', 'DCP_DELETION'] and vbucket not in [0, 1]
    key.contains('user') or key.startswith('a') or key.matches('^doc-[0-9]+$')
    has_problem                    # any problem on the row
    has_problem('json')            # a problem whose text contains 'json' (any case)
    problems.contains('JSON')      # the same, case-sensitive; problems.matches('...')
    key is None                    # a null field; 'key' alone means 'key is not None'
    ts >= '2026-01-02 10:11:12'    # times: ISO text (UTC) or epoch seconds

Rules:

1. Fields are the columns given (the frames table's :data:`~.columns.FRAME_COLUMNS`
   by default); an unknown name is an error with a "did you mean".
2. A comparison with a null is false (``!=`` included); ``not`` negates what
   the comparison gave, so ``not vbucket == 3`` holds for rows with no vbucket
   (as Wireshark's ``!``).  Every predicate is true or false, never null.
3. A comparison takes a field and a constant of the field's kind: a number
   for integer fields (any value, even out of the column type's range), text
   for strings, ISO text or epoch seconds for times.  ``== None`` is an error:
   write ``is None``.
4. A list field (``problems``) is tested by its elements: ``.contains``,
   ``.startswith``, ``.endswith`` and ``.matches`` hold when any element does;
   the bare name holds when the list is not empty.
5. ``matches`` is Python's :func:`re.search`, in both evaluators (the mask
   applies it to the distinct values), so the two never disagree.
"""

from __future__ import annotations

import ast
import difflib
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cached_property
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["FILTER_FUNCTIONS", "FILTER_OPERATORS", "FilterError", "FrameFilter", "compile_filter", "frame_field_types"]

#: the functions of the language: (syntax, meaning) - what ``dcpinspect fields`` lists
FILTER_FUNCTIONS: tuple[tuple[str, str], ...] = (
    ("FIELD.contains('text')", "the text occurs in the field (case-sensitive; a list: in any element)"),
    ("FIELD.startswith('text')", "the field starts with the text (a list: any element)"),
    ("FIELD.endswith('text')", "the field ends with the text (a list: any element)"),
    ("FIELD.matches('regex')", "Python re.search finds the regex in the field (a list: in any element)"),
    ("has_problem", "the row has a problem (problems is not empty)"),
    ("has_problem('text')", "a problem contains the text, in any case"),
    ("FIELD is None / FIELD is not None", "the field is null / not null"),
    ("FIELD", "alone: the field is not null (a list: not empty)"),
)
#: the operators of the language: (syntax, meaning)
FILTER_OPERATORS: tuple[tuple[str, str], ...] = (
    ("== != < <= > >=", "compare a field with a constant (false when the field is null)"),
    ("in [..] / not in [..]", "the field is / is not one of the constants (false when null)"),
    ("and, or, not, ( )", "combine; not negates (so 'not vbucket == 3' holds when vbucket is null)"),
)

_METHODS = ("contains", "startswith", "endswith", "matches")
_HAS_PROBLEM = "has_problem"
_PROBLEMS = "problems"
_OPS: dict[type, str] = {ast.Eq: "==", ast.NotEq: "!=", ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">="}
_FLIP = {"==": "==", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
_PY_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "==": lambda a, b: a == b,
    "!=": lambda a, b: a != b,
    "<": lambda a, b: a < b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    ">=": lambda a, b: a >= b,
}
_ARROW_OPS = {"==": "equal", "!=": "not_equal", "<": "less", "<=": "less_equal", ">": "greater", ">=": "greater_equal"}
_INT_BITS = {f"{s}int{b}": (s == "", b) for s in ("", "u") for b in (8, 16, 32, 64)}
_NAMED_AST = {
    ast.Add: "+",
    ast.Pow: "**",
    ast.FloorDiv: "//",
    ast.LShift: "<<",
    ast.RShift: ">>",
    ast.USub: "-",
    ast.UAdd: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.Div: "/",
    ast.Mod: "%",
    ast.BitAnd: "&",
    ast.BitOr: "|",
    ast.BitXor: "^",
    ast.Invert: "~",
    ast.Is: "is",
    ast.IsNot: "is not",
}
_HINT = "use ==, !=, <, <=, >, >=, in, not in, is None, and, or, not, FIELD.contains(), FIELD.matches(), has_problem"


class FilterError(ValueError):
    """A filter that cannot be compiled: one line naming the wrong field, operator or constant."""


def frame_field_types() -> dict[str, str]:
    """The frames table's fields and their Arrow types (:data:`~.columns.FRAME_COLUMNS`, read now)."""
    from .columns import FRAME_COLUMNS

    return {name: kind for name, kind, _ in FRAME_COLUMNS}


# ---------------------------------------------------------------------------
# field kinds


@dataclass(frozen=True)
class _Field:
    name: str
    type: str

    @property
    def kind(self) -> str:
        t = self.type
        if t in _INT_BITS:
            return "int"
        if t.startswith("timestamp"):
            return "time"
        if t in ("string", "large_string", "utf8"):
            return "string"
        if t.startswith(("list<", "large_list<")):
            return "list"
        if t in ("float", "double", "float32", "float64", "halffloat"):
            return "float"
        if t in ("bool", "boolean"):
            return "bool"
        return "other"

    @property
    def bounds(self) -> tuple[int, int]:
        signed, bits = _INT_BITS[self.type]
        return (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)


def _time_ns(value: Any) -> int | None:
    """A row's time as integer ns (ints are ns already; datetimes and pandas Timestamps converted)."""
    if value is None or isinstance(value, int):
        return value
    ns = getattr(value, "value", None)  # pandas.Timestamp
    if isinstance(ns, int):
        return ns
    if isinstance(value, datetime):
        aware = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
        delta = aware - datetime(1970, 1, 1, tzinfo=UTC)
        return (delta.days * 86_400 + delta.seconds) * 1_000_000_000 + delta.microseconds * 1000
    raise TypeError(f"not a time: {value!r}")


# ---------------------------------------------------------------------------
# predicates: each evaluates a table (a boolean numpy array, no nulls) and a row


class _Pred:
    def rows(self, table: Any, n: int) -> Any:  # a pyarrow boolean array of n, no nulls
        raise NotImplementedError

    def row(self, row: Mapping[str, Any]) -> bool:
        raise NotImplementedError


def _no_nulls(mask: Any) -> Any:
    """A pyarrow boolean array with its nulls false."""
    import pyarrow.compute as pc

    return pc.fill_null(mask, False)


def _all(n: int, value: bool) -> Any:
    import numpy as np
    import pyarrow as pa

    return pa.array(np.full(n, value, bool), pa.bool_())


def _column(table: Any, name: str) -> Any:
    col = table.column(name)
    return col.combine_chunks() if hasattr(col, "combine_chunks") else col


@dataclass(frozen=True)
class _Const(_Pred):
    value: bool

    def rows(self, table: Any, n: int) -> Any:
        return _all(n, self.value)

    def row(self, row: Mapping[str, Any]) -> bool:
        return self.value


@dataclass(frozen=True)
class _And(_Pred):
    parts: tuple[_Pred, ...]

    def rows(self, table: Any, n: int) -> Any:
        import pyarrow.compute as pc

        out = self.parts[0].rows(table, n)
        for p in self.parts[1:]:
            out = pc.and_(out, p.rows(table, n))
        return out

    def row(self, row: Mapping[str, Any]) -> bool:
        return all(p.row(row) for p in self.parts)


@dataclass(frozen=True)
class _Or(_Pred):
    parts: tuple[_Pred, ...]

    def rows(self, table: Any, n: int) -> Any:
        import pyarrow.compute as pc

        out = self.parts[0].rows(table, n)
        for p in self.parts[1:]:
            out = pc.or_(out, p.rows(table, n))
        return out

    def row(self, row: Mapping[str, Any]) -> bool:
        return any(p.row(row) for p in self.parts)


@dataclass(frozen=True)
class _Not(_Pred):
    part: _Pred

    def rows(self, table: Any, n: int) -> Any:
        import pyarrow.compute as pc

        return pc.invert(self.part.rows(table, n))

    def row(self, row: Mapping[str, Any]) -> bool:
        return not self.part.row(row)


@dataclass(frozen=True)
class _Present(_Pred):
    """Not null (a list: not empty)."""

    field: _Field

    def rows(self, table: Any, n: int) -> Any:
        import pyarrow.compute as pc

        col = _column(table, self.field.name)
        if self.field.kind == "list":
            return _no_nulls(pc.greater(pc.list_value_length(col), 0))
        return _no_nulls(pc.is_valid(col))

    def row(self, row: Mapping[str, Any]) -> bool:
        v = row[self.field.name]
        return bool(v) if self.field.kind == "list" else v is not None


@dataclass(frozen=True)
class _Compare(_Pred):
    """``field OP value``; ``value`` already of the field's kind (int, float, str, bool; times as int ns)."""

    field: _Field
    op: str
    value: Any

    def rows(self, table: Any, n: int) -> Any:
        import pyarrow as pa
        import pyarrow.compute as pc

        f = self.field
        col = _column(table, f.name)
        value = self.value
        if f.kind == "int":
            lo, hi = f.bounds
            if not lo <= value <= hi:  # out of the type's range: the answer is the same for every value
                below = value < lo
                always = self.op in ("!=", ">", ">=") if below else self.op in ("!=", "<", "<=")
                return pc.is_valid(col) if always else _all(n, False)
            scalar = pa.scalar(value, col.type)
        elif f.kind == "time":
            col = col.cast(pa.int64())
            scalar = pa.scalar(value, pa.int64())
        else:
            scalar = pa.scalar(value, col.type)
        return _no_nulls(getattr(pc, _ARROW_OPS[self.op])(col, scalar))

    def row(self, row: Mapping[str, Any]) -> bool:
        v = row[self.field.name]
        if self.field.kind == "time":
            v = _time_ns(v)
        return v is not None and _PY_OPS[self.op](v, self.value)


@dataclass(frozen=True)
class _In(_Pred):
    field: _Field
    values: tuple[Any, ...]

    def rows(self, table: Any, n: int) -> Any:
        import pyarrow as pa
        import pyarrow.compute as pc

        f = self.field
        col = _column(table, f.name)
        values = list(self.values)
        if f.kind == "int":
            lo, hi = f.bounds
            values = [v for v in values if lo <= v <= hi]
        elif f.kind == "time":
            col = col.cast(pa.int64())
        if not values:
            return _all(n, False)
        return _no_nulls(pc.is_in(col, value_set=pa.array(values, col.type), skip_nulls=True))

    def row(self, row: Mapping[str, Any]) -> bool:
        v = row[self.field.name]
        if self.field.kind == "time":
            v = _time_ns(v)
        return v is not None and v in self.values


@dataclass(frozen=True)
class _Text(_Pred):
    """A text test (contains, startswith, endswith, matches, has_problem's any-case contains) of a string or any element of a list."""

    field: _Field
    method: str
    arg: str

    @cached_property
    def test(self) -> Callable[[str], bool]:
        """The test of one string."""
        arg = self.arg
        if self.method == "contains":
            return lambda s: arg in s
        if self.method == "startswith":
            return lambda s: s.startswith(arg)
        if self.method == "endswith":
            return lambda s: s.endswith(arg)
        if self.method == "icontains":
            folded = arg.casefold()
            return lambda s: folded in s.casefold()
        rx = re.compile(arg)
        return lambda s: rx.search(s) is not None

    def _strings(self, strings: Any) -> Any:
        """The test over a string array (a boolean array; nulls false)."""
        import pyarrow as pa
        import pyarrow.compute as pc

        if self.method in ("contains", "startswith", "endswith"):
            fn = {"contains": pc.match_substring, "startswith": pc.starts_with, "endswith": pc.ends_with}[self.method]
            return _no_nulls(fn(strings, pattern=self.arg))
        # Python's own test over the distinct values: the same answer as matches_row, whatever the regex
        distinct = pc.unique(strings).drop_null()
        test = self.test
        hits = [s for s in distinct.to_pylist() if test(s)]
        if not hits:
            return _all(len(strings), False)
        return _no_nulls(pc.is_in(strings, value_set=pa.array(hits, strings.type)))

    def rows(self, table: Any, n: int) -> Any:
        import numpy as np
        import pyarrow as pa
        import pyarrow.compute as pc

        col = _column(table, self.field.name)
        if self.field.kind != "list":
            return self._strings(col)
        flat = pc.list_flatten(col)
        out = np.zeros(n, bool)
        if len(flat):
            parents = pc.list_parent_indices(col).to_numpy(zero_copy_only=False)
            out[parents[self._strings(flat).to_numpy(zero_copy_only=False)]] = True
        return pa.array(out, pa.bool_())

    def row(self, row: Mapping[str, Any]) -> bool:
        v = row[self.field.name]
        if v is None:
            return False
        test = self.test
        if self.field.kind == "list":
            return any(s is not None and test(s) for s in v)
        return test(v)


# ---------------------------------------------------------------------------
# the compiled filter


@dataclass(frozen=True)
class FrameFilter:
    """A compiled display filter: :meth:`mask` over a table, :meth:`matches_row` over one row (they agree)."""

    #: the text it was compiled from
    text: str
    #: the fields it reads (select these columns before :meth:`mask`, if you like)
    fields: frozenset[str]
    _pred: _Pred

    def mask(self, table: pa.Table | pa.RecordBatch) -> pa.BooleanArray:
        """One boolean per row of ``table`` (never null): whether the row matches."""
        mask: pa.BooleanArray = self._pred.rows(table, table.num_rows)
        return mask

    def filter(self, table: pa.Table | pa.RecordBatch) -> pa.Table:
        """The rows of ``table`` that match, as a table."""
        import pyarrow as pa

        t = table if isinstance(table, pa.Table) else pa.Table.from_batches([table], schema=table.schema)
        return t.filter(self.mask(t))

    def matches_row(self, row: Mapping[str, Any]) -> bool:
        """Whether one row (column -> value: ints, strings, lists, ``None``; times as int ns or datetimes) matches."""
        return self._pred.row(row)

    def __str__(self) -> str:
        return self.text


def compile_filter(text: str, columns: Mapping[str, str] | None = None) -> FrameFilter:
    """Compile a display filter over ``columns`` (field -> Arrow type; the frames table's by default).

    Raises :class:`FilterError` (a ``ValueError``) with one line naming the
    wrong field, function, operator or constant.
    """
    fields = {name: _Field(name, kind) for name, kind in (frame_field_types() if columns is None else columns).items()}
    source = text.strip()
    if not source:
        raise FilterError("empty filter")
    try:
        tree = ast.parse(source, mode="eval")
        compiler = _Compiler(fields)
        pred = compiler.predicate(tree.body)
    except SyntaxError as exc:
        where = f" at column {exc.offset}" if exc.offset else ""
        hint = " (compare with '==', not '=')" if re.search(r"(?<![=!<>])=(?!=)", source) and "'=='" not in exc.msg else ""
        raise FilterError(f"syntax error{where}: {exc.msg}{hint}") from None
    except (RecursionError, MemoryError):
        raise FilterError("the filter is nested too deeply") from None
    except ValueError as exc:  # a NUL in the text, on some Pythons
        if isinstance(exc, FilterError):
            raise
        raise FilterError(f"not a filter: {exc}") from None
    return FrameFilter(text, frozenset(compiler.used), pred)


class _Compiler:
    def __init__(self, fields: Mapping[str, _Field]) -> None:
        self.fields = fields
        self.used: set[str] = set()

    # -- names and constants

    def field(self, node: ast.expr) -> _Field:
        if not isinstance(node, ast.Name):
            _no_operator(node)
            raise FilterError(f"expected a field name, got {_source(node)!r}; {_HINT}")
        f = self.fields.get(node.id)
        if f is None:
            raise FilterError(
                f"unknown field {node.id!r}{_did_you_mean(node.id, [*self.fields, _HAS_PROBLEM])}; 'dcpinspect fields' lists them"
            )
        self.used.add(f.name)
        return f

    def constant(self, node: ast.expr, f: _Field) -> Any:
        """The constant of ``node`` as ``f`` compares it."""
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
            value: Any = node.operand.value
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise FilterError(f"cannot negate {_source(node.operand)!r}")
            value = -value
        elif isinstance(node, ast.Constant):
            value = node.value
        else:
            _no_operator(node)
            raise FilterError(f"expected a constant to compare {f.name} with, got {_source(node)!r}; {_HINT}")
        if value is None:
            raise FilterError(f"a comparison with None is always false: write '{f.name} is None' or '{f.name} is not None'")
        return _coerce(f, value)

    # -- predicates

    def predicate(self, node: ast.expr) -> _Pred:
        if isinstance(node, ast.BoolOp):
            joined = tuple(self.predicate(v) for v in node.values)
            return _And(joined) if isinstance(node.op, ast.And) else _Or(joined)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return _Not(self.predicate(node.operand))
        if isinstance(node, ast.Compare):
            left = node.left
            parts: list[_Pred] = []
            for op, right in zip(node.ops, node.comparators, strict=True):
                parts.append(self.comparison(left, op, right))
                left = right
            return parts[0] if len(parts) == 1 else _And(tuple(parts))
        if isinstance(node, ast.Name):
            if node.id == _HAS_PROBLEM:
                return _Present(self.problems())
            return _Present(self.field(node))
        if isinstance(node, ast.Call):
            return self.call(node)
        if isinstance(node, ast.Constant) and isinstance(node.value, bool):
            return _Const(node.value)
        _no_operator(node)
        raise FilterError(f"not a condition: {_source(node)!r}; {_HINT}")

    def problems(self) -> _Field:
        f = self.fields.get(_PROBLEMS)
        if f is None or f.kind != "list":
            raise FilterError(f"has_problem needs a {_PROBLEMS!r} list field, which these fields do not have")
        self.used.add(f.name)
        return f

    def comparison(self, left: ast.expr, op: ast.cmpop, right: ast.expr) -> _Pred:
        if isinstance(op, (ast.Is, ast.IsNot)):
            if not (isinstance(right, ast.Constant) and right.value is None):
                raise FilterError(f"'{_NAMED_AST[type(op)]}' only tests None: write '{_source(left)} {_NAMED_AST[type(op)]} None'")
            present = _Present(self.field(left))
            if present.field.kind == "list":
                raise FilterError(
                    f"{present.field.name} is a list, never None: test it with has_problem or {present.field.name}.contains('...')"
                )
            return _Not(present) if isinstance(op, ast.Is) else present
        if isinstance(op, (ast.In, ast.NotIn)):
            f = self.field(left)
            self.comparable(f)
            if not isinstance(right, (ast.List, ast.Tuple, ast.Set)):
                raise FilterError(f"'in' takes a list of constants, e.g. {f.name} in [1, 2]; got {_source(right)!r}")
            values = tuple(self.constant(e, f) for e in right.elts)
            found = _In(f, values)
            if isinstance(op, ast.In):
                return found
            return _And((_Present(f), _Not(found)))  # a null is in no list and, compared, false
        name = _OPS.get(type(op))
        if name is None:  # pragma: no cover - every cmpop is handled above
            raise FilterError(f"operator {type(op).__name__} is not supported; {_HINT}")
        if not isinstance(left, ast.Name) and isinstance(right, ast.Name):  # 3 < seqno
            left, right, name = right, left, _FLIP[name]
        f = self.field(left)
        self.comparable(f)
        value = self.constant(right, f)
        if f.kind == "bool" and name not in ("==", "!="):
            raise FilterError(f"{f.name} is true or false: compare it with == or !=")
        return _Compare(f, name, value)

    def comparable(self, f: _Field) -> None:
        if f.kind == "list":
            raise FilterError(
                f"{f.name} is a list: use has_problem, has_problem('text'), {f.name}.contains('text') or {f.name}.matches('regex')"
            )
        if f.kind == "other":
            raise FilterError(f"{f.name} ({f.type}) cannot be compared; test it with '{f.name} is None'")

    def call(self, node: ast.Call) -> _Pred:
        if node.keywords:
            raise FilterError(f"{_source(node)!r}: functions take no keyword arguments")
        func = node.func
        if isinstance(func, ast.Name):
            if func.id != _HAS_PROBLEM:
                raise FilterError(f"unknown function {func.id!r}{_did_you_mean(func.id, [_HAS_PROBLEM])}; {_HINT}")
            f = self.problems()
            if not node.args:
                return _Present(f)
            return _Text(f, "icontains", self.text_argument(node, _HAS_PROBLEM))
        if not isinstance(func, ast.Attribute):
            raise FilterError(f"not a function of the filter language: {_source(func)!r}; {_HINT}")
        if func.attr not in _METHODS:
            raise FilterError(f"unknown function {func.attr!r}{_did_you_mean(func.attr, _METHODS)}; fields offer {', '.join(_METHODS)}")
        f = self.field(func.value)
        if f.kind not in ("string", "list"):
            raise FilterError(f"{f.name} is not text ({f.type}): {func.attr}() applies to text fields")
        arg = self.text_argument(node, func.attr)
        if func.attr == "matches":
            try:
                re.compile(arg)
            except re.error as exc:
                raise FilterError(f"bad regular expression {arg!r} in matches(): {exc}") from None
        return _Text(f, func.attr, arg)

    @staticmethod
    def text_argument(node: ast.Call, name: str) -> str:
        if len(node.args) != 1 or not isinstance(node.args[0], ast.Constant) or not isinstance(node.args[0].value, str):
            raise FilterError(f"{name}() takes one text argument, e.g. {name}('abc'); got {_source(node)!r}")
        return node.args[0].value


def _no_operator(node: ast.expr) -> None:
    """A :class:`FilterError` naming the operator when ``node`` is arithmetic or bitwise (``+``, ``&``, ``~`` ...)."""
    if isinstance(node, (ast.BinOp, ast.UnaryOp)):
        op = _NAMED_AST.get(type(node.op), type(node.op).__name__)
        hint = " (write 'and', 'or', 'not')" if op in ("&", "|", "~") else ""
        raise FilterError(f"operator {op!r} is not supported in a filter{hint}; {_HINT}")


def _coerce(f: _Field, value: Any) -> Any:
    """``value`` as field ``f`` compares it, or a :class:`FilterError`."""
    kind = f.kind
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise FilterError(f"{f.name} is a number ({f.type}): compare it with a number, not {value!r}")
        if isinstance(value, float):
            if not value.is_integer():
                raise FilterError(f"{f.name} is an integer ({f.type}): {value!r} is not one")
            value = int(value)
        return value
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise FilterError(f"{f.name} is a number ({f.type}): compare it with a number, not {value!r}")
        return float(value)
    if kind == "bool":
        if not isinstance(value, bool):
            raise FilterError(f"{f.name} is true or false: compare it with True or False, not {value!r}")
        return value
    if kind == "string":
        if not isinstance(value, str):
            raise FilterError(f"{f.name} is text: compare it with quoted text, e.g. {f.name} == '...', not {value!r}")
        return value
    if kind == "time":
        return _time_constant(f, value)
    raise FilterError(f"{f.name} ({f.type}) cannot be compared")  # pragma: no cover - comparable() came first


def _time_constant(f: _Field, value: Any) -> int:
    if isinstance(value, bool):
        raise FilterError(f"{f.name} is a time: compare it with ISO text ('2026-01-02 10:11:12') or epoch seconds")
    if isinstance(value, int):
        return value * 1_000_000_000
    if isinstance(value, float):
        return round(value * 1_000_000_000)
    if isinstance(value, str):
        try:
            when = datetime.fromisoformat(value)
        except ValueError:
            raise FilterError(f"{f.name}: {value!r} is not an ISO time such as '2026-01-02 10:11:12.5' (UTC)") from None
        ns = _time_ns(when)
        assert ns is not None
        return ns
    raise FilterError(f"{f.name} is a time: compare it with ISO text or epoch seconds, not {value!r}")


def _did_you_mean(name: str, known: Iterable[str]) -> str:
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _source(node: ast.AST) -> str:
    try:
        return ast.unparse(node)
    except Exception:  # pragma: no cover - unparse handles every parsed node
        return type(node).__name__
