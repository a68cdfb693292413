"""The Training tab in headless Chromium, against the app serving a run folder that holds a real
Trainer run with its checkpoints: open the run and see its table (the library's numbers), its
curves, then two steps side by side (the library's answers); a run outside the run folders and an
empty one are one toast each, leave no "Error" badge, and the tab works on afterwards."""

import pytest

from g4v.training.callback import monitor_training
from g4v.training.measure import default_probe, open_steps
from g4v.training.report import open_run, summary_rows
from g4v.training.settings import MonitorSettings
from tests.browser import CHROMIUM, browser_page
from tests.conftest import running_app
from tests.test_browser_ux import BADGE_SHOWN, close_toasts, toast_says
from tests.training_runs import examples, fresh_model, make_trainer

PICTURE_LOADED = ("(selector) => { const i = document.querySelector(selector + ' img');"
                  " return !!i && i.complete && i.naturalWidth > 0 }")


@pytest.fixture(scope="module")
def runs(hf_engine, tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    model = fresh_model()
    run = make_trainer(model, examples(hf_engine), root / "tiny-run", 3, tensorboard=False)
    with monitor_training(run.trainer, MonitorSettings(every=1)):
        run.trainer.train()
    (root / "empty-run").mkdir()
    return root


@pytest.fixture(scope="module")
def app(runs):
    with running_app("--runs-dir", str(runs)) as url:
        yield url


def choose_run(page, name: str) -> None:
    box = page.locator("#training-run input")
    box.fill(name)
    box.press("Enter")
    page.locator("#training-open").click()


def table_rows(page, element: str, count: int = 8) -> list[list[str]]:
    """The rows of a gr.Dataframe (Gradio 6 draws them as grid rows) once it shows ``count``."""
    read = ("(selector) => [...document.querySelectorAll(selector + ' [role=row].virtual-row')]"
            ".map(row => [...row.querySelectorAll('[role=gridcell]')].map(cell => cell.textContent.trim()))")
    page.wait_for_function(f"(selector) => ({read})(selector).filter(row => row[0]).length >= {count}", arg=element,
                           timeout=60_000)
    return [row for row in page.evaluate(read, element) if row and row[0]]


def choose(page, element: str, option: str) -> None:
    page.locator(f"{element} input").click()
    page.get_by_role("option", name=option, exact=True).filter(visible=True).first.click()
    page.locator(f"{element} input").press("Escape")


def test_the_training_tab_in_a_browser(app, runs, output_dir):
    assert CHROMIUM, "Debian's chromium is needed (scripts/setup_browser.sh installs it)"
    curves = open_run("tiny-run", [runs])
    with browser_page(height=1600) as page:
        page.goto(app)
        page.wait_for_selector("#model-banner")
        page.get_by_role("tab", name="Training").click()
        choose_run(page, "tiny-run")
        page.wait_for_function("() => document.querySelector('#training-status').innerText.includes('records from')",
                               timeout=120_000)
        assert "3 records from the Trainer's trainer_state.json, steps 1-3, no warnings" in \
            page.inner_text("#training-status")
        page.wait_for_function(PICTURE_LOADED, arg="#training-curves")
        shown = table_rows(page, "#training-table")
        expected = summary_rows(curves)
        assert [row[0] for row in shown] == [row[0] for row in expected]
        for got, want in zip(shown, expected):
            for cell, value in zip(got[1:-1], want[1:-1]):
                assert float(cell) == pytest.approx(value, rel=1e-3), (got, want)
        page.screenshot(path=str(output_dir / "training-tab.png"), full_page=True)

        # Two steps side by side: the library's numbers and answers for the same picture and prompt.
        choose(page, "#training-step-a", "0")
        choose(page, "#training-step-b", "3")
        page.locator("#training-steps").click()
        page.wait_for_function(PICTURE_LOADED, arg="#training-step-figure", timeout=180_000)
        picture, prompt = default_probe()[0]
        views = open_steps(curves, (0, 3), picture, prompt)
        assert page.input_value("#training-answer-a textarea") == views[0].answer
        assert page.input_value("#training-answer-b textarea") == views[1].answer
        rows = table_rows(page, "#training-step-table")
        assert [float(rows[0][1]), float(rows[0][2])] == pytest.approx(
            [views[0].record.levels[0].injected_norm, views[1].record.levels[0].injected_norm], rel=1e-3)

        # Bad runs: one toast each, no badge, the last run's results stay, and the tab still works.
        for typed, said in (("../../etc", "is outside the run folders"),
                            ("empty-run", "holds no training log, trainer_state.json")):
            choose_run(page, typed)
            toast_says(page, said)
            page.wait_for_timeout(1000)
            for element in ("#training-status", "#training-table", "#training-curves"):
                assert not page.evaluate(BADGE_SHOWN, element), (typed, element)
            close_toasts(page)
        assert page.evaluate(PICTURE_LOADED, "#training-curves")
        choose_run(page, "tiny-run")
        page.wait_for_function(PICTURE_LOADED, arg="#training-curves")
        assert "3 records" in page.inner_text("#training-status")
