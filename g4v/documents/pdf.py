"""PDF pages as pictures: every page a user picks becomes one RGB image, or one line saying why not.

Rendering goes through PDFium (``pypdfium2``), the engine Chrome uses, in process: no shell-out.
Nothing in the file runs: forms are never initialised (so no form actions and no JavaScript, and
PDFium builds from PyPI carry no JavaScript engine anyway), links and attachments are ignored, only
page content is drawn. Every limit is checked before the work it guards: the file size before
reading, the page count before rendering, each page's pixel count before its bitmap exists.

PDFium is not thread-safe, and the app calls it from several request threads, so every call into it
holds one module lock.
"""

import math
import os
import re
import threading
from contextlib import contextmanager
from pathlib import Path

from PIL import Image

from g4v.conversation import MAX_IMAGES_PER_MESSAGE
from g4v.errors import G4VError, quoted
from g4v.images import MAX_IMAGE_PIXELS, to_rgb

#: Larger files are refused before they are read.
MAX_PDF_BYTES = int(os.environ.get("G4V_MAX_PDF_BYTES", 50 * 1024 * 1024))
#: Documents with more pages are refused (the page picker draws a thumbnail of each page).
MAX_PDF_PAGES = int(os.environ.get("G4V_MAX_PDF_PAGES", 300))
#: Render resolution in dots per inch: the default, and the range a user may choose.
DEFAULT_DPI = 144
MIN_DPI, MAX_DPI = 36, 300
#: Thumbnails for the page picker: their width in pixels, and at most this many of them.
THUMBNAIL_WIDTH = 160
MAX_THUMBNAILS = 60
#: A PDF's header may follow some junk bytes; readers look this far for ``%PDF-``.
HEADER_WINDOW = 1024
POINTS_PER_INCH = 72

_PDFIUM_LOCK = threading.RLock()
EMPTY_PAGE_TREE = re.compile(rb"/Count\s*0\b")
PAGE_OBJECT = re.compile(rb"/Type\s*/Page(?![a-zA-Z])")


def looks_like_pdf(source) -> bool:
    """True for a ``.pdf`` name or bytes that start like a PDF: which opener a path goes to."""
    if isinstance(source, (bytes, bytearray)):
        return b"%PDF-" in bytes(source[:HEADER_WINDOW])
    return Path(str(source)).suffix.lower() == ".pdf"


def read_pdf(source, name: str | None = None) -> tuple[bytes, str]:
    """The file's bytes and the name errors use (the base name only: server paths stay private).

    Refuses a missing file, a directory, a file over :data:`MAX_PDF_BYTES` (from its size, before
    reading) and bytes without a ``%PDF-`` header.
    """
    if isinstance(source, (bytes, bytearray)):
        data, label = bytes(source), name or "document.pdf"
        if len(data) > MAX_PDF_BYTES:
            raise G4VError(f"{label} is too large: {len(data):,} bytes (the limit is {MAX_PDF_BYTES:,})")
    else:
        path = Path(source)
        label = name or path.name
        if not path.exists():
            raise G4VError(f"document not found: {label}")
        if not path.is_file():
            raise G4VError(f"not a file: {label}")
        size = path.stat().st_size
        if size > MAX_PDF_BYTES:
            raise G4VError(f"{label} is too large: {size:,} bytes (the limit is {MAX_PDF_BYTES:,})")
        data = path.read_bytes()
    if not data:
        raise G4VError(f"{label} is empty")
    if b"%PDF-" not in data[:HEADER_WINDOW]:
        raise G4VError(f"{label} is not a PDF (no %PDF- header)")
    return data, label


@contextmanager
def open_pdf(data: bytes, label: str):
    """The PDFium document for checked bytes, closed afterwards; holds the PDFium lock throughout.

    Refuses encrypted (password-protected), corrupt, zero-page and too-long documents in one line.
    """
    try:
        import pypdfium2 as pdfium
    except ImportError:
        raise G4VError("PDF input needs pypdfium2 in this environment (pip install pypdfium2)") from None

    with _PDFIUM_LOCK:
        try:
            document = pdfium.PdfDocument(data)
        except pdfium.PdfiumError as err:
            raise G4VError(_load_problem(label, err, data)) from None
        try:
            pages = len(document)
            if pages < 1:
                raise G4VError(f"{label} has no pages")
            if pages > MAX_PDF_PAGES:
                raise G4VError(f"{label} has too many pages: {pages:,} (the limit is {MAX_PDF_PAGES:,})")
            yield document
        finally:
            document.close()


def _load_problem(label: str, err, data: bytes) -> str:
    """PDFium's load error in the user's words (codes: 4 password, 5 security handler).

    PDFium refuses a document without pages (its own empty file included) without setting an error
    of its own, so the code left over from an earlier failure shows; such a file is recognised by
    its empty page tree (``/Count 0`` and no page object) to say so."""
    code = getattr(err, "err_code", None)
    if code in (4, 5):
        return f"{label} is encrypted (password-protected); save an unencrypted copy and try again"
    if EMPTY_PAGE_TREE.search(data) and not PAGE_OBJECT.search(data):
        return f"{label} has no pages"
    # PDFium's own wording ("Failed to load document (PDFium: Data format error).") names the
    # library, not the problem; the user needs only to know that the file is damaged.
    return f"{label} is corrupt or unreadable as a PDF"


