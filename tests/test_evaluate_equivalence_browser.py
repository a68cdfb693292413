"""The Evaluate tab's "can it say no change" parts in Chromium: the detectable difference follows the
row limit before any run, and a noise-floor run (arm B "same as arm A") shows its Equivalence block
with zero disagreement."""

from g4v.evaluate.equivalence import DISCORDANCE, detectable_difference, plan_line
from g4v.evaluate.stats import detectable
from tests.browser import browser_page

PLAN = "#eval-plan"


def plan_shows(page, text: str) -> None:
    page.wait_for_function("([box, text]) => (document.querySelector(box) || {}).innerText?.includes(text)",
                           arg=[PLAN, text], timeout=60_000)


def test_the_plan_follows_the_limit_and_a_noise_floor_run_shows_zero(app_url, output_dir):
    with browser_page(height=1600) as page:
        page.goto(app_url)
        page.get_by_role("tab", name="Evaluate").click()
        # the bundled dataset has 300 rows; the tab's first limit is 24, too few for any difference at 10 %
        plan_shows(page, plan_line(detectable(24, DISCORDANCE)))
        page.locator("#eval-limit input").fill("300")
        page.locator("#eval-limit input").press("Tab")
        points = f"{100 * detectable_difference(300, DISCORDANCE):.1f} points"
        plan_shows(page, f"on 300 rows, assuming 10% of rows right in one arm only: {points}")
        page.locator("#eval-discordance input").fill("0.3")
        page.locator("#eval-discordance input").press("Tab")
        plan_shows(page, f"{100 * detectable_difference(300, 0.3):.1f} points")

        page.locator("#eval-limit input").fill("4")
        page.locator("#eval-arm-b input").click()
        page.locator("#eval-arm-b [role=option]", has_text="same as arm A").filter(visible=True).first.click()
        page.locator("#eval-arm-b input").press("Escape")
        page.locator("#eval-run").click()
        page.wait_for_function("() => /Finished/.test(document.querySelector('#eval-status').innerText)",
                               timeout=300_000)
        block = page.inner_text("#eval-equivalence")
        assert "Equivalence" in block and "noise floor (A run twice): 0 of 4 rows disagree" in block, block
        assert "margin ±2 points" in block
        page.locator("#eval-equivalence").screenshot(path=str(output_dir / "evaluate-equivalence.png"))
        page.screenshot(path=str(output_dir / "evaluate-equivalence-page.png"), full_page=True)
