"""A new user's walk through the tabs, in headless Chromium against the served app: the long runs
show a bar with the time left and a busy button, results that a refusal or another picture made
old say so, and what the page says is whole (no clipped names or cut columns). The pictures'
own contents (greys under heatmaps, notes of a run whose rows all failed, whole token labels) are
checked on the figures in tests/test_figure_text.py."""

import re
import time

from PIL import Image

from g4v.paths import EXAMPLES_DIR
from tests.browser import browser_page, pick_pdf_pages
from tests.conftest import running_app
from tests.test_browser_ux import BADGE_SHOWN
from webapp.runs import OVERDUE, PREVIOUS_RUN

EXAMPLE = str(EXAMPLES_DIR / "shapes-tall.png")
OTHER = str(EXAMPLES_DIR / "shapes-wide.png")
#: A time left, as the bars say it.
LEFT = re.compile(r"about \d+ (s|min) left")


def upload(page, prefix: str, path: str) -> None:
    page.locator(f"#{prefix}-image input[type=file]").set_input_files(path)
    page.wait_for_selector(f"#{prefix}-image img")


def text_of(page, selector: str) -> str:
    return page.locator(selector).inner_text()


#: The progress bar's line drawn over the status box ``#PREFIX-status``, whether it lies inside the
#: window, and whether the box's own hint is out of sight under it (the bar's veil is translucent:
#: the hint's words showed through the bar's line): [text, in view, hint hidden], or null while no
#: bar shows there.
BAR = """(prefix) => { const box = document.querySelector(`#${prefix}-status`);
    const bar = box && box.querySelector('.progress-text'); if (!bar) return null;
    const r = bar.getBoundingClientRect(), hint = box.querySelector('[data-testid=markdown-wrapper]');
    return [box.innerText, r.height > 0 && r.top >= 0 && r.bottom <= window.innerHeight,
            getComputedStyle(hint).visibility === 'hidden']; }"""
#: The status box's hint, as it reads when no run works: [its text, shown].
HINT = """(prefix) => { const hint = document.querySelector(`#${prefix}-status [data-testid=markdown-wrapper]`);
    return [hint.innerText, getComputedStyle(hint).visibility === 'visible']; }"""


def watch_run(page, prefix: str, busy: str, done: str, timeout: float) -> list[str]:
    """Press the tab's run button (``#PREFIX-run``) and, until ``done`` (a JavaScript condition)
    holds, read the bar on the status box under the picture: while it shows,
    the button says ``busy``, disabled, the bar is inside the window and the box's hint is hidden
    under it; afterwards the hint shows again. Returns the bar's lines."""
    # Each look is one snapshot of the page (the bar, the button, whether the run is done), taken in
    # one evaluation: read one by one, the run could end between the bar and the button on a busy
    # machine, and a bar read just before the end met the button given back just after.
    snapshot = f"""() => {{ const button = document.querySelector('#{prefix}-run');
        return [({done})(), ({BAR})('{prefix}'), button.innerText, button.disabled]; }}"""
    # the hint shows before the run (waited for: a refused run's bar may still be leaving the box)
    page.wait_for_function(f"() => {{ const [text, shown] = ({HINT})('{prefix}'); return shown && text.trim(); }}",
                           timeout=10_000)
    hint = page.evaluate(HINT, prefix)[0]
    page.locator(f"#{prefix}-run").click()
    started = time.monotonic()
    seen, deadline = [], started + timeout
    while time.monotonic() < deadline:
        finished, bar, label, disabled = page.evaluate(snapshot)
        if finished:
            break
        if bar is not None:
            seen.append((label, disabled, *bar))
        # looked at closely while the bar comes (the hint stayed readable under it for 0.15 s, as
        # Gradio faded the box), then every half second
        time.sleep(0.02 if time.monotonic() - started < 1.5 else 0.5)
    assert page.evaluate(done), seen[-3:]
    assert seen, f"no progress bar showed on #{prefix}-status"
    assert all(label == busy and disabled for label, disabled, *_ in seen), seen[:3]
    assert all(in_view for _, _, _, in_view, _ in seen), seen[:3]
    # the bar names its stages ("... - 16.0%"), and while it shows, the hint is out of sight under it
    assert any("%" in line for _, _, line, _, _ in seen), seen[:3]
    overlaid = [(line, hidden) for _, _, line, _, hidden in seen if not hidden or hint in line]
    assert not overlaid, overlaid[:3]
    page.wait_for_function(f"() => ({HINT})('{prefix}')[1]")  # the hint is back for the next run
    return [line for _, _, line, _, _ in seen]


