"""The page's fonts: every face the app's theme declares draws the whole printable ASCII set, so
no label is drawn half in the theme's font and half in a fallback (Gradio 6.31's semibold files
hold only a Cyrillic subset; webapp.layout.workbench_theme). The browser side, which fonts
Chromium actually drew labels with, is in tests/test_browser_readable.py."""

import re
from pathlib import Path

import gradio
from fontTools.ttLib import TTFont

from webapp.layout import workbench_theme

#: Where Gradio serves its front end from: a face's URL (``static/fonts/...``) is a path in it.
FRONTEND = Path(gradio.__file__).parent / "templates" / "frontend"
ASCII = {code for code in range(0x20, 0x7F)}


def declared_faces(theme) -> list[tuple[str, str]]:
    """(weight, file) of each @font-face in the theme's CSS, the file as Gradio serves it."""
    faces = re.findall(r"@font-face\s*{([^}]*)}", theme._get_theme_css())
    return [(re.search(r"font-weight:\s*(\d+)", face)[1], re.search(r"url\('([^']+)'\)", face)[1]) for face in faces]


def test_every_declared_face_draws_all_of_printable_ascii():
    faces = declared_faces(workbench_theme())
    assert {weight for weight, _ in faces} == {"400", "700"}, faces  # 600 is drawn with the 700 face
    for weight, url in faces:
        covered = set(TTFont(FRONTEND / url).getBestCmap())
        missing = "".join(chr(code) for code in sorted(ASCII - covered))
        assert not missing, f"{url} (weight {weight}) lacks {missing!r}"
