"""The example document: a two-page PDF (a bar chart, then a table) drawn by our own code.

Its data are constants here, so a test or a dataset run knows the right answers: the chart's CSV is
what ``<chart2csv>`` should produce for page 1, the table's rows what ``<tables_html>`` should
produce for page 2. ``python -m g4v.documents.examples`` rewrites ``assets/examples/report.pdf``
(and a PNG of each page) byte for byte: the PDF carries no creation date, and matplotlib's PDF
writer is otherwise deterministic.
"""

import sys
from pathlib import Path

from g4v.paths import EXAMPLES_DIR

REPORT_PDF = EXAMPLES_DIR / "report.pdf"
#: One PNG per page, for the Chat examples (rendered from the PDF, so they show what the model sees).
REPORT_PAGE_PNGS = (EXAMPLES_DIR / "report-chart.png", EXAMPLES_DIR / "report-table.png")
PNG_DPI = 96

#: Page 1: units sold per quarter, as the chart draws them.
CHART_TITLE = "Units sold per quarter"
CHART_ROWS = [("Quarter", "Units"), ("Q1", "120"), ("Q2", "95"), ("Q3", "140"), ("Q4", "160")]
#: Page 2: a small price list.
TABLE_TITLE = "Price list"
TABLE_ROWS = [("Item", "Price", "Stock"), ("Pencil", "0.50", "300"), ("Notebook", "2.20", "85"),
              ("Ruler", "1.10", "40")]
#: A4 in inches, the page size of both pages.
PAGE_INCHES = (8.27, 11.69)


def chart_csv() -> str:
    """Page 1's data as the CSV a perfect ``<chart2csv>`` answer holds."""
    return "\n".join(",".join(row) for row in CHART_ROWS)


def table_html() -> str:
    """Page 2's table as the HTML a perfect ``<tables_html>`` answer holds (header row in ``th``)."""
    head, *body = TABLE_ROWS
    rows = ["<tr>" + "".join(f"<th>{cell}</th>" for cell in head) + "</tr>"]
    rows += ["<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in body]
    return "<table>" + "".join(rows) + "</table>"


def write_report(path: Path = REPORT_PDF) -> Path:
    """Draw both pages into ``path`` (a PDF without dates, so the bytes depend on the data only)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.backends.backend_pdf import PdfPages

    metadata = {"Creator": "g4v.documents.examples", "Producer": None, "CreationDate": None,
                "Title": "g4v example report"}
    with matplotlib.rc_context({"svg.hashsalt": "g4v", "pdf.fonttype": 42}):
        with PdfPages(path, metadata=metadata) as pdf:
            pdf.savefig(_chart_page(plt))
            pdf.savefig(_table_page(plt))
            plt.close("all")
    return path


def _chart_page(plt):
    figure = plt.figure(figsize=PAGE_INCHES)
    axes = figure.add_axes((0.15, 0.55, 0.7, 0.35))
    labels = [row[0] for row in CHART_ROWS[1:]]
    values = [int(row[1]) for row in CHART_ROWS[1:]]
    axes.bar(labels, values, color="#3b6fb6")
    axes.set_title(CHART_TITLE, fontsize=16)
    axes.set_xlabel(CHART_ROWS[0][0])
    axes.set_ylabel(CHART_ROWS[0][1])
    for x, value in enumerate(values):
        axes.text(x, value + 2, str(value), ha="center")
    return figure


def _table_page(plt):
    figure = plt.figure(figsize=PAGE_INCHES)
    axes = figure.add_axes((0.1, 0.6, 0.8, 0.3))
    axes.axis("off")
    axes.set_title(TABLE_TITLE, fontsize=16)
    table = axes.table(cellText=[list(row) for row in TABLE_ROWS[1:]], colLabels=list(TABLE_ROWS[0]),
                       loc="center", cellLoc="center")
    table.scale(1, 2.5)
    table.set_fontsize(14)
    return figure


def write_page_pngs(pdf_path: Path = REPORT_PDF) -> list[Path]:
    """Each page of the report rendered (through :mod:`g4v.documents.pdf`, as users get it) to PNG."""
    from g4v.documents.pdf import render_pages

    images = render_pages(pdf_path, list(range(1, len(REPORT_PAGE_PNGS) + 1)), dpi=PNG_DPI)
    for image, png in zip(images, REPORT_PAGE_PNGS):
        image.save(png, optimize=False)
    return list(REPORT_PAGE_PNGS)


def main(argv=None) -> int:
    write_report()
    for path in [REPORT_PDF, *write_page_pngs()]:
        print(path.relative_to(EXAMPLES_DIR.parent.parent))
    return 0


if __name__ == "__main__":
    sys.exit(main())