def evaluate(page, limit: int | None = None) -> str:
    """Run the Evaluate tab as it is set (``limit`` rows) and wait for its status: returns it."""
    if limit is not None:
        page.locator("#eval-limit input").fill(str(limit))
    page.locator("#eval-run").click()
    page.wait_for_function("(n) => document.querySelector('#eval-status').innerText.includes('Finished')"
                           " && (n === null || document.querySelector('#eval-status').innerText.includes(`${n} sample`))",
                           arg=limit, timeout=300_000)
    return text_of(page, "#eval-status")


def test_attribution_shows_its_stages_and_the_time_left_in_view_and_a_busy_button(app_url):
    """"drawing, about 1 s left" for 12 s, a bar below the fold, a button that did not change: the
    bar under the picture (in view in a 1280 x 900 window) names each stage and the drawing of each
    picture with the time left, and the button says "Explaining…", disabled, until the run ends."""
    with browser_page(height=900) as page:
        page.goto(app_url)
        page.get_by_role("tab", name="Attribution").click()
        page.locator("#attribution-run").click()  # no picture: refused, and the button is back at once
        page.wait_for_selector("[data-testid='toast-body']")
        page.wait_for_function("() => !document.querySelector('#attribution-run').disabled"
                               " && document.querySelector('#attribution-run').innerText === 'Explain'")
        # no "Error" over the hint (the toast says it): waited for, as the step that clears it may lag
        page.wait_for_function(f"() => !({BADGE_SHOWN})('#attribution-status')", timeout=10_000)
        upload(page, "attribution", EXAMPLE)
        done = "() => document.querySelector('#attribution-report').innerText.includes('Deletion test')" \
               " && !document.querySelector('#attribution-run').disabled"
        lines = watch_run(page, "attribution", "Explaining…", done, timeout=240)
        # the time left, or that a stage outlasts it (this checkpoint's stages are not the demo's, whose
        # times the bar's shares are: a stage may spend its estimate of less than a second at once)
        assert any(LEFT.search(line) or OVERDUE in line for line in lines), lines
        drawn = {match for line in lines for match in re.findall(r"drawing the [\w' -]+?(?=,| -|\n|$)", line)}
        assert len(drawn) >= 2, lines  # the drawing is said picture by picture, not as one stage
        assert page.locator("#attribution-run").inner_text() == "Explain"


def test_attribution_results_go_old_with_another_answer_token_and_a_picture_uploaded_while_it_runs(app_url):
    """Results stood unmarked under what they were not computed from: another answer token chosen
    after a run, and a picture uploaded while a run worked (its end wrote the first picture's
    report over the mark that the upload had set). Both now mark the report; the results stay."""
    mark = PREVIOUS_RUN.strip("*")
    marked = "(mark) => document.querySelector('#attribution-report').innerText.includes(mark)"
    with browser_page(height=1400) as page:
        page.goto(app_url)
        page.get_by_role("tab", name="Attribution").click()
        upload(page, "attribution", EXAMPLE)
        page.locator("#attribution-run").click()
        page.wait_for_function("() => document.querySelector('#attribution-report').innerText.includes('Deletion test')"
                               " && !document.querySelector('#attribution-run').disabled", timeout=240_000)
        assert mark not in text_of(page, "#attribution-report")
        page.locator("#attribution-token input").click()
        page.get_by_role("option", name=re.compile("^1: ")).first.click()
        page.wait_for_function(marked, arg=mark)
        page.locator("#attribution-run").click()  # token 1 explained: its own results, unmarked at the end
        page.wait_for_function("() => document.querySelector('#attribution-run').disabled")
        upload(page, "attribution", OTHER)  # while the run works
        assert page.locator("#attribution-run").is_disabled(), "the run ended before the upload: nothing tested"
        page.wait_for_function("() => !document.querySelector('#attribution-run').disabled", timeout=240_000)
        # the mark is a quick step after the run, beside the one that gives the button back: waited for
        # as long as a loaded machine may take (10 s once ran out in a fresh-clone run of the whole suite)
        page.wait_for_function(marked, arg=mark, timeout=60_000)
        report = text_of(page, "#attribution-report")
        assert "answer token 1" in report and "Deletion test" in report, report  # kept, under the mark


