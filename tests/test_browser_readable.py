"""What a new user reads in the page (issue 31's walk, hardening 2), measured in headless Chromium
against one app on the bundled checkpoint: the Tiling tab's token budget shown once with every
column in view, the picked token framed on the overlay, and tables whose words are never broken
across lines. Screenshots in test-output/browser/."""

import io

import pytest

from g4v.paths import EXAMPLES_DIR
from tests.browser import browser_page
from tests.test_browser_ux import PICTURE_SHOWN

EXAMPLE = str(EXAMPLES_DIR / "shapes-wide.png")

#: The words of at most ``SHORT_WORD`` characters of the element's text that the page draws on more
#: than one line (each word's box, from a DOM Range over it, spans several line tops): a word broken
#: inside. A longer token (a random model's 30-letter answer, a path) may break where it must.
SHORT_WORD = 16
SPLIT_WORDS = """([selector, longest]) => { const split = [];
  for (const root of document.querySelectorAll(selector)) {
    const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
    while (walker.nextNode()) {
      const node = walker.currentNode, words = /\\S+/g; let word;
      while ((word = words.exec(node.textContent))) {
        const range = document.createRange();
        range.setStart(node, word.index); range.setEnd(node, word.index + word[0].length);
        const tops = new Set([...range.getClientRects()].filter(r => r.width > 0).map(r => Math.round(r.top)));
        if (tops.size > 1 && word[0].length <= longest) split.push(word[0]);
      } } }
  return split; }"""

#: Per column of the element's table: its header, whether each of its cells (header included)
#: shows its whole text (nothing cut by the cell's own overflow), and whether the column lies
#: inside the table's visible frame (not cut off at its right).
COLUMNS_IN_VIEW = """(selector) => { const block = document.querySelector(selector);
  const frame = block.querySelector('.table-wrap, table').getBoundingClientRect();
  const headers = [...block.querySelectorAll('thead th')];
  return headers.map((th, col) => {
    const cells = [th, ...[...block.querySelectorAll('[data-testid^="cell-"]')].filter(
        cell => cell.dataset.testid.endsWith(`-${col}`)).map(cell => cell.closest('td') || cell)];
    const whole = cells.every(cell => [cell, ...cell.querySelectorAll('*')].every(
        el => el.scrollWidth <= el.clientWidth + 1 || getComputedStyle(el).overflowX === 'visible'));
    const box = th.getBoundingClientRect();
    return {header: th.innerText.trim(), whole, inside: box.left >= frame.left - 1 && box.right <= frame.right + 1};
  }); }"""


@pytest.fixture(scope="module")
def shots(output_dir):
    folder = output_dir / "browser"
    folder.mkdir(exist_ok=True)
    return folder


