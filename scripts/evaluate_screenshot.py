"""Take docs/evaluate.md's picture of the Evaluate tab: the app on the trained demo checkpoint, base vs
the French adapter on the bundled dataset, in headless Chromium (the browser test's own steps).

    .venv/bin/python scripts/evaluate_screenshot.py [--rows 24] [--out docs/images/evaluate_tab.png]
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.browser import browser_page, save_section  # noqa: E402
from tests.conftest import running_app  # noqa: E402
from tests.test_evaluate_app import run_in_browser  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=24)
    parser.add_argument("--out", default="docs/images/evaluate_tab.png")
    args = parser.parse_args()
    with running_app() as url, browser_page(width=1280, height=900) as page:
        run_in_browser(page, url, args.rows)
        page.locator("#eval-samples [data-testid=cell-0-3]").click()  # a selected row, as a user would have
        save_section(page, args.out, "#eval-arm-a", "#eval-picked", width=1280, above=60)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