def test_deepstack_marks_its_results_as_the_previous_runs_after_a_refusal_or_another_picture(app_url):
    """Stale results looked current: after a refused run, or once the picture is removed or
    replaced, the report above the results says they are the previous run's; the results stay.
    While a run works its button says so, disabled (it read "Inspect" throughout), and the bar
    under the picture names its stages (it showed only the seconds, over every result box)."""
    from webapp.deepstack import INSPECT, INSPECTING

    with browser_page(height=1400) as page:
        page.goto(app_url)
        page.get_by_role("tab", name="Deepstack").click()
        upload(page, "deepstack", EXAMPLE)
        done = "() => document.querySelector('#deepstack-report').innerText.includes('Next token')" \
               " && !document.querySelector('#deepstack-run').disabled"
        lines = watch_run(page, "deepstack", INSPECTING, done, timeout=120)
        assert any("drawing the" in line for line in lines), lines
        assert PREVIOUS_RUN.strip("*") not in text_of(page, "#deepstack-report")
        page.wait_for_function("(idle) => { const b = document.querySelector('#deepstack-run');"
                               " return !b.disabled && b.innerText === idle; }", arg=INSPECT)
        scale = page.get_by_label("Scale levels")
        scale.fill("deepstack0=abc")
        page.locator("#deepstack-run").click()
        page.wait_for_selector("[data-testid='toast-body']")
        page.wait_for_function("(mark) => document.querySelector('#deepstack-report').innerText.includes(mark)",
                               arg=PREVIOUS_RUN.strip("*"))
        assert page.locator("#deepstack-norms img").count() == 1  # kept, marked
        scale.fill("")
        page.locator("#deepstack-run").click()  # a good run: its own results, no mark
        page.wait_for_function("(mark) => { const r = document.querySelector('#deepstack-report').innerText;"
                               " return r.includes('Next token') && !r.includes(mark); }",
                               arg=PREVIOUS_RUN.strip("*"), timeout=120_000)
        page.locator("#deepstack-image button[aria-label='Remove Image']").click()
        page.wait_for_function("(mark) => document.querySelector('#deepstack-report').innerText.includes(mark)",
                               arg=PREVIOUS_RUN.strip("*"))


def test_the_port_run_has_a_bar_with_the_time_left_and_stale_results_are_marked(app_url):
    """The port's run (about a minute here) showed only "processing | 20.7 s": the bar under the
    picture names its stages (the command's progress lines, read as they come) with the time left,
    counted down while a stage lasts, the button says "Comparing…"; a refusal afterwards marks "Agrees" as the previous run's."""
    from g4v.engines import vllm_python

    assert vllm_python() is not None, "the vLLM environment is missing: make vllm-env"
    with browser_page(height=900) as page:
        page.goto(app_url)
        page.get_by_role("tab", name="vLLM port").click()
        upload(page, "port", EXAMPLE)
        done = "() => document.querySelector('#port-verdict').innerText.includes('Agrees')" \
               " && !document.querySelector('#port-run').disabled"
        lines = watch_run(page, "port", "Comparing…", done, timeout=500)
        assert any("starting vLLM" in line for line in lines) and any(LEFT.search(line) for line in lines), lines
        # vLLM's start (a stage of 15 s or more) counts its time left down, not one frozen estimate
        starting = {LEFT.search(line).group(0) for line in lines if "starting vLLM" in line and LEFT.search(line)}
        assert len(starting) >= 2, lines
        prompt = page.locator("#port-prompt textarea")
        prompt.fill("  ")  # refused before vLLM starts
        page.locator("#port-run").click()
        page.wait_for_selector("[data-testid='toast-body']")
        page.wait_for_function("(mark) => document.querySelector('#port-verdict').innerText.includes(mark)",
                               arg=PREVIOUS_RUN.strip("*"))
        assert "Agrees" in text_of(page, "#port-verdict")  # kept, under the mark
        page.wait_for_function(f"() => !({BADGE_SHOWN})('#port-status')", timeout=10_000)  # no "Error" over the hint
        page.wait_for_function("() => !document.querySelector('#port-run').disabled"
                               " && document.querySelector('#port-run').innerText === 'Compare'")  # back for the next run


def test_the_port_tab_says_the_one_command_that_turns_it_on():
    """``make run`` leaves the vLLM environment out: the tab says how to build it, and Compare is off."""
    with running_app("--model", "assets/granite4-vision-tiny", env={"G4V_VLLM_PYTHON": "/nonexistent/python"}) as url:
        with browser_page() as page:
            page.goto(url)
            page.get_by_role("tab", name="vLLM port").click()
            hint = text_of(page, "#port-setup-hint")
            assert "make vllm-env" in hint and "restart" in hint
            assert page.locator("#port-run").is_disabled()


def test_a_new_run_of_evaluate_forgets_the_row_picked_in_the_last(app_url):
    """"Row 10 selected" stayed after a new run, and Open in Chat then failed: the new run's rows
    replace the old ones, and the pick with them."""
    with browser_page(width=1400, height=1000) as page:
        page.goto(app_url)
        page.get_by_role("tab", name="Evaluate").click()
        evaluate(page, limit=4)
        page.locator("#eval-samples [data-testid=cell-2-0]").click()
        page.wait_for_function("() => document.querySelector('#eval-picked').innerText.includes('selected')"
                               " && !document.querySelector('#eval-picked').innerText.includes('No row')")
        evaluate(page, limit=2)
        page.wait_for_function("() => document.querySelector('#eval-picked').innerText.includes('No row selected')")