def test_the_token_budget_is_shown_once_in_view_and_the_picked_token_is_framed(app_url, shots):
    """Tiling tab: the token budget beside the picture (the overlay no longer draws it a second
    time: tests/test_tiling.py), each of its columns whole and inside its frame at the page's width (the tokens column was cut
    off), its words unbroken; a click on a canvas cell brings back an overlay with that token framed
    (around the clicked point the served picture changes on all four sides, not at the point)."""
    import numpy as np
    from PIL import Image

    with browser_page(width=1280, height=1400) as page:
        page.goto(app_url)
        page.get_by_role("tab", name="Tiling").click()
        page.locator("#tiling-image input[type=file]").set_input_files(EXAMPLE)
        page.wait_for_function(PICTURE_SHOWN, arg="#tiling-overlay")
        page.wait_for_function("() => (document.querySelector('#tiling-budget [data-testid=cell-3-0]') || {})"
                               ".innerText?.trim() === 'total'")
        columns = page.evaluate(COLUMNS_IN_VIEW, "#tiling-budget")
        assert [c["header"] for c in columns] == ["part", "layout", "tokens"]
        assert all(c["whole"] and c["inside"] for c in columns), columns
        assert page.evaluate(SPLIT_WORDS, ["#tiling-budget", SHORT_WORD]) == []

        overlay = page.locator("#tiling-overlay img")
        before_src = overlay.get_attribute("src")
        before = np.asarray(Image.open(io.BytesIO(page.request.get(before_src).body())).convert("RGB"), dtype=int)
        box = overlay.bounding_box()  # the picture is drawn inside it with object-fit: contain
        height, width = before.shape[:2]
        scale = min(box["width"] / width, box["height"] / height)
        x, y = 0.3 * width, 0.5 * height  # inside the canvas, which spans most of the picture's left
        overlay.click(position={"x": (box["width"] - width * scale) / 2 + x * scale,
                                "y": (box["height"] - height * scale) / 2 + y * scale})
        page.wait_for_function("(src) => document.querySelector('#tiling-overlay img').src !== src", arg=before_src)
        after = np.asarray(Image.open(io.BytesIO(page.request.get(overlay.get_attribute("src")).body())).convert("RGB"),
                           dtype=int)
        changed = np.argwhere(np.abs(after - before).max(axis=-1) > 0)  # (row, column) of each changed pixel
        # The first token's frame went, the clicked one's came: near the click, a frame on all four sides.
        near = changed[(np.abs(changed[:, 1] - x) < width / 10) & (np.abs(changed[:, 0] - y) < height / 6)]
        assert len(near)
        rows, cols = near[:, 0], near[:, 1]
        assert (cols < x).any() and (cols > x).any() and (rows < y).any() and (rows > y).any()
        assert not ((np.abs(rows - y) < 2) & (np.abs(cols - x) < 2)).any()  # the cell itself is left as drawn
        page.screenshot(path=str(shots / "readable-1-tiling.png"), full_page=True)


@pytest.mark.parametrize("width", [1280, 900])
def test_evaluate_tables_break_no_word_inside(app_url, shots, width):
    """Evaluate tab, after a run of 4 rows at a 1280- and a 900-pixel window: no header or cell word
    of the aggregate and sample tables is drawn across two lines ("agreemen t" in the walk; the
    bundled rows' ids, "p000-count", broke at their hyphen in a column sized for its header); at
    1280 pixels every aggregate column is whole and inside the table's frame."""
    from tests.test_evaluate_app import run_in_browser

    with browser_page(width=width, height=1400) as page:
        run_in_browser(page, app_url, limit=4)
        for table in ("#eval-aggregate", "#eval-samples"):
            assert page.evaluate(SPLIT_WORDS, [table, SHORT_WORD]) == [], table
        if width == 1280:  # all 11 aggregate columns in view at a common width (the last one was cut off)
            columns = page.evaluate(COLUMNS_IN_VIEW, "#eval-aggregate")
            assert len(columns) == 11 and all(c["whole"] and c["inside"] for c in columns), columns
        page.screenshot(path=str(shots / f"readable-2-evaluate-{width}.png"), full_page=True)


#: The texts of one column's body cells in the element's table.
COLUMN_TEXTS = """([selector, col]) => [...document.querySelector(selector).querySelectorAll('[data-testid^="cell-"]')]
  .filter(cell => cell.dataset.testid.endsWith(`-${col}`)).map(cell => cell.innerText.trim())"""


