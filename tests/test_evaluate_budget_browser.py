"""The Evaluate tab's token-budget sweep, served by the app (the trained demo checkpoint): the
``/evaluate_budget`` API refuses bad input in one line and its curve's keep=100 point is the plain
model (checked against a ``/evaluate`` run of the app's model against itself); then the sweep run
in Chromium shows its table and its curve picture."""

import re

import pytest
from gradio_client import Client

from tests.browser import browser_page
from tests.conftest import running_app

ROWS = 2  # one picture, two questions: the sweep runs 3 small runs


@pytest.fixture(scope="module")
def app():
    with running_app() as url:
        yield url


@pytest.fixture(scope="module")
def client(app):
    return Client(app, verbose=False)


def sweep(client, keeps="100,25", policies=("norm", "random"), arm="app", limit=ROWS):
    return client.predict(arm, "bundled", None, *[""] * 5, limit, -1, 4, keeps, list(policies),
                          api_name="/evaluate_budget")


@pytest.mark.parametrize("keeps, policies, expected", [
    ("0", ("norm",), "keep must be a whole percentage from 1 to 100"),
    ("100,half", ("norm",), "kept percentage 'half' is not a whole number"),
    ("100,50", (), "choose at least one token policy"),
])
def test_bad_sweeps_are_one_line(client, keeps, policies, expected):
    with pytest.raises(Exception) as refused:
        sweep(client, keeps, policies)
    message = str(refused.value)
    assert expected in message and "\n" not in message.strip() and "Traceback" not in message
    assert not re.search(r"/(tmp|work|home|root)/", message), message


def test_the_api_curve_starts_at_the_plain_model(client):
    table, picture, curve = sweep(client)
    assert [(p["policy"], p["keep"]) for p in curve["points"]] == [("norm", 100), ("norm", 25), ("random", 100),
                                                                   ("random", 25)]
    *_, summary = client.predict("app", "app", "bundled", None, *[""] * 5, ROWS, -1, 4, False, False,
                                 api_name="/evaluate")
    plain = summary["arms"]["a"]["accuracy"]
    for point in curve["points"]:
        assert point["n"] == ROWS
        if point["keep"] == 100:
            assert point["accuracy"] == plain and point["agreement"] == 1.0 and point["kl_mean"] == 0.0
    assert "| random | 25% |" in table and picture


def test_the_tab_runs_a_sweep_and_shows_its_curve(app, output_dir):
    with browser_page(width=1400, height=1000) as page:
        page.goto(app)
        page.get_by_role("tab", name="Evaluate").click()
        page.locator("#eval-limit input").fill(str(ROWS))
        page.locator("#eval-budget").get_by_text("Token budget").first.click()  # open the accordion
        keeps = page.locator("#eval-budget-keeps textarea, #eval-budget-keeps input").first
        keeps.fill("100,10")
        page.locator("#eval-budget-run").click()
        page.wait_for_function(
            "() => (document.querySelector('#eval-budget-status') || {}).innerText?.includes('Token budget of')",
            timeout=300_000)
        text = page.inner_text("#eval-budget-status")
        for policy, keep in (("norm", 100), ("norm", 10), ("random", 100), ("random", 10)):
            assert re.search(rf"{policy}\s+{keep}%\s+{ROWS}\b", text), text
        image = page.locator("#eval-budget-plot img").first
        image.wait_for(state="visible", timeout=60_000)
        assert image.evaluate("(img) => img.complete && img.naturalWidth") > 800
        page.locator("#eval-budget").screenshot(path=str(output_dir / "evaluate-token-budget.png"))
