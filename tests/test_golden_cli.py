"""Behaviour unchanged by moving code: the CLI's outputs on fixed inputs equal the ones recorded
before the restructuring (``tests/golden``). Floats may differ in the last bits: thread scheduling
in BLAS, and the CPU's generation, which picks the kernels (on an Emerald Rapids machine the logit
lens's probabilities differ from the recorded ones by up to 1.4e-5 relative, 2026-12-06). So numbers
compare to a relative 1e-4, far below what a change of behaviour moves; text, tokens and structure
compare exactly."""

import json
import math

import pytest

from tests.golden.cases import CASES, golden_path, run_case


def assert_same(got, want, where="$"):
    if isinstance(want, float) or isinstance(got, float):
        assert isinstance(got, (int, float)) and math.isclose(got, want, rel_tol=1e-4, abs_tol=1e-7), \
            f"{where}: {got!r} != {want!r}"
    elif isinstance(want, dict):
        assert isinstance(got, dict) and sorted(got) == sorted(want), f"{where}: keys {sorted(got)} != {sorted(want)}"
        for key in want:
            assert_same(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), f"{where}: length {len(got)} != {len(want)}"
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"{where}[{i}]")
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_cli_output_is_unchanged(case, tmp_path):
    assert_same(run_case(case, tmp_path), json.loads(golden_path(case).read_text()))