def test_evaluate_numbers_stay_whole_on_a_precision_pair(app_url, shots):
    """A = hf, B = "hf, bfloat16" on 2 rows at 1280 pixels: the KL is tiny, so its cells carry
    numbers in e-notation ("1.09e-05" broke at its hyphen in the walk): every aggregate cell, the
    numbers included, on one line and whole; the drift table shows, its numbers unbroken too."""
    from tests.test_evaluate_app import run_in_browser
    from webapp.evaluate_tables import AGGREGATE_HEADERS

    with browser_page(width=1280, height=1400) as page:
        run_in_browser(page, app_url, limit=2, arm_b="hf, bfloat16")
        page.locator("#eval-drift [data-testid^='cell-']").first.wait_for(state="visible", timeout=120_000)
        kl = [text.replace("\u2060", "") for header in ("KL mean", "KL q99")  # less the invisible word joiners
              for text in page.evaluate(COLUMN_TEXTS, ["#eval-aggregate", AGGREGATE_HEADERS.index(header)])]
        assert kl and any("e-" in text for text in kl), kl  # the case of the walk: a small KL in e-notation
        for table in ("#eval-aggregate", "#eval-drift"):
            assert page.evaluate(SPLIT_WORDS, [table, SHORT_WORD]) == [], table
        page.screenshot(path=str(shots / "readable-3-evaluate-precision.png"), full_page=True)
        columns = page.evaluate(COLUMNS_IN_VIEW, "#eval-aggregate")
        assert len(columns) == 11 and [c for c in columns if not (c["whole"] and c["inside"])] == []


#: Whether the element's text is drawn whole (nothing scrolled or cut by its own width).
FITS = "(selector) => { const e = document.querySelector(selector); return e.scrollWidth <= e.clientWidth + 1; }"


def test_lora_answers_follow_the_picture_and_its_entries_and_diff_read_whole(app_url, hf_engine, shots):
    """LoRA tab at a 1280-pixel window: every adapter entry (which names its base) fits its box; a
    side-by-side run's answers go when another picture comes, and a token diff on it fills both
    boxes with its own greedy answers (the left one equal to the model's own greedy answer on the new
    picture, computed here on the same checkpoint), never the old picture's; the diff's answers wrap
    inside the page, their words unbroken."""
    from g4v.conversation import Message, SamplingSettings
    from g4v.images import open_image
    from g4v.lora.token_diff import DIFF_TOKENS
    from tests.test_lora_browser import run_side_by_side

    prompt = "What colour is the shape?"
    tall = str(EXAMPLES_DIR / "shapes-tall.png")
    greedy = {path: hf_engine.generate([Message("user", prompt, [open_image(path)])],
                                       SamplingSettings(max_new_tokens=DIFF_TOKENS)).text.strip()
              for path in (EXAMPLE, tall)}
    assert greedy[EXAMPLE] != greedy[tall]  # the fixture this test relies on: the pictures get other answers
    with browser_page(width=1280, height=1600) as page:
        page.goto(app_url)
        page.get_by_role("tab", name="LoRA").click()
        first = page.locator("#lora-adapter input").input_value()  # preselected: made for this model
        assert first.startswith("demo-lora ") and page.evaluate(FITS, "#lora-adapter input"), first
        page.locator("#lora-adapter input").click()
        entries = [o.strip().splitlines()[-1] for o in page.locator("#lora-adapter [role=option]").all_inner_texts()]
        assert len(entries) >= 2, entries
        for entry in [*(e for e in entries if e != first), first]:  # each with the list open
            page.get_by_role("option", name=entry, exact=True).click()
            page.wait_for_function("(entry) => document.querySelector('#lora-adapter input').value === entry", arg=entry)
            page.wait_for_timeout(300)
            assert page.evaluate(FITS, "#lora-adapter input"), entry
            page.locator("#lora-adapter input").click()
        page.keyboard.press("Escape")

        page.locator("#lora-image input[type=file]").set_input_files(EXAMPLE)
        page.wait_for_function(PICTURE_SHOWN, arg="#lora-image")
        page.locator("#lora-prompt textarea").fill(prompt)
        left, _ = run_side_by_side(page)
        assert left.strip() == greedy[EXAMPLE]

        page.locator("#lora-image input[type=file]").set_input_files(tall)  # in place of the first
        page.wait_for_function(PICTURE_SHOWN, arg="#lora-image")
        page.wait_for_function("() => ['#lora-left-answer', '#lora-right-answer'].every(b => "
                               "document.querySelector(`${b} textarea`).value === '')")
        page.get_by_role("button", name="Token-level difference").click()
        page.wait_for_function("() => /first differ|never differ/.test(document.querySelector('#lora-diff').innerText)"
                               " && document.querySelector('#lora-left-answer textarea').value.trim()",
                               timeout=180_000)
        assert page.locator("#lora-left-answer textarea").input_value().strip() == greedy[tall]
        assert page.locator("#lora-right-answer textarea").input_value().strip()
        assert page.evaluate(SPLIT_WORDS, ["#lora-diff", SHORT_WORD]) == []
        # both answers wrap inside the page (spans kept whole with white-space: pre ran off its right)
        assert page.evaluate(FITS, "#lora-diff .g4v-lora-diff")
        page.screenshot(path=str(shots / "readable-3-lora.png"), full_page=True)


