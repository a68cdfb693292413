"""PDFs and task presets on the command line: a PDF page reaches every command as the picture PDFium
draws, ``chat --task ... --json`` prints the structured reading, and bad input is one line."""

import json

import pytest

from g4v.documents.examples import REPORT_PDF, REPORT_PAGE_PNGS
from tests.test_cli import g4v


def pdfium_page_png(tmp_path, number: int, dpi: float):
    """The page rendered by pypdfium2 directly (not through g4v), saved as PNG."""
    import pypdfium2

    document = pypdfium2.PdfDocument(str(REPORT_PDF))
    path = tmp_path / f"page{number}.png"
    document[number - 1].render(scale=dpi / 72).to_pil().convert("RGB").save(path)
    document.close()
    return path


def test_tiling_of_a_pdf_page_is_the_tiling_of_that_page_as_a_picture(tmp_path):
    """Same config, same picture size: the token plans must be identical, token for token."""
    from_pdf = g4v("tiling", str(REPORT_PDF), "--pages", "2", "--dpi", "100", "--json")
    from_png = g4v("tiling", str(pdfium_page_png(tmp_path, 2, 100)), "--json")
    assert from_pdf.returncode == 0, from_pdf.stderr
    assert json.loads(from_pdf.stdout) == json.loads(from_png.stdout)
    size = json.loads(from_pdf.stdout)["image_size"]
    height, width = size["height"], size["width"]
    assert abs(height - 11.69 * 100) < 1 and abs(width - 8.27 * 100) < 1.01  # A4 at 100 dpi


def test_chat_task_on_a_pdf_page_answers_as_on_the_rendered_picture():
    """Greedy decoding: the PDF's page 1 at 96 dpi and the committed PNG of it (96 dpi) give the same
    answer; --json carries the documented prompt and the answer read as CSV."""
    common = ["--backend", "hf", "--max-new-tokens", "12", "--json", "--task", "chart2csv"]
    from_pdf = g4v("chat", "--image", str(REPORT_PDF), "--pages", "1", "--dpi", "96", *common)
    from_png = g4v("chat", "--image", str(REPORT_PAGE_PNGS[0]), *common)
    assert from_pdf.returncode == 0, from_pdf.stderr
    result = json.loads(from_pdf.stdout)
    assert result["prompt"] == "<chart2csv>" and result["task"] == "chart2csv"
    assert result["answer"] == json.loads(from_png.stdout)["answer"]
    structured = result["structured"]
    assert structured["kind"] == "csv" and structured["raw"] == result["answer"]
    assert (structured["error"] is None) == bool(structured["rows"])  # read as a table, or the reason why not


@pytest.fixture
def schema_files(tmp_path):
    good = tmp_path / "schema.json"
    good.write_text('{"type": "object", "properties": {"total": {"type": "number"}}}')
    bad = tmp_path / "bad.json"
    bad.write_text('{"type": "objekt"}')
    return good, bad


@pytest.mark.parametrize("args, words", [
    (["chat", "--task", "kvp", "--image", "{pdf}"], ["--task kvp needs --schema FILE"]),
    (["chat", "--task", "kvp", "--schema", "{bad}", "--image", "{pdf}"], ["not a valid JSON Schema at type"]),
    (["chat", "--task", "kvp", "--schema", "{tmp}/none.json"], ["schema file not found: none.json"]),
    (["chat", "--schema", "{good}", "hello"], ["--schema needs --task kvp"]),
    (["chat", "--task", "chart2csv", "--image", "{pdf}", "what is this?"], ["leave out PROMPT"]),
    (["chat", "--task", "chart2pdf", "--image", "{pdf}"], ["--task", "invalid choice"]),
    (["chat", "--image", "{pdf}", "--image", "{pdf}", "--pages", "1-2", "--image", "{pdf}", "hi"], ["too many images"]),
    (["chat", "--image", "{pdf}", "--pages", "9", "hi"], ["'9' is outside the document's pages 1-2"]),
    (["chat", "--image", "{pdf}", "--dpi", "5000", "hi"], ["render resolution must be between"]),
    (["tiling", "{pdf}", "--pages", "1-2"], ["too many pages: 2 chosen", "at most 1"]),
    (["tiling", "{locked}"], ["locked.pdf is encrypted"]),
    (["tiling", "{loop}"], ["page 1 of loop.pdf needs more memory or time than a page may take to render"]),
    (["tiling", "{cycle}", "--pages", "2"], ["page 2 of cycle.pdf is corrupt or unreadable"]),
    (["inspect", "--image", "{fake}", "--prompt", "hi", "--out", "{tmp}/out"], ["fake.png is corrupt"]),
])
def test_bad_document_input_is_one_line_before_any_model_loads(tmp_path, schema_files, capsys, args, words):
    """In process (the CLI's own ``main``, as ``python -m g4v`` runs it): the checks come before any
    model loads, so each case takes milliseconds."""
    from tests.test_documents_pdf import encrypted_pdf, page_tree_cycle_pdf, self_drawing_pdf

    (tmp_path / "locked.pdf").write_bytes(encrypted_pdf())
    (tmp_path / "loop.pdf").write_bytes(self_drawing_pdf())  # PDFium's child dies at its memory limit
    (tmp_path / "cycle.pdf").write_bytes(page_tree_cycle_pdf())
    (tmp_path / "fake.png").write_bytes(b"%PDF-1.7\n" + b"\0" * 50)  # a "PDF" named .png goes to the PDF reader
    good, bad = schema_files
    values = {"{pdf}": str(REPORT_PDF), "{good}": str(good), "{bad}": str(bad), "{tmp}": str(tmp_path),
              "{locked}": str(tmp_path / "locked.pdf"), "{fake}": str(tmp_path / "fake.png"),
              "{loop}": str(tmp_path / "loop.pdf"), "{cycle}": str(tmp_path / "cycle.pdf")}
    filled = [values.get(a, a.replace("{tmp}", str(tmp_path))) for a in args]
    from g4v.cli import main

    try:
        status = main(filled)
    except SystemExit as exit:  # argparse's refusals
        status = exit.code
    assert status not in (0, None)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in lines[0], lines
    for word in words:
        assert word in lines[0], lines[0]
