"""The one opener for every command's image flags: a path becomes pictures, a PDF through its pages.

Commands that take ``--image`` (chat, lora-diff) or one image (tiling, inspect, port-diff) add
:func:`add_page_flags` and call :func:`open_inputs` or :func:`open_single`, so a PDF is accepted
everywhere with the same ``--pages`` and ``--dpi`` and refused with the same words.
"""

import argparse
from pathlib import Path

from g4v.conversation import MAX_IMAGES_PER_MESSAGE
from g4v.documents.pdf import DEFAULT_DPI, HEADER_WINDOW, check_dpi, looks_like_pdf, render_pages
from g4v.errors import G4VError
from g4v.images import open_image


def add_page_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pages", default="1", metavar="RANGE",
                        help='for a PDF: the pages to use, e.g. "1", "2-3" or "1,3"')
    parser.add_argument("--dpi", default=DEFAULT_DPI, type=_dpi, metavar="N",
                        help="for a PDF: render resolution in dots per inch")


def _dpi(text: str) -> float:
    """``--dpi`` read and checked as the renderer checks it, so argparse refuses it naming the flag."""
    try:
        return check_dpi(text)
    except G4VError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def add_picture_flags(parser: argparse.ArgumentParser) -> None:
    """``--image`` (a picture, or one page of a PDF through the page flags) and ``--prompt``: what
    every one-picture inspection reads."""
    parser.add_argument("--image", required=True, metavar="PATH", help="the image, or a PDF (one page: --pages)")
    add_page_flags(parser)
    parser.add_argument("--prompt", required=True, help="the question")


def is_pdf_path(path: str) -> bool:
    """A ``.pdf`` name, or a file whose first bytes hold a PDF header (whatever its name)."""
    if looks_like_pdf(path):
        return True
    try:
        with open(path, "rb") as handle:
            return looks_like_pdf(handle.read(HEADER_WINDOW))
    except OSError:
        return False  # open_image names the problem (missing file, folder, ...)


def open_path(path: str, pages: str = "1", dpi=DEFAULT_DPI, max_images: int = MAX_IMAGES_PER_MESSAGE) -> list:
    """One path as pictures: an image file as one, a PDF as its chosen pages."""
    if is_pdf_path(path):
        return render_pages(path, pages, dpi, name=Path(path).name, max_images=max_images)
    return [open_image(path)]


def open_inputs(paths: list[str], pages: str = "1", dpi=DEFAULT_DPI, limit: int = MAX_IMAGES_PER_MESSAGE) -> list:
    """Every ``--image`` path's pictures in order; more than ``limit`` in all is refused (one message
    carries at most that many in the app too)."""
    images = []
    for path in paths:
        images += open_path(path, pages, dpi, max_images=limit)
        if len(images) > limit:
            raise G4VError(f"too many images: more than {limit} in one message (--image and PDF --pages "
                           f"together), the limit is {limit}")
    return images


def open_single(path: str, pages: str = "1", dpi=DEFAULT_DPI):
    """The one picture a single-image command works on: an image, or exactly one PDF page."""
    images = open_path(path, pages, dpi, max_images=1) if is_pdf_path(path) else [open_image(path)]
    return images[0]
