"""Tables in the three forms Granite Vision writes them: HTML, OTSL and CSV, turned into safe HTML
and into rows of cell texts. Pure functions; malformed input raises ``TableError`` with one line.

The formats are constants here because a trained checkpoint's answers must parse with exactly these
rules (issue 21 trains the demo checkpoint on chart-to-CSV):

* CSV (:data:`CSV_FORMAT`): comma-separated, ``"`` quotes, first row the header, one row per line,
  optionally inside one Markdown code fence.
* OTSL (:data:`OTSL_TOKENS`): the Optimised Table Structure Language of Docling (Lysak et al. 2023,
  arXiv:2305.03393): one token per grid cell, ``<nl>`` ends a row; a cell token may be followed by
  its text and, as some writers do, its closing tag (``<fcel>Name</fcel>``).
* HTML: any ``<table>`` markup; only table and text-formatting tags survive (:data:`ALLOWED_TAGS`).
"""

import csv
import html
import io
import re
from dataclasses import dataclass
from html.parser import HTMLParser

import nh3

#: The CSV dialect chart-to-CSV answers are read with.
CSV_FORMAT = {"delimiter": ",", "quotechar": '"', "header": True}
#: OTSL's cell tokens: a full cell, an empty cell, merges with the cell to the left, above, or both;
#: Docling's extensions for a column header, a row header and a section row; and the row end.
OTSL_TOKENS = ("fcel", "ecel", "lcel", "ucel", "xcel", "ched", "rhed", "srow", "nl")
OTSL_ORIGINS = ("fcel", "ecel", "ched", "rhed", "srow")
#: The tags a sanitised table keeps: structure and plain text formatting, nothing that loads,
#: links, styles or runs. Attributes: only the spans.
ALLOWED_TAGS = {"table", "thead", "tbody", "tfoot", "tr", "th", "td", "caption", "b", "i", "em",
                "strong", "sub", "sup", "br", "p", "span", "div"}
ALLOWED_ATTRIBUTES = {"td": {"colspan", "rowspan"}, "th": {"colspan", "rowspan"}}
#: Tags removed together with their content (their text is code or styling, never table text).
DROPPED_WITH_CONTENT = {"script", "style", "iframe", "object", "embed", "svg", "math", "template",
                        "noscript", "title", "textarea", "select"}
#: The most rows and columns a table may have, and the widest span (a bigger one is a broken answer).
MAX_ROWS, MAX_COLUMNS, MAX_SPAN = 2000, 200, 200

FENCE = re.compile(r"^\s*```[\w+-]*[ \t]*\n(.*?)\n?```\s*$", re.DOTALL)


class TableError(ValueError):
    """An answer that cannot be read as a table; the message is one line naming where and why."""


@dataclass
class Table:
    """A table's cell texts row by row (spanned cells repeated as empty strings, so every row has
    the table's width), and the same table as sanitised HTML."""

    rows: list[list[str]]
    html: str


def strip_fence(text: str) -> str:
    """The answer without one enclosing Markdown code fence (```csv ... ```), else unchanged."""
    match = FENCE.match(text)
    return match.group(1) if match else text.strip()


def sanitize_html(markup: str) -> str:
    """Only :data:`ALLOWED_TAGS` with their span attributes survive; scripts, styles, frames, SVG,
    images, links, event handlers and comments are removed (nh3, the Rust ``ammonia`` sanitiser)."""
    return nh3.clean(markup, tags=ALLOWED_TAGS, clean_content_tags=DROPPED_WITH_CONTENT,
                     attributes=ALLOWED_ATTRIBUTES, url_schemes=set(), strip_comments=True, link_rel=None)


def rows_html(rows: list[list[str]], header: bool = True) -> str:
    """Rows of plain cell texts as an escaped HTML table (first row in ``th`` when ``header``)."""
    lines = []
    for index, row in enumerate(rows):
        tag = "th" if header and index == 0 else "td"
        lines.append("<tr>" + "".join(f"<{tag}>{html.escape(cell)}</{tag}>" for cell in row) + "</tr>")
    return "<table>" + "".join(lines) + "</table>"


def parse_csv(text: str) -> Table:
    """A chart-to-CSV answer as rows. Refuses an empty answer, a single column without commas (prose,
    not CSV) and rows whose width differs from the header's, naming the row."""
    body = strip_fence(text)
    if not body.strip():
        raise TableError("the answer is empty")
    reader = csv.reader(io.StringIO(body), delimiter=CSV_FORMAT["delimiter"], quotechar=CSV_FORMAT["quotechar"])
    try:
        rows = [[cell.strip() for cell in row] for row in reader if any(cell.strip() for cell in row)]
    except csv.Error as err:
        raise TableError(f"not CSV: {err}") from None
    if not rows:
        raise TableError("not CSV: no cell has any text")
    width = len(rows[0])
    if width < 2:
        raise TableError("not CSV: the first line has no comma-separated columns")
    for number, row in enumerate(rows[1:], start=2):
        if len(row) != width:
            raise TableError(f"row {number} has {len(row)} cells, the header has {width}")
    _check_size(len(rows), width)
    return Table(rows, rows_html(rows))


def parse_html_table(markup: str) -> Table:
    """An HTML answer as sanitised HTML and rows. Refuses an answer without a ``<table>`` or with
    no cells; spans beyond :data:`MAX_SPAN` or tables beyond the size limits."""
    clean = sanitize_html(strip_fence(markup))
    return Table(_grid(html_cells(clean)), clean)


