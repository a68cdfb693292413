"""The real app in headless Chromium (Debian's package, driven by Playwright): chat with an image,
then the Tiling and Deepstack tabs. Screenshots land in test-output/browser/."""

import pytest

from g4v.paths import EXAMPLES_DIR
from tests.browser import CHROMIUM, browser_page

EXAMPLE = str(EXAMPLES_DIR / "shapes-tall.png")


@pytest.fixture(scope="module")
def shots(output_dir):
    folder = output_dir / "browser"
    folder.mkdir(exist_ok=True)
    return folder


def test_chat_tiling_and_deepstack_in_a_browser(app_url, shots):
    assert CHROMIUM, "Debian's chromium is needed (scripts/setup_browser.sh installs it)"
    with browser_page() as page:
        page.goto(app_url)
        page.wait_for_selector("#model-banner")
        assert "Demo checkpoint in use" in page.inner_text("#model-banner")

        # Chat: attach an image, type, send, and watch the answer stream in.
        page.locator("input[type=file]").first.set_input_files(EXAMPLE)
        page.locator("textarea").first.fill("Which shapes do you see?")
        page.wait_for_timeout(500)
        page.keyboard.press("Enter")
        bot = page.locator(".message.bot, [data-testid='bot']").last
        bot.wait_for(state="visible")
        page.wait_for_function(
            "() => { const m = document.querySelectorAll('[data-testid=\"bot\"]');"
            " return m.length && m[m.length - 1].innerText.trim().length > 0 }"
        )
        page.screenshot(path=str(shots / "1-chat.png"), full_page=True)
        assert page.locator("[data-testid='bot']").last.inner_text().strip()

        # Tiling: use the image just sent in chat, see the overlay.
        page.get_by_role("tab", name="Tiling").click()
        page.locator("#tiling-from-chat").click()
        overlay = page.locator("#tiling-overlay img")
        overlay.wait_for(state="visible")
        page.wait_for_function("() => { const i = document.querySelector('#tiling-overlay img');"
                               " return i && i.naturalWidth > 0 }")
        page.screenshot(path=str(shots / "2-tiling.png"), full_page=True)

        # Deepstack: same image, run the inspector, see the norms chart.
        page.get_by_role("tab", name="Deepstack").click()
        page.locator("#deepstack-from-chat").click()
        page.wait_for_timeout(500)
        page.locator("#deepstack-run").click()
        page.locator("#deepstack-norms img").wait_for(state="visible", timeout=120_000)
        page.wait_for_function("() => { const i = document.querySelector('#deepstack-norms img');"
                               " return i && i.naturalWidth > 0 }")
        page.screenshot(path=str(shots / "3-deepstack.png"), full_page=True)
