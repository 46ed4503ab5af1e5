"""Annotation in the protocol docs' own style: the 4-byte grid and the breakdown.

``byte_table`` draws the grid exactly like the kv_engine DCP docs (and, for the
``upr`` dialect, like the UPR draft); ``breakdown`` prints the
``Field (offset) (value)`` table; ``annotate`` is both, with reading aids
the seed documents do not print (seqnos, lengths and counts also in decimal,
a CAS as its hybrid logical clock time, status 0 as ``(Success)``);
``breakdown`` alone prints exactly what the seed documents print unless asked
for them (``notes=True``).  ``annotate_html`` is
the notebook form: each field's bytes coloured and linked to its breakdown row,
every piece of wire text HTML-escaped.  Pure functions of their input: no I/O.
"""

from __future__ import annotations

import html
import itertools
import re
from datetime import UTC, datetime, timedelta

from ..protocol.enums import Status
from ..protocol.spec import STATUS
from .dissect import dissect, dissect_truncated
from .dissection import INT_KINDS, DissectContext, Dissection, FieldValue
from .events import Frame, Gap, Garbage, Truncated, set_renderers

__all__ = ["annotate", "annotate_html", "breakdown", "byte_table", "hlc_text", "plural", "safe_text", "summary"]

CELL = 15  # characters between two '|' of the grid
DEFAULT_MAX_ROWS = 64  # grid rows before long frames are elided (the breakdown lists everything)
MAX_VALUE_CHARS = 96  # breakdown: longer text values are shortened

Annotatable = Frame | Dissection | Garbage | Truncated | Gap | bytes


def plural(n: int, word: str, words: str | None = None) -> str:
    """``n`` and the word in the number it needs: ``1 item``, ``2 items``, ``0 entries`` (``words``: an irregular plural).

    Every count a message prints goes through it: never ``1 items``.
    """
    return f"{n} {word if n == 1 else words or word + 's'}"


def safe_text(s: str, limit: int | None = None) -> str:
    """Wire text made safe for a terminal: control characters escaped, optionally shortened."""
    out = "".join(c if c.isprintable() else (repr(c)[1:-1] if c != "\\" else c) for c in s)
    if limit is not None and len(out) > limit:
        out = out[:limit] + f"... ({len(s)} chars)"
    return out


def _as_dissection(obj: Frame | Dissection, context: DissectContext | None) -> Dissection:
    return obj if isinstance(obj, Dissection) else dissect(obj, context)


# ---------------------------------------------------------------------------
# grid


def _byte_marks(d: Dissection | None, n: int) -> tuple[list[bool], list[bool]]:
    """Per byte: whether to show its character, and whether it is a masked secret."""
    text = [False] * n
    secret = [False] * n
    if d is None:
        return text, secret
    for f in d.fields:
        if f.kind == "text" and f.depth <= 1 and not f.path.startswith(("header.", "extras.", "framing")):
            for i in range(f.offset, min(f.offset + f.length, n)):
                text[i] = True
        if f.secret:
            for i in range(f.offset, min(f.offset + f.length, n)):
                secret[i] = True
    for s, ln in d.secrets:
        for i in range(s, min(s + ln, n)):
            secret[i] = True
    return text, secret


def _cell(b: int, show_char: bool, secret: bool, upr: bool) -> str:
    if secret:
        txt = "**" if upr else "0x**"
    else:
        txt = f"{b:02X}" if upr else f"0x{b:02x}"
        if show_char and not upr and 0x20 <= b < 0x7F:  # the UPR draft draws no characters
            txt += f" ('{chr(b)}')"
    if upr:
        return txt.center(CELL) if len(txt) == 2 else (" " * 4 + txt).ljust(CELL)
    return (" " + txt).ljust(CELL)


