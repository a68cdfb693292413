"""``python -m g4v port-diff`` outside the vLLM environment, and its pictures (no model needed).

The comparison itself is tested against real vLLM in ``tests/vllm/test_port_diff.py``; here: the
command exists as ``port-diff``, refuses in one line where vLLM is missing, and the viz module draws
a saved summary without torch.
"""

import math
import subprocess
import sys

import pytest
from PIL import Image

from g4v.engines import vllm_installed
from g4v.paths import EXAMPLES_DIR, REPO_ROOT
from g4v.port.summary import PortDiffSummary
from tests.cli import run_cli


TOLERANCE = {"atol": 1e-5, "rtol": 1e-4, "source": "float32 defaults",
             "rule": "|vLLM - transformers| <= 1e-05 + 0.0001 * max(|transformers|, token RMS)"}


def g4v(*args):
    return run_cli(*args)


def test_port_diff_is_listed_in_help():
    result = g4v("--help")
    assert result.returncode == 0
    assert "port-diff" in result.stdout


@pytest.mark.skipif(vllm_installed(), reason="checks the refusal where vLLM is missing")
def test_without_vllm_says_to_use_the_vllm_environment():
    result = g4v("port-diff", "--image", str(EXAMPLES_DIR / "shapes-wide.png"), "--prompt", "hi")
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 1
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert "vLLM environment" in lines[0] and ".venv-vllm" in lines[0]


def test_missing_flags_are_one_line():
    result = g4v("port-diff", "--prompt", "hi")
    assert result.returncode == 2
    assert len([line for line in result.stderr.splitlines() if line.strip()]) == 1


def summary_of(**fields) -> PortDiffSummary:
    """A summary read back from JSON, as the app reads ``port-diff --json`` (the frame's fields given)."""
    return PortDiffSummary.from_dict({"model": "m", "prompt": "p", "image_size": {"width": 1, "height": 1}, **fields})


