"""PDF pages as pictures: every page a user picks becomes one RGB image, or one line saying why not.

Rendering goes through PDFium (``pypdfium2``), the engine Chrome uses; no external program.
Nothing in the file runs: forms are never initialised (so no form actions and no JavaScript, and
PDFium builds from PyPI carry no JavaScript engine anyway), links and attachments are ignored, only
page content is drawn. Every limit is checked before the work it guards: the file size before
reading, the page count before rendering, each page's pixel count before its bitmap exists.

PDFium itself runs in a child process (:mod:`g4v.documents.pdf_worker`), one per document opened,
under an address-space and CPU limit: a page that would take without end (a form that draws
itself) or crash PDFium kills only that child, and the user reads one line. At most
``limits().pdf_renderers`` children run at once, each with its own PDFium, so one heavy document no longer
holds a lock every other user waits behind.
"""

import importlib.util
import math
import os
import re
import select
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from PIL import Image

from g4v.conversation import MAX_IMAGES_PER_MESSAGE
from g4v.errors import G4VError, quoted, read_decimal
from g4v.images import to_rgb
from g4v.settings.limits import limits

# The sizes, pages, renderers, memory and seconds a PDF is allowed are limits (g4v.settings.limits).
#: Render resolution in dots per inch: the default, and the range a user may choose.
DEFAULT_DPI = 144
MIN_DPI, MAX_DPI = 36, 300
#: Thumbnails for the page picker: their width in pixels, and at most this many of them.
THUMBNAIL_WIDTH = 160
MAX_THUMBNAILS = 60
#: A PDF's header may follow some junk bytes; readers look this far for ``%PDF-``.
HEADER_WINDOW = 1024
POINTS_PER_INCH = 72

#: The child's own start (a fresh interpreter and PDFium), allowed on top of opening the document:
#: on a busy machine it can take seconds, and it is not the document's doing.
START_SECONDS = 20
#: How long a request waits for a free renderer before it is refused.
WAIT_SECONDS = 120
WORKER = Path(__file__).with_name("pdf_worker.py")


def max_frame_bytes() -> int:
    """The most one answer from the child may hold: the largest page allowed, at 4 bytes a pixel."""
    return 4 * limits().max_image_pixels + 2 ** 20


_slots_made = threading.Lock()
_render_slots: threading.BoundedSemaphore | None = None


def render_slots() -> threading.BoundedSemaphore:
    """One slot per child process that may render at once (``limits().pdf_renderers``); the rest
    wait their turn. Made the first time a document is opened, from the limits then."""
    global _render_slots
    with _slots_made:
        if _render_slots is None:
            _render_slots = threading.BoundedSemaphore(limits().pdf_renderers)
        return _render_slots
EMPTY_PAGE_TREE = re.compile(rb"/Count\s*0\b")
PAGE_OBJECT = re.compile(rb"/Type\s*/Page(?![a-zA-Z])")


def looks_like_pdf(source) -> bool:
    """True for a ``.pdf`` name or bytes that start like a PDF: which opener a path goes to."""
    if isinstance(source, (bytes, bytearray)):
        return b"%PDF-" in bytes(source[:HEADER_WINDOW])
    return Path(str(source)).suffix.lower() == ".pdf"


def read_pdf(source, name: str | None = None) -> tuple[bytes, str]:
    """The file's bytes and the name errors use (the base name only: server paths stay private).

    Refuses a missing file, a directory, a file over ``limits().max_pdf_bytes`` (from its size, before
    reading) and bytes without a ``%PDF-`` header.
    """
    if isinstance(source, (bytes, bytearray)):
        data, label = bytes(source), name or "document.pdf"
        if len(data) > limits().max_pdf_bytes:
            raise G4VError(f"{label} is too large: {len(data):,} bytes (the limit is {limits().max_pdf_bytes:,})")
    else:
        path = Path(source)
        label = name or path.name
        if not path.exists():
            raise G4VError(f"document not found: {label}")
        if not path.is_file():
            raise G4VError(f"not a file: {label}")
        size = path.stat().st_size
        if size > limits().max_pdf_bytes:
            raise G4VError(f"{label} is too large: {size:,} bytes (the limit is {limits().max_pdf_bytes:,})")
        data = path.read_bytes()
    if not data:
        raise G4VError(f"{label} is empty")
    if b"%PDF-" not in data[:HEADER_WINDOW]:
        raise G4VError(f"{label} is not a PDF (no %PDF- header)")
    return data, label