def test_evaluate_says_that_every_row_failed_and_why(app_url, tmp_path):
    """A table whose pictures are missing: every row fails. The status says so with the first
    row's error (the pictures said "no reference answers" and "needs both arms on local
    transformers"; their notes are checked in tests/test_figure_text.py)."""
    table = tmp_path / "rows.csv"
    table.write_text("image,prompt,answer\n" + "".join(f"missing{i}.png,What colour is it?,red\n" for i in range(3)))
    with browser_page(width=1400, height=1000) as page:
        page.goto(app_url)
        page.get_by_role("tab", name="Evaluate").click()
        page.locator("#eval-upload input[type=file]").set_input_files(str(table))
        page.wait_for_function("() => document.querySelector('#eval-dataset-info').innerText.includes('3 rows')")
        status = evaluate(page)
        assert "Every row failed (3 of 3)" in status and "missing0.png" in status, status


def test_chat_says_earlier_pictures_stay_and_a_refused_file_is_said_once_and_goes(app_url, tmp_path):
    """A second picture was answered about the first and nothing said why; a refused fake.png gave a
    doubled "Warning (2)" toast, and its line stayed after a good picture was attached."""
    fake = tmp_path / "fake.png"
    fake.write_bytes(b"not a picture at all")
    with browser_page(height=1400) as page:
        page.goto(app_url)
        note = text_of(page, "#chat-context-note")
        assert "earlier pictures" in note and "Clear" in note and "Open in Chat" in note
        page.locator("#chat-box input[type=file]").set_input_files(str(fake))
        page.wait_for_function("() => { const line = document.querySelector('#chat-left-out');"
                               " return !!line && line.offsetParent !== null && line.innerText.includes('fake.png'); }")
        page.wait_for_timeout(2500)  # the box's second change event has come and gone
        toasts = page.locator("[data-testid='toast-body']").all_inner_texts()
        assert len(toasts) == 1 and toasts[0].count("fake.png is not an image") == 1, toasts
        assert "(2)" not in toasts[0]
        page.locator("#chat-box input[type=file]").set_input_files(EXAMPLE)
        page.wait_for_function("() => document.querySelectorAll('#chat-box .thumbnail-item').length == 1")
        page.wait_for_function("() => !document.querySelector('#chat-left-out')"
                               " || document.querySelector('#chat-left-out').offsetParent === null")


def test_tiling_selects_a_visible_token_keeps_the_box_true_and_shows_the_pdf_whole(app_url, tmp_path):
    """The first token sat at the top-left corner under the picture's label; a refused index -5 left
    -5 in the box beside token 156's picture; the PDF picker beside the picture cut the file's name
    ("r….pdf") and its sixth thumbnail column."""
    pages = [Image.new("RGB", (200, 260), colour) for colour in ("red", "green", "blue", "grey", "orange", "purple")]
    pdf = tmp_path / "a-report-with-six-pages.pdf"
    pages[0].save(pdf, save_all=True, append_images=pages[1:])
    with browser_page(height=1400) as page:
        page.goto(app_url)
        page.get_by_role("tab", name="Tiling").click()
        upload(page, "tiling", OTHER)
        page.wait_for_selector("#tiling-token-view img")
        info = text_of(page, "#tiling-token-info")
        row, col = (int(x) for x in re.search(r"row (\d+), column (\d+)", info).groups())
        assert (row, col) != (0, 0), info  # not the corner token
        label = page.locator("#tiling-token-view [data-testid='block-label']")
        assert label.count() == 0 or not label.first.is_visible()  # no label over the picture
        shown = page.locator("#tiling-token-index input").input_value()
        box = page.locator("#tiling-token-index input")
        box.fill("-5")
        box.press("Enter")
        page.wait_for_selector("[data-testid='toast-body']")
        page.wait_for_function("(n) => document.querySelector('#tiling-token-index input').value === n", arg=shown)
        assert f"Token {shown} " in text_of(page, "#tiling-token-info")

        pick_pdf_pages(page, "tiling", pdf, thumbnails=6, use=False)
        name = text_of(page, "#tiling-doc-pdf").replace("\n", "")  # the name and its extension are two elements
        assert pdf.name in name, name  # whole, not "a….pdf"
        strip = page.locator("#tiling-doc-thumbnails").bounding_box()
        for cell in page.locator("#tiling-doc-thumbnails img").all():
            right = cell.bounding_box()
            assert right["x"] + right["width"] <= strip["x"] + strip["width"] + 1, (right, strip)
