"""Deepstack exports do not pile up: they live in one bounded folder inside Gradio's cache (so Gradio
serves them without a second copy), and nothing of them is left once the app stops."""

import os
from pathlib import Path

from gradio_client import Client, handle_file

from g4v.paths import BUNDLED_MODEL_DIR, EXAMPLES_DIR
from tests.conftest import running_app


def files_under(folder: Path, pattern: str) -> list[Path]:
    return sorted(folder.rglob(pattern))


def test_exports_are_not_copied_and_are_gone_after_shutdown(tmp_path):
    env = {"TMPDIR": str(tmp_path), "GRADIO_TEMP_DIR": str(tmp_path / "gradio")}
    with running_app("--model", str(BUNDLED_MODEL_DIR), env=env) as url:
        client = Client(url, verbose=False)
        for _ in range(2):
            *_, export = client.predict(handle_file(str(EXAMPLES_DIR / "shapes-wide.png")), "What colour is it?",
                                        [], "deepstack0=0.5", False, api_name="/inspect")
            assert Path(export).name.startswith("inspect-") and export.endswith(".zip")
        zips = files_under(tmp_path, "*.zip")
        assert len(zips) == 2, zips  # one per run, no copies in Gradio's cache
        assert all(z.parent.parent.name.startswith("g4v-inspect-") for z in zips)
    assert files_under(tmp_path, "*.zip") == [] and files_under(tmp_path, "capture.safetensors") == []
    assert not [p for p in tmp_path.rglob("g4v-inspect-*")]
    assert os.listdir(tmp_path)  # the check looked where the app wrote