@pytest.mark.parametrize("width", [1280, 900])
def test_port_table_breaks_no_word_inside(app_url, shots, width):
    """vLLM port tab at a 1280- and a 900-pixel window: no word of the level table's headers
    ("share of tolerance used", "max relative diff") is drawn across two lines (its rows need the
    vLLM environment: tests/test_app_tabs.py). The vision LoRA options' audit note follows the
    typed LoRA arguments: a finding, or the one line that refuses them."""
    with browser_page(width=width, height=1200) as page:
        page.goto(app_url)
        page.get_by_role("tab", name="vLLM port").click()
        page.wait_for_selector("#port-levels th")
        assert page.evaluate(SPLIT_WORDS, ["#port-levels", SHORT_WORD]) == []
        if width == 1280:  # the vision LoRA options' audit follows what is typed, before anything runs
            note = "() => document.querySelector('#port-lora-audit').innerText"
            page.get_by_text("Vision LoRA and vLLM serving").click()  # closed on a checkpoint without one
            page.wait_for_selector("#port-lora-audit")
            assert "has no vision LoRA" in page.evaluate(note)  # the bundled checkpoint: merged weights
            box = page.locator("#port-vllm-serving textarea, #port-vllm-serving input").first
            box.fill('{"hf_overrides": {"adapter_path": "granite4-vision-tiny"}}')
            page.wait_for_function(f"() => ({note})().includes('hf_overrides adapter_path is read by no code')")
            box.fill('{"default_mm_loras": {"image": "/etc"}}')
            page.wait_for_function(f"() => ({note})().includes('Not usable')")
            assert "may only name this checkpoint's folder" in page.evaluate(note)
        page.screenshot(path=str(shots / f"readable-4-port-{width}.png"), full_page=True)


def test_bold_labels_are_drawn_in_the_page_font_alone(app_url, shots):
    """The title, the banner's bold words, a semibold button ("Open in LoRA") and a code span are
    each drawn by Chromium in the theme's own fonts only, no glyph from a system fallback
    (``CSS.getPlatformFontsForNode``: the fonts that drew a node's text, with their glyph counts).
    With Gradio 6.31's default theme these came out mostly in DejaVu Sans, their A and B alone in
    Source Sans (webapp.layout.workbench_theme)."""
    with browser_page() as page:
        page.goto(app_url)
        page.get_by_role("tab", name="Evaluate").click()
        page.locator("#eval-open-lora").wait_for()
        page.evaluate("document.fonts.ready")
        cdp = page.context.new_cdp_session(page)
        cdp.send("DOM.enable")
        cdp.send("CSS.enable")
        root = cdp.send("DOM.getDocument", {"depth": -1})["root"]["nodeId"]
        for selector in ["h1", "strong", "#eval-open-lora", "code"]:
            node = cdp.send("DOM.querySelector", {"nodeId": root, "selector": selector})["nodeId"]
            drawn = cdp.send("CSS.getPlatformFontsForNode", {"nodeId": node})["fonts"]
            assert drawn and all(font["isCustomFont"] for font in drawn), (selector, drawn)
        page.locator("#eval-open-lora").screenshot(path=str(shots / "readable-open-in-lora.png"))
