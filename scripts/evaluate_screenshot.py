"""Take the README's picture of the Evaluate tab: the app on the trained demo checkpoint, base vs
the French adapter on the bundled dataset, in headless Chromium (the browser test's own steps).

    .venv/bin/python scripts/evaluate_screenshot.py [--rows 24] [--out docs/images/evaluate_tab.png]
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.browser import browser_page  # noqa: E402
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
        page.evaluate("window.scrollTo(0, 0)")  # bounding boxes are measured in the viewport
        top = page.locator("#eval-arm-a").bounding_box()["y"] - 60
        bottom = page.locator("#eval-picked").bounding_box()
        page.screenshot(path=args.out, full_page=True,
                        clip={"x": 0, "y": top, "width": 1280, "height": bottom["y"] + bottom["height"] + 10 - top})
    from PIL import Image

    Image.open(args.out).convert("RGB").quantize(256).save(args.out, optimize=True)  # a page shot needs few colours
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
