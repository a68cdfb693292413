"""The Attribution tab in headless Chromium: upload, explain, see the maps, the deletion curve and
the report; an empty prompt gives one line and keeps the picture. Screenshots in test-output/browser/."""

from g4v.paths import EXAMPLES_DIR
from tests.browser import CHROMIUM, browser_page

EXAMPLE = str(EXAMPLES_DIR / "shapes-tall.png")


def test_attribution_tab_in_a_browser(app_url, output_dir):
    assert CHROMIUM, "Debian's chromium is needed (scripts/setup_browser.sh installs it)"
    shots = output_dir / "browser"
    shots.mkdir(exist_ok=True)
    with browser_page() as page:
        page.goto(app_url)
        page.wait_for_selector("#model-banner")
        page.get_by_role("tab", name="Attribution").click()
        page.locator("#attribution-image input[type=file]").set_input_files(EXAMPLE)
        page.wait_for_timeout(500)
        page.locator("#attribution-run").click()
        for element in ("#attribution-tiles", "#attribution-deletion"):
            page.wait_for_function(f"() => {{ const i = document.querySelector('{element} img');"
                                   " return i && i.naturalWidth > 0 }", timeout=120_000)
        report = page.inner_text("#attribution-report")
        assert "Explained:" in report and "Deletion test" in report
        page.screenshot(path=str(shots / "attribution.png"), full_page=True)

        page.locator("#attribution-prompt textarea").fill("   ")
        page.locator("#attribution-run").click()
        page.wait_for_selector("[data-testid='toast-body']", timeout=60_000)
        assert "the prompt is empty" in " ".join(page.locator("[data-testid='toast-body']").all_inner_texts())
        assert page.locator("#attribution-image img").count() >= 1  # the picture is still there