def html_cells(markup: str) -> list[list[tuple[str, int, int]]]:
    """The (text, colspan, rowspan) of each cell, row by row, of the (sanitised) table markup:
    the tree TEDS compares. Refuses markup without a ``<table>`` or without cells."""
    reader = _CellReader()
    reader.feed(sanitize_html(markup))
    reader.close()
    if not reader.saw_table:
        raise TableError("no <table> in the answer")
    if not reader.rows or not any(reader.rows):
        raise TableError("the table has no cells")
    return [row for row in reader.rows if row]


class _CellReader(HTMLParser):
    """Collects (text, colspan, rowspan) per cell, row by row, from sanitised HTML."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.rows: list[list[tuple[str, int, int]]] = []
        self.saw_table = False
        self._cell: list[str] | None = None
        self._spans = (1, 1)

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.saw_table = True
        elif tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            if not self.rows:
                self.rows.append([])
            values = dict(attrs)
            self._spans = (_span(values.get("colspan")), _span(values.get("rowspan")))
            self._cell = []

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.rows[-1].append((" ".join("".join(self._cell).split()), *self._spans))
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def _span(value) -> int:
    try:
        span = int(value) if value is not None else 1
    except ValueError:
        raise TableError(f"a cell span is not a number: {value!r}") from None
    if not 1 <= span <= MAX_SPAN:
        raise TableError(f"a cell span of {span} is outside 1-{MAX_SPAN}")
    return span


def _grid(cells: list[list[tuple[str, int, int]]]) -> list[list[str]]:
    """(text, colspan, rowspan) rows -> a rectangular grid of texts (covered places empty).
    The size limits are checked before each cell's places are filled, so a few large spans cannot
    make a huge grid."""
    taken: dict[tuple[int, int], str] = {}
    for r, row in enumerate(cells):
        c = 0
        for text, colspan, rowspan in row:
            while (r, c) in taken:
                c += 1
            _check_size(r + rowspan, c + colspan)
            for dr in range(rowspan):
                for dc in range(colspan):
                    taken[(r + dr, c + dc)] = text if dr == dc == 0 else ""
            c += colspan
    height = max(r for r, _ in taken) + 1
    width = max(c for _, c in taken) + 1
    _check_size(height, width)
    return [[taken.get((r, c), "") for c in range(width)] for r in range(height)]


def _check_size(rows: int, columns: int) -> None:
    if rows > MAX_ROWS or columns > MAX_COLUMNS:
        raise TableError(f"the table is too large: {rows} x {columns} (the limit is {MAX_ROWS} x {MAX_COLUMNS})")


OTSL_TOKEN = re.compile(r"</?(%s)>" % "|".join(OTSL_TOKENS))


def parse_otsl(text: str) -> Table:
    """An OTSL answer as rows and escaped HTML with the spans the merge tokens describe.

    Refuses text without OTSL cells, rows of different widths, and merges that point outside the
    table (an ``lcel`` in the first column, a ``ucel`` in the first row), naming the place.
    """
    grid = _otsl_grid(strip_fence(text).replace("<otsl>", "").replace("</otsl>", ""))
    width = len(grid[0])
    for r, row in enumerate(grid, start=1):
        if len(row) != width:
            raise TableError(f"OTSL row {r} has {len(row)} cells, row 1 has {width}")
    _check_size(len(grid), width)
    lines, rows = [], []
    for r, row in enumerate(grid):
        cells, texts = [], []
        for c, (token, content) in enumerate(row):
            if token in ("lcel", "xcel") and c == 0:
                raise TableError(f"OTSL row {r + 1}: <{token}> in the first column merges with nothing")
            if token in ("ucel", "xcel") and r == 0:
                raise TableError(f"OTSL row 1, column {c + 1}: <{token}> in the first row merges with nothing")
            texts.append(content if token in OTSL_ORIGINS else "")
            if token in OTSL_ORIGINS:
                cells.append(_otsl_cell(grid, r, c, token, content))
        rows.append(texts)
        lines.append("<tr>" + "".join(cells) + "</tr>")
    return Table(rows, "<table>" + "".join(lines) + "</table>")


def _otsl_grid(text: str) -> list[list[tuple[str, str]]]:
    """OTSL text -> rows of (token, its text) in reading order."""
    rows: list[list[tuple[str, str]]] = [[]]
    position = 0
    for match in OTSL_TOKEN.finditer(text):
        between = text[position:match.start()].strip()
        position = match.end()
        if between and rows[-1]:
            token, content = rows[-1][-1]
            rows[-1][-1] = (token, (content + " " + between).strip())
        if match.group(0).startswith("</"):
            continue
        token = match.group(1)
        if token == "nl":
            rows.append([])
        else:
            rows[-1].append((token, ""))
    trailing = text[position:].strip()
    if trailing and rows[-1]:
        rows[-1][-1] = (rows[-1][-1][0], (rows[-1][-1][1] + " " + trailing).strip())
    rows = [row for row in rows if row]
    if not rows:
        raise TableError("no OTSL cells (<fcel>, <ecel>, ...) in the answer")
    return rows


def _otsl_cell(grid, r: int, c: int, token: str, content: str) -> str:
    """One origin cell as a ``td``/``th`` whose spans count the merges to its right and below."""
    colspan = 1
    while c + colspan < len(grid[r]) and grid[r][c + colspan][0] in ("lcel", "xcel"):
        colspan += 1
    rowspan = 1
    while r + rowspan < len(grid) and grid[r + rowspan][c][0] in ("ucel", "xcel"):
        rowspan += 1
    tag = "th" if token == "ched" else "td"
    spans = (f' colspan="{colspan}"' if colspan > 1 else "") + (f' rowspan="{rowspan}"' if rowspan > 1 else "")
    return f"<{tag}{spans}>{html.escape(content)}</{tag}>"
