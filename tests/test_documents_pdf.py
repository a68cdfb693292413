"""PDF pages as images (g4v.documents.pdf, real PDFium): good pages render at the size the PDF's
own page box gives; bad documents are refused in one line that names the file and the problem.

The bad PDFs are written by hand here (a PDF is text with byte offsets), so each one is exactly the
case it names."""

import math
from dataclasses import replace

import pytest

from g4v.documents import pdf
from g4v.documents.examples import PAGE_INCHES, REPORT_PDF
from g4v.errors import G4VError
from g4v.settings.limits import limits


def minimal_pdf(page_objects: list[str], extra_objects: dict[int, str] | None = None,
                trailer_extra: str = "", catalog_extra: str = "", count: int | None = None) -> bytes:
    """A PDF of the given page dictionaries (objects 3, 4, ...), with a correct xref table."""
    kids = " ".join(f"{3 + i} 0 R" for i in range(len(page_objects)))
    objects = {1: f"<< /Type /Catalog /Pages 2 0 R {catalog_extra}>>",
               2: f"<< /Type /Pages /Kids [{kids}] /Count {len(page_objects) if count is None else count} >>"}
    objects.update({3 + i: page for i, page in enumerate(page_objects)})
    objects.update(extra_objects or {})
    out = bytearray(b"%PDF-1.7\n")
    offsets = {}
    for number in sorted(objects):
        offsets[number] = len(out)
        out += f"{number} 0 obj\n{objects[number]}\nendobj\n".encode()
    xref = len(out)
    size = max(objects) + 1
    out += f"xref\n0 {size}\n0000000000 65535 f \n".encode()
    for number in range(1, size):
        out += f"{offsets.get(number, 0):010d} 00000 n \n".encode()
    out += f"trailer\n<< /Size {size} /Root 1 0 R {trailer_extra}>>\nstartxref\n{xref}\n%%EOF\n".encode()
    return bytes(out)


def page(width=200, height=100, content_object: int | None = None) -> str:
    contents = f"/Contents {content_object} 0 R " if content_object else ""
    return f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 {width} {height}] {contents}>>"


def stream(data: str) -> str:
    return f"<< /Length {len(data)} >>\nstream\n{data}\nendstream"


BLACK_BOX = stream("0 0 0 rg 50 25 100 50 re f")  # a black rectangle in the middle of a 200x100 page


def write(tmp_path, name: str, data: bytes):
    path = tmp_path / name
    path.write_bytes(data)
    return path


def use_limits(monkeypatch, **changed) -> None:
    """This process's limits with ``changed`` for the test, as G4V_* variables would set them."""
    monkeypatch.setattr("g4v.settings.limits._current", replace(limits(), **changed))


def refusal(call) -> str:
    with pytest.raises(G4VError) as caught:
        call()
    message = str(caught.value)
    assert "\n" not in message and "Traceback" not in message and "/tmp" not in message
    return message


# ── good documents ──────────────────────────────────────────────────────────────────────────────


def test_the_example_report_renders_at_the_size_of_its_page_box():
    """A4 is 8.27 x 11.69 inches; at 72 dpi one pixel per point, at 144 dpi two (PDFium rounds up)."""
    for dpi in (72, 144):
        images = pdf.render_pages(REPORT_PDF, "1-2", dpi=dpi)
        assert len(images) == 2
        for image in images:
            assert image.mode == "RGB"
            assert image.size == (math.ceil(PAGE_INCHES[0] * dpi), math.ceil(PAGE_INCHES[1] * dpi))


def test_a_hand_written_page_draws_its_content_where_the_pdf_says(tmp_path):
    """A black 100x50 rectangle at (50, 25) on a 200x100 page: PDF y runs upwards, images downwards."""
    path = write(tmp_path, "box.pdf", minimal_pdf([page(content_object=4)], {4: BLACK_BOX}))
    (image,) = pdf.render_pages(path, "1", dpi=72)
    assert image.size == (200, 100)
    assert image.getpixel((100, 50)) == (0, 0, 0)  # inside
    assert image.getpixel((10, 10)) == (255, 255, 255)  # outside
    assert image.getpixel((55, 30)) == (0, 0, 0) and image.getpixel((45, 20)) == (255, 255, 255)