def _grid_lines(data: bytes, marks: tuple[list[bool], list[bool]], upr: bool, max_rows: int | None) -> list[str]:
    n = len(data)
    rows = (n + 3) // 4
    last_off = max(0, (rows - 1) * 4)
    w = max(4, len(str(last_off)) + 1)
    pad = " " * w
    sep4 = pad + "+" + "+".join(["-" * CELL] * 4) + "+"
    lines = [
        " " * (w - 2) + "Byte/     0       |       1       |       2       |       3       |",
        " " * (w + 1) + "/              |               |               |               |",
        pad + "|0 1 2 3 4 5 6 7|0 1 2 3 4 5 6 7|0 1 2 3 4 5 6 7|0 1 2 3 4 5 6 7|",
        sep4,
    ]
    show_char, secret = marks
    keep = range(rows)
    elide_from = elide_to = -1
    if max_rows is not None and rows > max_rows >= 3:
        elide_from, elide_to = max_rows - 2, rows - 1  # rows [elide_from, elide_to) are not drawn
        keep = itertools.chain(range(elide_from), range(elide_to, rows))  # type: ignore[assignment]
    for r in keep:
        if r == elide_to and elide_from >= 0:
            a, b = elide_from * 4, elide_to * 4 - 1
            note = f" {plural(b - a + 1, 'byte')} not shown (offsets {a}-{b})"
            lines.append("...".rjust(w) + "|" + note.ljust(4 * CELL + 3) + "|")
            lines.append(sep4)
        off = r * 4
        cells = [_cell(data[i], show_char[i], secret[i], upr) for i in range(off, min(off + 4, n))]
        lines.append(str(off).rjust(w) + "|" + "|".join(cells) + "|")
        lines.append(pad + "+" + "+".join(["-" * CELL] * len(cells)) + "+")
    return lines


def byte_table(
    obj: Annotatable,
    *,
    context: DissectContext | None = None,
    max_rows: int | None = DEFAULT_MAX_ROWS,
    style: str | None = None,
) -> str:
    """The 4-byte grid of a frame (or of garbage/truncated bytes), as the docs draw it.

    Printable key/value bytes show their character (``0x62 ('b')``); masked
    secrets show ``0x**``.  Frames longer than ``max_rows`` rows are elided with
    one marked row.  ``style`` is ``"docs"`` (``0xNN`` cells) or ``"upr"`` (the
    UPR draft's centred bare hex); the default follows the frame's dialect.
    """
    d: Dissection | None = None
    if isinstance(obj, Gap):
        return ""
    if isinstance(obj, (Frame, Dissection)):
        d = _as_dissection(obj, context)
        data = d.frame.raw
        upr = (style or ("upr" if d.frame.dialect == "upr" else "docs")) == "upr"
    else:
        data = obj if isinstance(obj, bytes) else obj.data
        upr = style == "upr"
    return "\n".join(_grid_lines(data, _byte_marks(d, len(data)), upr, max_rows))


# ---------------------------------------------------------------------------
# breakdown


def offset_text(f: FieldValue) -> str:
    """``(n)``, ``(a,b)`` or ``(a-b)`` as the docs write byte ranges."""
    if f.length == 0:
        return "(-)"
    if f.length == 1:
        return f"({f.offset})"
    if f.length == 2:
        return f"({f.offset},{f.offset + 1})"
    return f"({f.offset}-{f.offset + f.length - 1})"


