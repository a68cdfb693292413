"""Headless Chromium (Debian's package) driven by Playwright, for the browser tests."""

import os
from contextlib import contextmanager

CHROMIUM = os.environ.get("G4V_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run",
]


@contextmanager
def browser_page(width=1280, height=900, server_errors_allowed: bool = False):
    """A page of headless Chromium. Every answer of the server is watched: one with a 5xx status
    (a handler Gradio could not use, which the page hides from the user) fails the test at the end,
    unless ``server_errors_allowed``."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            page.set_default_timeout(60_000)
            server_errors: list[str] = []
            page.on("response", lambda response: server_errors.append(f"{response.status} {response.url}")
                    if response.status >= 500 else None)
            yield page
            assert server_errors_allowed or not server_errors, f"the server answered with errors: {server_errors}"
        finally:
            browser.close()


def pick_pdf_pages(page, prefix: str, pdf, thumbnails: int, pages: str | None = None, use: bool = True) -> None:
    """Drive a "From a PDF" picker (element ids ``{prefix}-doc-*``, webapp.documents): open it, upload
    ``pdf``, wait until its ``thumbnails`` page thumbnails are drawn, type ``pages`` (None: keep the
    picker's page 1) and, with ``use``, press its button."""
    page.locator(f"#{prefix}-doc-picker").click()
    page.locator(f"#{prefix}-doc-pdf input[type=file]").set_input_files(str(pdf))
    page.wait_for_function("([strip, n]) => { const i = [...document.querySelectorAll(strip + ' img')];"
                           " return i.length == n && i.every(x => x.complete && x.naturalWidth > 0) }",
                           arg=[f"#{prefix}-doc-thumbnails", thumbnails])
    if pages is not None:
        page.locator(f"#{prefix}-doc-pages textarea, #{prefix}-doc-pages input").first.fill(pages)
    if use:
        page.locator(f"#{prefix}-doc-use").click()


#: A page function: whether the picture inside the element its selector names has loaded.
PICTURE_LOADED = "(s) => { const i = document.querySelector(s + ' img'); return !!i && i.complete && i.naturalWidth > 0 }"


def save_section(page, out: str, top: str, bottom: str, width: int, above: int = 20) -> None:
    """A docs picture: the page from ``above`` px over the element ``top`` to 10 px under the
    element ``bottom``, ``width`` wide, saved as a 256-colour PNG (a page shot needs few colours)."""
    from PIL import Image

    page.evaluate("window.scrollTo(0, 0)")  # bounding boxes are measured in the viewport
    start = page.locator(top).bounding_box()["y"] - above
    end = page.locator(bottom).bounding_box()
    page.screenshot(path=out, full_page=True,
                    clip={"x": 0, "y": start, "width": width, "height": end["y"] + end["height"] + 10 - start})
    Image.open(out).convert("RGB").quantize(256).save(out, optimize=True)