class RenderedDocument:
    """One document open in its child process: ``len()`` pages, each page's size and its picture.

    Every answer is awaited at most ``limits().pdf_page_seconds``; a child that runs past it is killed, and a
    child that dies (its memory limit, a PDFium crash) is reported, both in one line naming the page."""

    def __init__(self, data: bytes, label: str):
        from g4v.documents.pdf_worker import read_frame, write_frame  # the same framing both ways

        self.label, self._read_frame, self._write_frame = label, read_frame, write_frame
        # -P: the worker's folder is not put on sys.path; a fresh interpreter, never a fork of this
        # threaded one. Its stderr (PDFium's warnings, a crash's report) is not the user's business.
        self._child = subprocess.Popen([sys.executable, "-P", str(WORKER), str(limits().pdf_render_memory),
                                        str(math.ceil(limits().pdf_page_seconds * (MAX_THUMBNAILS + 2)))],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        self._out = _TimedReader(self._child.stdout)
        try:
            reply, _ = self._ask({"op": "open"}, data, f"{label} needs more memory or time than a PDF may take "
                                 "to open", START_SECONDS)
            if reply.get("error") == "load":
                raise G4VError(_load_problem(label, reply.get("code"), data))
        except BaseException:  # no document to hand back: the child and its pipes go now
            self.close()
            raise
        self.pages = reply["pages"]

    def __len__(self) -> int:
        return self.pages

    def page_size(self, number: int) -> tuple[float, float]:
        reply, _ = self._ask_page({"op": "size", "index": number - 1}, number)
        return tuple(reply["size"])

    def render(self, number: int, scale: float) -> Image.Image:
        """Page ``number`` (1-based) drawn at ``scale`` pixels per point, as PdfBitmap.to_pil() gives it."""
        reply, pixels = self._ask_page({"op": "render", "index": number - 1, "scale": scale}, number)
        size = (reply["width"], reply["height"])
        return Image.frombuffer(reply["dest_mode"], size, pixels, "raw", reply["mode"], reply["stride"], 1)

    def _ask_page(self, request: dict, number: int):
        reply = self._ask(request, b"", f"page {number} of {self.label} needs more memory or time than a page "
                                        f"may take to render")
        if reply[0].get("error") == "page":
            raise G4VError(f"page {number} of {self.label} is corrupt or unreadable")
        return reply

    def _ask(self, request: dict, payload: bytes, too_much: str, allowance: float = 0.0):
        bounds = limits()
        said = f" (the limits are {bounds.pdf_render_memory / 1024 ** 3:g} GiB and {bounds.pdf_page_seconds:g} s)"
        try:
            self._write_frame(self._child.stdin, request, payload)
            reply = self._read_frame(self._out.until(time.monotonic() + bounds.pdf_page_seconds + allowance))
        except (OSError, ValueError, TimeoutError):  # a closed pipe, a cut frame, no answer in time
            reply = None
        if reply is None:
            self.close()
            raise G4VError(too_much + said)
        return reply

    def close(self) -> None:
        if self._child.poll() is None:
            self._child.kill()
        self._child.wait()
        for pipe in (self._child.stdin, self._child.stdout):
            try:
                pipe.close()
            except OSError:  # the child is gone; nothing is left to flush into it
                pass


class _TimedReader:
    """The child's stdout read with a deadline: ``read(n)`` waits at most until ``until()``'s time."""

    def __init__(self, pipe):
        self._fd, self._deadline = pipe.fileno(), 0.0

    def until(self, deadline: float) -> "_TimedReader":
        self._deadline = deadline
        return self

    def read(self, count: int) -> bytearray:
        if count > max_frame_bytes():  # only a child gone wrong asks for more than a page's bitmap
            raise ValueError("the PDF renderer sent more than a page")
        buffer, done = bytearray(count), 0
        view = memoryview(buffer)  # filled in place: a page's bitmap is not held twice
        while done < count:
            wait = self._deadline - time.monotonic()
            if wait <= 0 or not select.select([self._fd], [], [], wait)[0]:
                raise TimeoutError
            got = os.readv(self._fd, [view[done:]])
            if not got:
                return buffer[:done]  # the child closed its end (it died): a short read
            done += got
        return buffer


@contextmanager
def open_pdf(data: bytes, label: str):
    """The document for checked bytes, in a child process of its own, closed afterwards.

    Waits for one of the :func:`render_slots`. Refuses encrypted (password-protected),
    corrupt, zero-page and too-long documents in one line.
    """
    if importlib.util.find_spec("pypdfium2") is None:
        raise G4VError("PDF input needs pypdfium2 in this environment (pip install pypdfium2)")
    slots = render_slots()
    if not slots.acquire(timeout=WAIT_SECONDS):
        raise G4VError("every PDF renderer is busy right now; try again in a minute")
    document = None
    try:
        document = RenderedDocument(data, label)
        if document.pages < 1:
            raise G4VError(f"{label} has no pages")
        if document.pages > limits().max_pdf_pages:
            raise G4VError(f"{label} has too many pages: {document.pages:,} (the limit is {limits().max_pdf_pages:,})")
        yield document
    finally:
        if document is not None:
            document.close()
        slots.release()


def _load_problem(label: str, code, data: bytes) -> str:
    """PDFium's load error in the user's words (codes: 4 password, 5 security handler).

    PDFium refuses a document without pages (its own empty file included) without setting an error
    of its own, so the code left over from an earlier failure shows; such a file is recognised by
    its empty page tree (``/Count 0`` and no page object) to say so."""
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
        value = read_decimal(dpi)  # the digits 0-9 only, as every number typed (float reads "٣" too)
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
    return [image for _, image in numbered_pages(source, pages, dpi, name, max_images)]


def numbered_pages(source, pages: str | list[int] | None = None, dpi=DEFAULT_DPI, name: str | None = None,
                   max_images: int = MAX_IMAGES_PER_MESSAGE) -> list[tuple[int, Image.Image]]:
    """:func:`render_pages` with each picture's page number: the document is opened once for both."""
    dpi = check_dpi(dpi)
    data, label = read_pdf(source, name)
    with open_pdf(data, label) as document:
        numbers = pages if isinstance(pages, list) else parse_page_range(pages, len(document))
        if len(numbers) > max_images:
            raise G4VError(f"too many pages: {len(numbers)} chosen from {label}, at most {max_images} can be used here")
        return [(number, _render_page(document, number, dpi, label)) for number in numbers]


def _render_page(document: RenderedDocument, number: int, dpi: float, label: str) -> Image.Image:
    """One page (1-based) at ``dpi``: (points W x H) -> RGB picture of ceil(W*dpi/72) x ceil(H*dpi/72)."""
    if not 1 <= number <= len(document):
        raise G4VError(f"{label} has no page {number} (it has {len(document)})")
    width, height = document.page_size(number)
    scale = dpi / POINTS_PER_INCH
    pixels = math.ceil(width * scale) * math.ceil(height * scale)  # PDFium rounds sizes up
    most = limits().max_image_pixels
    if pixels > most:
        fitting = int(POINTS_PER_INCH * (most / max(width * height, 1)) ** 0.5) - 1
        advice = f"try {fitting} dpi or less" if fitting >= MIN_DPI else f"too large even at {MIN_DPI} dpi"
        raise G4VError(f"page {number} of {label} is too large at {dpi:g} dpi: {pixels:,} pixels "
                       f"(the limit is {most:,}; {advice})")
    if pixels < 1:
        raise G4VError(f"page {number} of {label} has no area ({width:g} x {height:g} points)")
    return to_rgb(document.render(number, scale))


def render_thumbnails(source, name: str | None = None, width: int = THUMBNAIL_WIDTH,
                      limit: int = MAX_THUMBNAILS) -> list[Image.Image]:
    """Small pictures of the first ``limit`` pages, each ``width`` pixels wide, for a page picker."""
    data, label = read_pdf(source, name)
    with open_pdf(data, label) as document:
        thumbnails = []
        for number in range(1, min(len(document), limit) + 1):
            page_width, page_height = document.page_size(number)
            scale = width / max(page_width, 1.0)
            if page_height * scale > 20 * width:  # a ribbon-shaped page: cap its thumbnail height
                scale = 20 * width / page_height
            thumbnails.append(to_rgb(document.render(number, scale)))
        return thumbnails