def test_figure_draws_from_a_summary_without_torch():
    code = (
        "import sys, json; from PIL import Image; import viz.port as v; "
        "assert 'torch' not in sys.modules, 'viz must not import torch'; print('ok')"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr

    from viz.port import port_diff_figure

    image = Image.new("RGB", (120, 80), "white")
    tokens = [("base", (0, 0, 60, 40)), ("base", (60, 0, 120, 40)), ("tile", (0, 40, 60, 80)),
              ("tile", (60, 40, 120, 80)), ("newline", (0, 40, 120, 80))]
    cells = {"kind": "deepstack", "max_rel_diff": None, "mean_abs_diff": None, "reference_max_abs": None, "problem": None}
    levels = [{"name": "deepstack0", "llm_layer": 3, "max_abs_diff": 3e-7, "share_of_tolerance_used": 0.02, "ok": True},
              {"name": "spatial_TL", "llm_layer": 4, "max_abs_diff": None, "share_of_tolerance_used": None, "ok": False},
              {"name": "spatial_TR", "llm_layer": 5, "max_abs_diff": 1e-9, "share_of_tolerance_used": math.inf, "ok": False}]
    levels = [{**cells, **row} for row in levels]
    trajectory = {"layers": [0, 1, 2], "injection_layers": {"1": "deepstack0"}, "rtol": 1e-4,
                  "transformers": {"image_norm": [1.0, 2.0, 2.5], "text_norm": [1.0, 1.0, 1.1]},
                  "vllm": {"image_norm": [1.0, 2.0, 2.6], "text_norm": [1.0, 1.0, None]},
                  "max_token_rel_diff": [1e-7, 2e-7, 4e-2]}
    summary = summary_of(levels=levels, tolerance=TOLERANCE, trajectory=trajectory)
    picture = port_diff_figure(image, tokens, summary, {"deepstack0": [1e-7, 2e-7, 3e-7, 1e-7, 0.0]})
    assert picture.width > 300 and picture.height > 600
    empty = port_diff_figure(image, tokens, summary_of(message="vLLM could not start"), {})
    assert empty.width > 100 and not math.isnan(empty.height)


def test_tolerance_and_ci_flags_are_listed():
    result = g4v("port-diff", "--help")
    assert result.returncode == 0
    for flag in ("--atol", "--rtol", "--fail-on-diff"):
        assert flag in result.stdout


@pytest.mark.parametrize("flag, value", [("--atol", "-1e-5"), ("--rtol", "abc"), ("--rtol", "nan")])
def test_bad_tolerance_flag_is_one_line(flag, value):
    result = g4v("port-diff", "--image", str(EXAMPLES_DIR / "shapes-wide.png"), "--prompt", "hi", f"{flag}={value}")
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2
    assert len(lines) == 1 and flag in lines[0] and value in lines[0]


def test_fail_on_diff_exit_status():
    from g4v.commands.port_diff import EXIT_DIFFERS, exit_status

    assert EXIT_DIFFERS not in (0, 1, 2)  # 1: bad input, 2: bad flags
    assert exit_status(summary_of(ok=True), fail_on_diff=True) == 0
    assert exit_status(summary_of(ok=False), fail_on_diff=True) == EXIT_DIFFERS
    assert exit_status(summary_of(ok=False), fail_on_diff=False) == 0  # without the flag the report is the answer


def test_report_names_the_tolerance_and_its_use():
    from g4v.commands.port_diff import report

    levels = [{"name": "deepstack0", "llm_layer": 3, "kind": "deepstack", "max_abs_diff": 3e-7, "max_rel_diff": 4e-7,
               "mean_abs_diff": 1e-7, "reference_max_abs": 1.0, "share_of_tolerance_used": 0.021, "ok": True,
               "problem": None}]
    text = report(summary_of(ok=True, message="all levels agree", levels=levels, tolerance=TOLERANCE))
    assert f"{TOLERANCE['rule']} (float32 defaults)" in text
    row = next(line for line in text.splitlines() if "deepstack0" in line)
    assert "0.021" in row and row.rstrip().endswith("ok")


# ── the level table: one formatter for the CLI and the tab (issue 31, item 7) ──────────────────

#: A summary as ``port-diff --json`` writes it, with full-precision floats and the server's path.
SERVER_MODEL = str(REPO_ROOT / "assets" / "granite4-vision-tiny-trained")
FULL_PRECISION = summary_of(
    model=SERVER_MODEL, ok=False, tolerance=TOLERANCE,
    message=f"levels that differ: spatial_TR; could not read {SERVER_MODEL}/config.json",
    levels=[{"name": "deepstack0", "llm_layer": 3, "kind": "deepstack", "max_abs_diff": 6.381234567890123e-06,
             "max_rel_diff": 4.123456789012345e-07, "mean_abs_diff": 1e-6, "reference_max_abs": 1.0,
             "share_of_tolerance_used": 0.021345678901234567, "ok": True, "problem": None},
            {"name": "spatial_TR", "llm_layer": 5, "kind": "spatial", "max_abs_diff": 1e-9, "max_rel_diff": 2e-9,
             "mean_abs_diff": 1e-9, "reference_max_abs": 1.0, "share_of_tolerance_used": math.inf, "ok": False,
             "problem": "differs by up to 1e-09"}],
    config_audit={"ok": True, "vllm_source": f"{SERVER_MODEL}/config.json", "message": "ok", "fields": []},
)


def test_tab_and_cli_show_the_same_three_digit_numbers():
    from g4v.commands.port_diff import report
    from g4v.port.table import level_rows
    from webapp.port import shown_summary

    rows = level_rows(shown_summary(FULL_PRECISION).levels)
    # Written out by hand: three significant digits, as a person reads them.
    assert rows[0] == ["deepstack0", "3", "6.38e-06", "4.12e-07", "0.0213", "ok"]
    assert rows[1][2:5] == ["1e-09", "2e-09", "inf"]
    text = report(FULL_PRECISION)
    for row in rows:
        line = next(line for line in text.splitlines() if line.strip().startswith(row[0]))
        assert line.split()[:5] == row[:5]  # the CLI prints the very same cells


def test_the_share_of_the_tolerance_is_named_as_a_share():
    from g4v.commands.port_diff import report
    from g4v.port.table import LEVEL_COLUMNS

    assert "share of tolerance used" in LEVEL_COLUMNS and "tolerance used" not in LEVEL_COLUMNS
    assert "share of tol. used" in report(FULL_PRECISION)
    assert set(FULL_PRECISION.to_dict()["levels"][0]) >= {"share_of_tolerance_used"}


def test_json_panel_shows_the_model_folder_not_the_server_path():
    import json

    from dataclasses import replace

    from webapp.port import shown_summary, verdict_text

    summary = shown_summary(FULL_PRECISION)
    shown = json.dumps(summary.to_dict()) + verdict_text(summary)
    assert summary.model == "granite4-vision-tiny-trained"
    assert str(REPO_ROOT) not in shown and "granite4-vision-tiny-trained/config.json" in shown
    assert FULL_PRECISION.model == SERVER_MODEL  # the caller's summary is left as it was
    hub = shown_summary(replace(FULL_PRECISION, model="ibm-granite/granite-vision-4.1-4b"))
    assert hub.model == "ibm-granite/granite-vision-4.1-4b"


@pytest.mark.skipif(vllm_installed(), reason="here the vLLM side cannot start, so only the summary's frame is built")
def test_the_json_names_the_pictures_sides_as_the_rest_of_the_app_orders_them(hf_engine):
    """Issue 31, item 8 (hardening 2): ``image_size`` was [height, width] where the app says width x
    height: the port summary (``--json`` and the tab's JSON panel) names its sides, and the report
    says the size width first. A picture wider than tall, so the order shows."""
    from g4v.commands.port_diff import report
    from g4v.port.run import run_port_diff
    from tests.conftest import make_image
    from webapp.port import shown_summary

    summary = run_port_diff(make_image(380, 120, seed=1), "hi", hf_engine=hf_engine, max_new_tokens=0).summary
    assert summary.vllm_error  # no vLLM here: the frame of the summary is still written
    assert summary.to_dict()["image_size"] == {"width": 380, "height": 120}
    assert shown_summary(summary).to_dict()["image_size"] == {"width": 380, "height": 120}
    assert "image: 380 x 120 px (width x height)" in report(summary).splitlines()