def page_count(source, name: str | None = None) -> int:
    """How many pages the document has (after every check :func:`open_pdf` makes)."""
    data, label = read_pdf(source, name)
    with open_pdf(data, label) as document:
        return len(document)


def parse_page_range(text: str | None, pages: int) -> list[int]:
    """``"1,3-4"`` as the 1-based page numbers ``[1, 3, 4]``, in the order given, repeats dropped.

    An empty text means page 1. Refuses anything that is not a number or a range of numbers, a
    reversed range, and pages outside ``1..pages``, naming the part that is wrong.
    """
    text = (text or "").strip()
    if not text:
        return [1]
    chosen: list[int] = []
    for part in text.split(","):
        part = part.strip()
        # ASCII digits only: int() would also take "1_0" (10) and other scripts' digits
        numbers = re.fullmatch(r"([0-9]{1,9})\s*(?:-\s*([0-9]{1,9}))?", part)
        if numbers is None:
            raise G4VError(f"page range: {quoted(part, 40)} is not a page number or a range like 3-5")
        start = int(numbers[1])
        end = int(numbers[2]) if numbers[2] else start
        if start > end:
            raise G4VError(f"page range: {quoted(part, 40)} runs backwards")
        if start < 1 or end > pages:
            raise G4VError(f"page range: {quoted(part, 40)} is outside the document's pages 1-{pages}")
        chosen += [page for page in range(start, end + 1) if page not in chosen]
    return chosen


def check_dpi(dpi) -> float:
    """The render resolution as a number inside ``MIN_DPI..MAX_DPI``, or one line saying why not."""
    try:
        value = float(dpi)
    except (TypeError, ValueError):
        raise G4VError(f"render resolution must be a number of dots per inch, not {dpi!r}") from None
    if not MIN_DPI <= value <= MAX_DPI:
        raise G4VError(f"render resolution must be between {MIN_DPI} and {MAX_DPI} dpi, not {value:g}")
    return value


def render_pages(source, pages: str | list[int] | None = None, dpi=DEFAULT_DPI, name: str | None = None,
                 max_images: int = MAX_IMAGES_PER_MESSAGE) -> list[Image.Image]:
    """The chosen pages (a range text like ``"1,3-4"`` or 1-based numbers) as RGB images.

    Each page's size in pixels is ``points / 72 * dpi`` per side, rounded up; a page over the image pixel limit
    is refused before its bitmap is allocated, naming the page and a resolution that would fit.
    More pages than ``max_images`` (one message's image limit) are refused, not silently cut.
    """
    dpi = check_dpi(dpi)
    data, label = read_pdf(source, name)
    with open_pdf(data, label) as document:
        numbers = pages if isinstance(pages, list) else parse_page_range(pages, len(document))
        if len(numbers) > max_images:
            raise G4VError(f"too many pages: {len(numbers)} chosen from {label}, at most {max_images} can be used here")
        return [_render_page(document, number, dpi, label) for number in numbers]


def _render_page(document, number: int, dpi: float, label: str) -> Image.Image:
    """One page (1-based) at ``dpi``: (points W x H) -> RGB picture of ceil(W*dpi/72) x ceil(H*dpi/72)."""
    if not 1 <= number <= len(document):
        raise G4VError(f"{label} has no page {number} (it has {len(document)})")
    page = document[number - 1]
    try:
        width, height = page.get_size()
        scale = dpi / POINTS_PER_INCH
        pixels = math.ceil(width * scale) * math.ceil(height * scale)  # PDFium rounds sizes up
        if pixels > MAX_IMAGE_PIXELS:
            fitting = int(POINTS_PER_INCH * (MAX_IMAGE_PIXELS / max(width * height, 1)) ** 0.5) - 1
            advice = f"try {fitting} dpi or less" if fitting >= MIN_DPI else f"too large even at {MIN_DPI} dpi"
            raise G4VError(f"page {number} of {label} is too large at {dpi:g} dpi: {pixels:,} pixels "
                           f"(the limit is {MAX_IMAGE_PIXELS:,}; {advice})")
        if pixels < 1:
            raise G4VError(f"page {number} of {label} has no area ({width:g} x {height:g} points)")
        bitmap = page.render(scale=scale, may_draw_forms=False)
        return to_rgb(bitmap.to_pil())
    finally:
        page.close()


def render_thumbnails(source, name: str | None = None, width: int = THUMBNAIL_WIDTH,
                      limit: int = MAX_THUMBNAILS) -> list[Image.Image]:
    """Small pictures of the first ``limit`` pages, each ``width`` pixels wide, for a page picker."""
    data, label = read_pdf(source, name)
    with open_pdf(data, label) as document:
        thumbnails = []
        for index in range(min(len(document), limit)):
            page = document[index]
            try:
                page_width, page_height = page.get_size()
                scale = width / max(page_width, 1.0)
                if page_height * scale > 20 * width:  # a ribbon-shaped page: cap its thumbnail height
                    scale = 20 * width / page_height
                thumbnails.append(to_rgb(page.render(scale=scale, may_draw_forms=False).to_pil()))
            finally:
                page.close()
        return thumbnails