#: fields (by their path's last name) whose value is a number to read, not a bit pattern: the notes add it in decimal
_DECIMAL = re.compile(r"(seqno|length|_bytes|nmeta|counter|delta|initial|expiration|lock_time|max_ttl|revision)$")
_STATUS_PATH = "header.status"
_CAS_PATH = "header.cas"
_HLC_LOGICAL = 0xFFFF  # kv_engine hlc.h: the low 16 bits of an HLC CAS are a logical counter, the rest nanoseconds
_HLC_FROM = 10**18  # nanoseconds of 2001-09-09: a CAS below it is not an HLC time (a counter, or a test's CAS)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def hlc_text(cas: int) -> str | None:
    """A CAS read as its hybrid logical clock time, ``HLC 2026-01-02 10:11:12.123456 UTC``; ``None`` when it is none.

    kv_engine (``hlc.h``, ``HLC::nextHLC``) makes a CAS from the system clock's
    nanoseconds since the epoch with the low 16 bits cleared, and counts in
    those bits when the clock has not moved on; so the time is the CAS with
    its low 16 bits cleared.  A CAS of 0 or one before 2001 (an old counter
    CAS, a test's) is no time.
    """
    if cas < _HLC_FROM:
        return None
    when = _EPOCH + timedelta(microseconds=(cas & ~_HLC_LOGICAL) // 1000)
    return f"HLC {when:%Y-%m-%d %H:%M:%S.%f} UTC"


def _note(f: FieldValue) -> str | None:
    """The reading aid of a field (``notes``): a number in decimal, a CAS's HLC time, status 0's name."""
    v = f.value
    if not isinstance(v, int) or isinstance(v, bool) or f.secret:
        return None
    name = f.path.rsplit(".", 1)[-1].split("[", 1)[0]
    if f.path == _STATUS_PATH and v == Status.SUCCESS and not f.meaning:
        return STATUS[Status.SUCCESS]
    if f.path == _CAS_PATH:
        return hlc_text(v)
    if f.kind == "uint" and v >= 10 and _DECIMAL.search(name):
        return str(v)  # below 10 the hex says the same
    return None


def value_text(f: FieldValue, *, notes: bool = False) -> str:
    """A field's value as the breakdown prints it (zero-padded hex + meaning, or text).

    ``notes`` adds reading aids the seed documents do not print: seqnos,
    lengths and counts also in decimal, a CAS as its HLC time, status 0 as
    ``(Success)``.
    """
    v = f.value
    if f.secret:
        shown = v if isinstance(v, str) else "********"
    elif f.kind in INT_KINDS and isinstance(v, int) and not isinstance(v, bool):
        width = 2 * f.length if f.kind != "leb128" else 2
        shown = f"0x{v:0{width}x}" if v >= 0 else f"-0x{-v:0{width}x}"
    elif isinstance(v, bytes):
        hx = v.hex()
        shown = "0x" + (hx if len(hx) <= 2 * MAX_VALUE_CHARS // 2 else hx[:MAX_VALUE_CHARS] + f"... ({plural(len(v), 'byte')})")
    elif isinstance(v, bool):
        shown = "true" if v else "false"
    elif v is None:
        shown = ""
    else:
        shown = safe_text(str(v), MAX_VALUE_CHARS)
    if f.meaning:
        shown += f" ({safe_text(f.meaning)})"
    note = _note(f) if notes else None
    if note:
        shown += f" ({note})"
    return shown


def _breakdown_lines(d: Dissection, notes: bool = False) -> tuple[list[str], list[str], list[str]]:
    """(title and column header, one row per field, one line per problem)."""
    rows = [("  " * f.depth + f.label, offset_text(f), value_text(f, notes=notes)) for f in d.fields]
    lw = max([len("Field")] + [len(r[0]) for r in rows]) + 1
    ow = max([0] + [len(r[1]) for r in rows])
    head = [d.title, "Field".ljust(lw) + "(offset) (value)"]
    body = [(label.ljust(lw) + off.ljust(ow) + ": " + val).rstrip() for label, off, val in rows]
    problems = []
    for p in d.problems:
        where = f" (bytes {p.offset}-{p.offset + p.length - 1})" if p.length > 1 else (f" (byte {p.offset})" if p.length == 1 else "")
        problems.append(f"! {safe_text(p.message)}{where}")
    return head, body, problems


def breakdown(obj: Frame | Dissection, *, context: DissectContext | None = None, notes: bool = False) -> str:
    """The ``Field (offset) (value)`` table, titled ``<NAME> command|response``.

    Header fields flush left, extras and value sub-fields indented two spaces,
    problems as trailing ``! ...`` lines.  By default exactly as the seed
    documents print it; ``notes`` adds the reading aids of :func:`value_text`.
    """
    head, body, problems = _breakdown_lines(_as_dissection(obj, context), notes)
    return "\n".join(head + body + problems)


def _event_line(obj: Garbage | Truncated | Gap) -> str:
    if isinstance(obj, Gap):
        return f"gap: {plural(obj.length, 'byte')} missing at offset {obj.offset}"
    return f"{obj.type}: {plural(len(obj.data), 'byte')} at offset {obj.offset} ({safe_text(obj.reason)})"


def annotate(
    obj: Annotatable,
    *,
    context: DissectContext | None = None,
    max_rows: int | None = DEFAULT_MAX_ROWS,
    notes: bool = True,
) -> str:
    """Grid, a blank line, then the breakdown (with its reading aids unless ``notes=False``); garbage/truncated/gap get a one-line reason."""
    if isinstance(obj, Truncated) and (d := dissect_truncated(obj, context)) is not None:
        # a truncated frame whose header was captured: dissected as far as its bytes go, the rest marked as not captured
        return _event_line(obj) + "\n" + byte_table(d, max_rows=max_rows) + "\n\n" + breakdown(d, notes=notes)
    if isinstance(obj, (Garbage, Truncated, Gap)):
        grid = byte_table(obj, max_rows=max_rows)
        return _event_line(obj) + ("\n" + grid if grid else "")
    if isinstance(obj, bytes):
        return byte_table(obj, max_rows=max_rows)
    d = _as_dissection(obj, context)
    return byte_table(d, max_rows=max_rows) + "\n\n" + breakdown(d, notes=notes)


def summary(obj: Frame | Dissection, *, context: DissectContext | None = None) -> str:
    """One line per frame, for lists and logs."""
    d = _as_dissection(obj, context)
    fr = d.frame
    parts = [f"@{fr.offset}", d.title]
    if fr.dialect == "mcbp":
        parts.append(f"status=0x{fr.status:04x}" if fr.is_response else f"vb={fr.vbucket}")
        parts.append(f"opaque=0x{fr.opaque:08x}")
        if d.key:
            parts.append("key=" + safe_text(repr(d.key_text), 40))
        for name in ("by_seqno", "start_seqno", "seqno"):
            if name in d.extras:
                parts.append(f"{name}={d.extras[name]}")
                break
    if d.problems:
        parts.append(f"[{plural(len(d.problems), 'problem')}]")
    return " ".join(parts)


# ---------------------------------------------------------------------------
# HTML

#: Okabe-Ito (colour-blind safe) tints, readable on light and dark backgrounds
PALETTE = ("#e69f0055", "#56b4e955", "#009e7355", "#f0e44255", "#0072b255", "#d55e0055", "#cc79a755", "#99999955")
_uid = itertools.count(1)
#: the grid only lines up in a fixed-width font kept on one line: JupyterLab's output
#: area (and so ipywidgets' HTML in JupyterLab and Voila) styles ``pre`` with the
#: surrounding proportional font, ``pre-wrap`` and ``break-all``
_PRE = "font-family:var(--jp-code-font-family,monospace);white-space:pre;word-break:normal;overflow-x:auto"


def annotate_html(
    obj: Annotatable, *, context: DissectContext | None = None, max_rows: int | None = DEFAULT_MAX_ROWS, notes: bool = True
) -> str:
    """Notebook HTML: coloured grid cells linked to breakdown rows (as :func:`annotate`'s); all wire text escaped."""
    if isinstance(obj, Truncated) and (d := dissect_truncated(obj, context)) is not None:
        return f'<pre style="{_PRE}">' + html.escape(_event_line(obj)) + "</pre>" + annotate_html(d, max_rows=max_rows, notes=notes)
    if not isinstance(obj, (Frame, Dissection)):
        return f'<pre style="{_PRE}">' + html.escape(annotate(obj, max_rows=max_rows)) + "</pre>"
    d = _as_dissection(obj, context)
    data = d.frame.raw
    n = len(data)
    uid = f"dcpi{next(_uid)}"
    owner = [-1] * n
    size = [n + 1] * n
    for i, f in enumerate(d.fields):
        for b in range(f.offset, min(f.offset + f.length, n)):
            if f.length <= size[b]:
                owner[b] = i
                size[b] = f.length
    upr = d.frame.dialect == "upr"
    show_char, secret = _byte_marks(d, n)
    grid = _grid_lines(data, (show_char, secret), upr, max_rows)
    out: list[str] = []
    # rows of bytes are lines 4, 6, 8 ...; rebuild their cells with markup
    for line in grid:
        head, sep, rest = line.partition("|")
        if not sep or not head.strip().isdigit():
            out.append(html.escape(line))
            continue
        row_off = int(head)
        cells = rest.split("|")[:-1]
        marked = []
        for j, cell in enumerate(cells):
            b = row_off + j
            i = owner[b] if b < n else -1
            if i < 0:
                marked.append(html.escape(cell))
                continue
            f = d.fields[i]
            marked.append(
                f'<a href="#{uid}-f{i}" class="f{i}" title="{html.escape(f.label.strip())}"'
                f' style="background:{PALETTE[i % len(PALETTE)]};color:inherit;text-decoration:none">{html.escape(cell)}</a>'
            )
        out.append(html.escape(head) + "|" + "|".join(marked) + "|")
    title, body, problems = _breakdown_lines(d, notes)
    bd = [html.escape(line) for line in title]
    for i, row in enumerate(body):
        bd.append(f'<span id="{uid}-f{i}" class="f{i}" style="background:{PALETTE[i % len(PALETTE)]}">{html.escape(row)}</span>')
    bd += [f'<span style="color:#d55e00">{html.escape(line)}</span>' for line in problems]
    hover = "".join(f"#{uid}:has(.f{i}:hover) .f{i}{{outline:2px solid currentColor}}" for i in range(len(d.fields)))
    return (
        f'<div id="{uid}" class="dcpinspect-annotation"><style>{hover}</style>'
        f'<pre style="line-height:1.25;{_PRE}">{chr(10).join(out)}\n\n{chr(10).join(bd)}</pre></div>'
    )


# the display hooks of frames and dissections (IPython, notebooks) draw with these
set_renderers(text=annotate, html=annotate_html)