def test_javascript_and_open_actions_do_not_change_what_is_drawn(tmp_path):
    """A document whose open action is JavaScript that would hide the page content (and a form
    field with a JavaScript action) renders exactly like the same document without it: nothing of
    the file runs, only its page content is drawn."""
    plain = write(tmp_path, "plain.pdf", minimal_pdf([page(content_object=4)], {4: BLACK_BOX}))
    script = "this.getPageNthWord(0); app.alert('pwned'); this.print();"
    hostile = write(tmp_path, "hostile.pdf", minimal_pdf(
        [page(content_object=4)[:-2] + "/AA << /O 5 0 R >> >>"],
        {4: BLACK_BOX, 5: f"<< /S /JavaScript /JS ({script}) >>",
         6: "<< /Names [(x) 5 0 R] >>"},
        catalog_extra="/OpenAction 5 0 R /Names << /JavaScript 6 0 R >> "))
    assert list(pdf.render_pages(hostile, "1", dpi=72)[0].getdata()) == list(pdf.render_pages(plain, "1", dpi=72)[0].getdata())


def test_thumbnails_have_the_picker_width():
    thumbnails = pdf.render_thumbnails(REPORT_PDF)
    assert [t.width for t in thumbnails] == [pdf.THUMBNAIL_WIDTH] * 2
    assert abs(thumbnails[0].height - pdf.THUMBNAIL_WIDTH * PAGE_INCHES[1] / PAGE_INCHES[0]) <= 1


@pytest.mark.parametrize("text, pages, expected", [
    ("", 5, [1]), ("2", 5, [2]), ("1,3-4", 5, [1, 3, 4]), (" 4 - 5 , 1 ", 5, [4, 5, 1]), ("2,2,1-2", 3, [2, 1]),
])
def test_page_ranges(text, pages, expected):
    assert pdf.parse_page_range(text, pages) == expected


# ── bad documents and bad choices: one line each ────────────────────────────────────────────────


def encrypted_pdf() -> bytes:
    """A standard-security-handler (RC4, revision 3) document whose user password is not empty:
    the O and U entries are 32 bytes that no empty password produces, so no reader can open it
    without the password."""
    filler = "<" + "ab" * 32 + ">"
    encrypt = f"<< /Filter /Standard /V 2 /R 3 /Length 128 /P -4 /O {filler} /U {filler} >>"
    return minimal_pdf([page(content_object=4)], {4: BLACK_BOX, 5: encrypt},
                       trailer_extra="/Encrypt 5 0 R /ID [<0123456789abcdef0123456789abcdef> <0123456789abcdef0123456789abcdef>] ")


def empty_pdf() -> bytes:
    """A document without pages, as PDFium itself writes one."""
    import io

    import pypdfium2

    buffer = io.BytesIO()
    pypdfium2.PdfDocument.new().save(buffer)
    return buffer.getvalue()


BAD_DOCUMENTS = {
    "encrypted": (encrypted_pdf, ["locked.pdf", "encrypted"]),
    "corrupt": (lambda: b"%PDF-1.7\n" + bytes(range(256)) * 8, ["corrupt"]),
    "truncated": (lambda: REPORT_PDF.read_bytes()[:400], ["corrupt"]),
    "zero pages": (lambda: empty_pdf(), ["has no pages"]),
    "empty page tree": (lambda: minimal_pdf([], count=0), ["has no pages"]),
    "not a pdf": (lambda: (REPORT_PDF.parent / "shapes-wide.png").read_bytes(), ["not a PDF"]),
    "empty": (lambda: b"", ["is empty"]),
    "html": (lambda: b"<html><script>alert(1)</script></html>", ["not a PDF"]),
}


@pytest.mark.parametrize("case", list(BAD_DOCUMENTS))
def test_bad_documents_are_refused_in_one_line(tmp_path, case):
    make, words = BAD_DOCUMENTS[case]
    path = write(tmp_path, "locked.pdf", make())
    message = refusal(lambda: pdf.render_pages(path, "1"))
    for word in words:
        assert word in message, message
    assert "locked.pdf" in message
    assert "pdfium" not in message.lower()  # the library's own wording is not the user's business


def test_a_missing_file_and_a_folder(tmp_path):
    assert refusal(lambda: pdf.render_pages(tmp_path / "gone.pdf")) == "document not found: gone.pdf"
    assert "not a file" in refusal(lambda: pdf.render_pages(tmp_path))


def test_a_file_over_the_size_limit_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "huge.pdf"
    with open(path, "wb") as handle:  # sparse: the limit is checked from the size, never read
        handle.write(b"%PDF-1.7\n")
        handle.truncate(limits().max_pdf_bytes + 1)
    assert "huge.pdf is too large" in refusal(lambda: pdf.render_pages(path))


def test_too_many_pages_in_the_document(tmp_path, monkeypatch):
    path = write(tmp_path, "long.pdf", minimal_pdf([page()] * 3))
    use_limits(monkeypatch, max_pdf_pages=2)
    assert "long.pdf has too many pages: 3 (the limit is 2)" in refusal(lambda: pdf.render_pages(path))


def test_a_page_too_large_at_the_chosen_resolution_names_one_that_fits(tmp_path):
    """A 5000-point square page at 300 dpi is 20834 pixels a side; the suggested resolution fits
    the pixel limit and is within 2 dpi of the largest that does."""
    path = write(tmp_path, "poster.pdf", minimal_pdf([page(5000, 5000)]))
    message = refusal(lambda: pdf.render_pages(path, "1", dpi=300))
    assert "page 1 of poster.pdf is too large at 300 dpi: 434,055,556 pixels" in message  # 20834 ** 2
    fitting = int(message.split("try ")[1].split(" dpi")[0])
    side = math.ceil(5000 * fitting / 72)
    assert side * side <= limits().max_image_pixels < math.ceil(5000 * (fitting + 2) / 72) ** 2
    assert pdf.render_pages(path, "1", dpi=fitting)[0].size == (side, side)


def test_a_page_too_large_even_at_the_lowest_resolution(tmp_path):
    """14400 points (200 inches, PDF's largest page side) is 7200 pixels a side at 36 dpi."""
    path = write(tmp_path, "banner.pdf", minimal_pdf([page(14400, 14400)]))
    message = refusal(lambda: pdf.render_pages(path, "1", dpi=36))
    assert f"too large even at {pdf.MIN_DPI} dpi" in message and "51,840,000 pixels" in message


@pytest.mark.parametrize("pages, words", [
    ("0", ["'0' is outside", "1-2"]), ("3", ["'3' is outside"]), ("2-1", ["runs backwards"]),
    ("one", ["'one' is not a page number"]), ("1,,2", ["'' is not a page number"]),
    ("1_0", ["'1_0' is not a page number"]), ("\u0661", ["is not a page number"]), ("1-2-3", ["'1-2-3' is not"]),
    ("9" * 5000, ["is not a page number"]),
])
def test_bad_page_ranges(pages, words):
    message = refusal(lambda: pdf.render_pages(REPORT_PDF, pages))
    for word in words:
        assert word in message, message


def test_more_pages_than_one_message_carries(tmp_path):
    path = write(tmp_path, "many.pdf", minimal_pdf([page()] * 6))
    assert "too many pages: 5 chosen from many.pdf, at most 4" in refusal(lambda: pdf.render_pages(path, "1-5"))


@pytest.mark.parametrize("dpi", [0, 1000, "high", float("nan")])
def test_bad_resolutions(dpi):
    assert "render resolution" in refusal(lambda: pdf.render_pages(REPORT_PDF, "1", dpi=dpi))


# ── hostile documents: PDFium runs in a bounded child process ──────────────────────────────────


def self_drawing_pdf() -> bytes:
    """A page whose content draws form X0, and X0 draws itself twice: without a limit PDFium
    allocates until the process dies (about 200 MB a second here)."""
    with_form = page(content_object=4)[:-2] + "/Resources << /XObject << /X0 5 0 R >> >> >>"
    form = ("<< /Type /XObject /Subtype /Form /BBox [0 0 200 100] /Resources << /XObject << /X0 5 0 R >> >> "
            "/Length 13 >>\nstream\n/X0 Do /X0 Do\nendstream")
    return minimal_pdf([with_form], {4: stream("/X0 Do"), 5: form})


def page_tree_cycle_pdf() -> bytes:
    """The page tree's root lists itself among its kids (and claims two pages)."""
    return minimal_pdf([page()], {2: "<< /Type /Pages /Kids [2 0 R 3 0 R] /Count 2 >>"})


def own_peak_memory() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@pytest.mark.parametrize("limit", ["memory", "time"])
@pytest.mark.slow  # about 4 s on a quiet 2-core machine
def test_a_form_that_draws_itself_is_one_line_and_this_process_stays_small(tmp_path, monkeypatch, limit):
    """In process this PDF took the server from 1.3 to 6 GB and ended in SIGABRT; now the child
    hits its address-space limit (or is killed at the time limit) and the caller reads one line."""
    if limit == "memory":
        use_limits(monkeypatch, pdf_render_memory=512 * 1024 ** 2)
    else:
        use_limits(monkeypatch, pdf_page_seconds=1.0)
    path = write(tmp_path, "loop.pdf", self_drawing_pdf())
    before = own_peak_memory()
    for call in (lambda: pdf.render_thumbnails(path), lambda: pdf.render_pages(path, "1", dpi=72)):
        message = refusal(call)
        assert message.startswith("page 1 of loop.pdf needs more memory or time than a page may take to render")
    assert own_peak_memory() - before < 100 * 1024 ** 2
    assert pdf.render_pages(REPORT_PDF, "1", dpi=36)[0].size == (math.ceil(PAGE_INCHES[0] * 36),
                                                                  math.ceil(PAGE_INCHES[1] * 36))  # still working


def test_a_page_tree_that_loops_back_is_one_line(tmp_path):
    path = write(tmp_path, "cycle.pdf", page_tree_cycle_pdf())
    assert refusal(lambda: pdf.render_thumbnails(path)) == "page 2 of cycle.pdf is corrupt or unreadable"
    assert refusal(lambda: pdf.render_pages(path, "2")) == "page 2 of cycle.pdf is corrupt or unreadable"


def test_pages_and_thumbnails_match_pdfium_in_this_process():
    """The child's pictures are PDFium's own, pixel for pixel: rendered here with pypdfium2 directly."""
    import numpy as np
    import pypdfium2

    document = pypdfium2.PdfDocument(str(REPORT_PDF))
    try:
        for number, image in enumerate(pdf.render_pages(REPORT_PDF, "1-2", dpi=100), start=1):
            here = document[number - 1].render(scale=100 / 72, may_draw_forms=False).to_pil().convert("RGB")
            assert np.array_equal(np.asarray(image), np.asarray(here))
        first = document[0]
        here = first.render(scale=pdf.THUMBNAIL_WIDTH / first.get_size()[0], may_draw_forms=False).to_pil()
        assert np.array_equal(np.asarray(pdf.render_thumbnails(REPORT_PDF)[0]), np.asarray(here.convert("RGB")))
    finally:
        document.close()


@pytest.mark.slow  # about 4 s on a quiet 2-core machine
def test_a_slow_document_does_not_hold_up_another(tmp_path, monkeypatch):
    """One user's runaway page (here a few seconds until its child is killed) and another's page
    render at the same time: the second is done while the first still runs (one PDFium lock made it wait)."""
    import threading

    path = write(tmp_path, "loop.pdf", self_drawing_pdf())  # about 5 s to its 1 GiB limit here
    slow = threading.Thread(target=lambda: pytest.raises(G4VError, pdf.render_pages, path, "1"))
    slow.start()
    try:
        assert pdf.render_pages(REPORT_PDF, "2", dpi=72)[0].width == math.ceil(PAGE_INCHES[0] * 72)
        assert slow.is_alive()
    finally:
        slow.join(60)


def test_renderers_are_capped_and_a_request_past_the_cap_is_one_line(tmp_path, monkeypatch):
    import threading

    slots = threading.BoundedSemaphore(1)
    monkeypatch.setattr(pdf, "_render_slots", slots)
    monkeypatch.setattr(pdf, "WAIT_SECONDS", 0.5)
    use_limits(monkeypatch, pdf_render_memory=512 * 1024 ** 2)
    path = write(tmp_path, "loop.pdf", self_drawing_pdf())
    slow = threading.Thread(target=lambda: pytest.raises(G4VError, pdf.render_pages, path, "1"))
    slow.start()
    try:
        import time

        for _ in range(200):  # until the slow render has its slot
            if not slots.acquire(blocking=False):
                break
            slots.release()
            time.sleep(0.05)
        assert "every PDF renderer is busy" in refusal(lambda: pdf.page_count(REPORT_PDF))
    finally:
        slow.join(60)
    assert pdf.page_count(REPORT_PDF) == 2  # the slot came back


def test_no_child_process_or_pipe_is_left_behind(tmp_path, monkeypatch):
    """Refused documents (at load, at a page, past the limit) and good ones close their child.

    The renderers this test starts are recorded (the real `Popen`, wrapped) and each must be waited
    for; other children of the test process (servers other tests hold open) are not counted."""
    import os
    import subprocess

    started = []

    class Recorded(subprocess.Popen):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            started.append(self.pid)

    monkeypatch.setattr(pdf.subprocess, "Popen", Recorded)
    bad = write(tmp_path, "locked.pdf", encrypted_pdf())
    cycle = write(tmp_path, "cycle.pdf", page_tree_cycle_pdf())
    pdf.page_count(REPORT_PDF)
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(3):
        refusal(lambda: pdf.render_pages(bad, "1"))
        refusal(lambda: pdf.render_pages(cycle, "2"))
        refusal(lambda: pdf.render_pages(REPORT_PDF, "1-3"))
        pdf.render_thumbnails(REPORT_PDF)
    assert len(os.listdir("/proc/self/fd")) == before
    assert len(started) == 13  # one renderer per document opened
    for pid in started:  # every child was waited for: none is left, not even a zombie
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def test_an_answer_larger_than_any_page_is_not_read(monkeypatch):
    """A child that PDFium's bugs took over could claim a frame of any size: the parent refuses to
    allocate past the largest page (here the bound is lowered below a real page's bitmap)."""
    monkeypatch.setattr(pdf, "max_frame_bytes", lambda: 1000)
    assert "needs more memory or time" in refusal(lambda: pdf.render_pages(REPORT_PDF, "1", dpi=72))
