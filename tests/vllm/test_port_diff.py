"""The vLLM port inspector (``g4v.port``, ``python -m g4v port-diff``) against the real thing.

vLLM's ``granite4_vision`` and transformers run side by side in this environment. On the bundled
checkpoint every level and the residual trajectory must agree; the comparison must flag a level
that is swapped, dropped or scaled (the reference side is perturbed here, since the real port is
correct, or a fault is planted in vLLM's worker); a Q-Former config vLLM does not honour must be
reported field by field.

vLLM starts three times in this file (about 50 s each on two cores): once in process for the
module, and once per CLI subprocess (the bundled checkpoint, which agrees, and a checkpoint whose
Q-Former config vLLM ignores, which differs): ``--fail-on-diff``'s exit status for each.
"""

import json
import os
import re
import subprocess
import sys

import pytest
import torch
from g4v_cases import picture
from port_faults import plant_scaled_level, remove_planted_fault

from g4v.paths import BUNDLED_MODEL_DIR, EXAMPLES_DIR, REPO_ROOT

pytestmark = pytest.mark.vllm

PROMPT = "What colour is the shape?"


@pytest.fixture(scope="module")
def probe():
    from g4v.port.probe import VLLMProbe

    previous = os.environ.get("VLLM_ALLOW_INSECURE_SERIALIZATION")
    with VLLMProbe(str(BUNDLED_MODEL_DIR)) as started:
        yield started
    assert os.environ.get("VLLM_ALLOW_INSECURE_SERIALIZATION") == previous, "the probe must restore the variable"


@pytest.fixture(scope="module")
def image():
    return picture(380, 120, seed=1)  # a 1x3 anyres grid: base, tile and newline tokens


@pytest.fixture(scope="module")
def result(hf_engine, probe, image):
    from g4v.port.run import run_port_diff

    return run_port_diff(image, PROMPT, hf_engine=hf_engine, probe=probe, max_new_tokens=8, draw=True)


@pytest.fixture(scope="module")
def sides(hf_engine, probe, image):
    """Both sides' raw material, for comparisons with a perturbed reference."""
    from g4v.port.compare import split_levels
    from g4v.port.run import reference_run

    ref = reference_run(hf_engine, image, PROMPT, max_new_tokens=0)
    embedded = probe.embed_levels(ref["inputs"]["pixel_values"], ref["inputs"]["image_sizes"])
    vllm = split_levels(embedded["packed"][0], embedded["llm_layers"], embedded["hidden"])
    return ref, vllm


def test_every_level_agrees_within_1e_5(result):
    from g4v.port.compare import default_tolerance

    assert result.summary.tolerance == default_tolerance(torch.float32)
    levels = result.summary.to_dict()["levels"]
    assert [row["name"] for row in levels] == ["deepstack0", "deepstack1", "deepstack2", "deepstack3",
                                               "spatial_TL", "spatial_TR", "spatial_BL", "spatial_BR"]
    for row in levels:
        assert row["ok"], row
        assert row["max_abs_diff"] <= 1e-5, row
        assert row["max_rel_diff"] <= 1e-4, row
        assert 0 <= row["share_of_tolerance_used"] < 0.5, row  # well inside the tolerance, not at its edge
        assert row["reference_max_abs"] > 1e-3, "the features compared must not be trivially zero"
    num_image_tokens = result.summary.num_image_tokens
    assert all(len(level.token_diff) == num_image_tokens for level in result.levels)
    assert len(result.tokens) == num_image_tokens  # the tiling map covers every compared token


def test_trajectory_next_token_and_continuation_agree(result, hf_engine):
    trajectory = result.summary.to_dict()["trajectory"]
    layers = hf_engine.model.config.text_config.num_hidden_layers
    assert trajectory["layers"] == list(range(layers + 1))
    assert trajectory["ok"], trajectory["problem"]
    assert trajectory["max_rel_diff"] < 1e-4
    # the image tokens' norm really changes across the injections, so agreement is not trivial
    image = trajectory["transformers"]["image_norm"]
    assert max(image) > 1.5 * min(image)
    nt = result.summary.to_dict()["next_token"]
    assert nt["prompt_token_ids_equal"]
    assert nt["kl_over"] == "full vocabulary"
    assert nt["kl_divergence"] < 1e-5
    assert nt["top5_overlap"] == 5 and nt["argmax_agrees"]
    assert nt["first_divergence"] is None
    assert len(nt["continuation_ids_vllm"]) > 0
    assert result.summary.config_audit.ok, result.summary.config_audit.message
    assert result.summary.ok
    assert result.figure is not None and result.figure.width > 300


def test_config_audit_reads_vllm_modules(result, hf_engine):
    audit = result.summary.to_dict()["config_audit"]
    rows = {row["field"]: row for row in audit["fields"]}
    assert "worker" in audit["vllm_source"]
    config = hf_engine.model.config
    assert rows["qformer_config.num_attention_heads"]["vllm"] == config.vision_config.hidden_size // 64
    assert rows["qformer_config.intermediate_size"]["vllm"] == 3072
    assert rows["deepstack_layer_map"]["vllm"] == [list(p) for p in config.deepstack_layer_map]
    assert rows["injection layers (derived)"]["vllm"] == [row.llm_layer for row in result.summary.levels]
    assert all(row["ok"] for row in audit["fields"])


def test_capture_points_resolve_in_vllms_worker(probe, hf_engine):
    """Every capture point g4v hooks by name is, in vLLM's worker, the module vLLM loads transformers'
    module of that name into (its own ``hf_to_vllm_mapper``), and as many as transformers has."""
    from worker_sites import resolved_sites

    from g4v.model.sites import site_names

    found = probe.apply(resolved_sites)
    assert list(found) == site_names(hf_engine.model)
    assert all(same for _, same, _ in found.values()), found
    kinds = {re.sub(r"\d+", "{i}", name): kind for name, (_, _, kind) in found.items()}
    assert kinds == {"language_model": "Granite4VisionLLMModel", "layers.{i}": "GraniteDecoderLayer",
                     "layers.{i}.self_attn": "GraniteAttention", "layerwise_projectors.{i}": "WindowQFormerDownsampler",
                     "spatial_projectors.{i}": "WindowQFormerDownsampler"}


def test_swapped_level_is_flagged(sides):
    from g4v.port.compare import compare_levels, default_tolerance

    ref, vllm = sides
    features = dict(ref["features"])
    features["deepstack0"], features["deepstack1"] = features["deepstack1"], features["deepstack0"]
    rows = {row.name: row for row in compare_levels(ref["levels"], features, vllm, default_tolerance(torch.float32))}
    assert not rows["deepstack0"].ok and not rows["deepstack1"].ok
    assert "deepstack1" in rows["deepstack0"].problem and "swapped" in rows["deepstack0"].problem
    assert all(rows[name].ok for name in rows if name not in ("deepstack0", "deepstack1"))


def test_dropped_level_is_flagged(sides):
    from g4v.port.compare import compare_levels, default_tolerance

    ref, vllm = sides
    tolerance = default_tolerance(torch.float32)
    missing = {name: t for name, t in ref["features"].items() if name != "spatial_TR"}
    rows = {row.name: row for row in compare_levels(ref["levels"], missing, vllm, tolerance)}
    assert not rows["spatial_TR"].ok and rows["spatial_TR"].max_abs_diff is None
    assert "nothing" in rows["spatial_TR"].problem
    zeroed = {**ref["features"], "deepstack3": torch.zeros_like(ref["features"]["deepstack3"])}
    rows = {row.name: row for row in compare_levels(ref["levels"], zeroed, vllm, tolerance)}
    assert not rows["deepstack3"].ok and "dropped" in rows["deepstack3"].problem
    assert sum(not row.ok for row in rows.values()) == 1


def test_scaled_level_is_flagged(sides):
    from g4v.port.compare import compare_levels, default_tolerance

    ref, vllm = sides
    scaled = {**ref["features"], "spatial_BL": ref["features"]["spatial_BL"] * 1.001}
    rows = {row.name: row for row in compare_levels(ref["levels"], scaled, vllm, default_tolerance(torch.float32))}
    bad = rows["spatial_BL"]
    assert not bad.ok and bad.share_of_tolerance_used > 1
    assert 5e-4 < bad.max_rel_diff < 2e-3  # the per-token relative difference sees the 0.1 %
    assert "scaled" in bad.problem
    assert sum(not row.ok for row in rows.values()) == 1


def test_zero_tolerance_sees_the_rounding(sides):
    """``--atol 0 --rtol 0`` asks for bit-identical features; vLLM's kernels round differently from
    transformers', so every level then differs (by rounding only: far inside the default)."""
    from g4v.port.compare import compare_levels, default_tolerance

    ref, vllm = sides
    exact = compare_levels(ref["levels"], ref["features"], vllm, default_tolerance(torch.float32, atol=0, rtol=0))
    assert not any(row.ok for row in exact)
    assert all(0 < row.max_abs_diff < 1e-5 for row in exact)
    assert all("swapped" not in row.problem and "scaled" not in row.problem for row in exact)


def test_fault_planted_in_vllm_is_caught_end_to_end(hf_engine, probe):
    """One level scaled by 1.001 inside vLLM itself: the whole inspector says DIFFERS, names the
    level and the factor, and lets the others pass. A picture no other test sends, so vLLM's
    encoder cache cannot answer with features computed before the fault."""
    from g4v.commands.port_diff import EXIT_DIFFERS, exit_status
    from g4v.port.run import run_port_diff

    index = 5  # spatial_TR
    probe.apply(plant_scaled_level, index=index, factor=1.001)
    try:
        typed = run_port_diff(picture(200, 140, seed=11), PROMPT, hf_engine=hf_engine, probe=probe,
                              max_new_tokens=2).summary
    finally:
        probe.apply(remove_planted_fault)
    summary = typed.to_dict()
    levels = {row["name"]: row for row in summary["levels"]}
    faulty = summary["levels"][index]["name"]
    assert faulty == "spatial_TR"
    assert [name for name, row in levels.items() if not row["ok"]] == [faulty]
    assert "scaled" in levels[faulty]["problem"] and "1.001" in levels[faulty]["problem"]
    assert not summary["ok"] and faulty in summary["message"]
    assert exit_status(typed, fail_on_diff=True) == EXIT_DIFFERS


def test_trajectory_departure_is_located(sides):
    from g4v.port.compare import compare_trajectories

    ref, _ = sides
    norms = ref["norms"].clone()
    vllm_like = norms.clone()
    vllm_like[6:, ref["capture"].image_mask] *= 1.01  # vLLM "departs" at layer 6, image tokens only
    out = compare_trajectories(norms, vllm_like, ref["capture"].image_mask, {}, rtol=1e-4)
    assert not out.ok and out.first_departure == 6
    assert out.rel_diff_text[6] < 1e-9 < out.rel_diff_image[6]
    assert compare_trajectories(norms, norms[:-1], ref["capture"].image_mask, {}, rtol=1e-4).ok is False


def _checkpoint_with_qformer(tmp_path, **qformer) -> str:
    """A copy of the bundled checkpoint (files linked) whose config.json changes ``qformer_config``."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    for item in BUNDLED_MODEL_DIR.iterdir():
        if item.name != "config.json":
            (folder / item.name).symlink_to(item)
    config = json.loads((BUNDLED_MODEL_DIR / "config.json").read_text())
    config["qformer_config"].update(qformer)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return str(folder)


def test_qformer_vllm_cannot_build_is_reported_field_by_field(tmp_path):
    """Sizes vLLM's fixed Q-Former cannot hold (it would not even load these weights): the audit
    still comes back, from vLLM's own projector class built without an engine."""
    from g4v.port.audit import audit_checkpoint

    folder = _checkpoint_with_qformer(tmp_path, intermediate_size=128, num_hidden_layers=2)
    audit = audit_checkpoint(folder)
    rows = {row.field: row for row in audit.fields}
    assert not audit.ok
    assert rows["qformer_config.intermediate_size"].ok is False
    assert (rows["qformer_config.intermediate_size"].checkpoint, rows["qformer_config.intermediate_size"].vllm) == (128, 3072)
    assert (rows["qformer_config.num_hidden_layers"].checkpoint, rows["qformer_config.num_hidden_layers"].vllm) == (2, 1)
    assert rows["qformer_config.num_attention_heads"].ok is True
    assert "qformer_config.intermediate_size" in audit.message and "qformer_config.num_hidden_layers" in audit.message
    assert sorted(audit.to_dict()["mismatches"]) == ["qformer_config.intermediate_size", "qformer_config.num_hidden_layers"]


def test_checkpoint_that_does_not_load_still_gets_its_audit(tmp_path, image):
    """Weights made for vLLM's fixed Q-Former under a config that says otherwise: transformers
    refuses to load them, and the inspector answers with the audit instead of a traceback."""
    from g4v.port.run import run_port_diff

    folder = _checkpoint_with_qformer(tmp_path, intermediate_size=128)
    result = run_port_diff(image, PROMPT, model=folder, max_new_tokens=2, draw=True)
    summary = result.summary.to_dict()
    assert summary["load_error"] and not summary["ok"] and summary["levels"] == []
    assert summary["config_audit"]["mismatches"] == ["qformer_config.intermediate_size"]
    assert "qformer_config.intermediate_size: checkpoint 128, vLLM built 3072" in summary["message"]
    assert result.figure is not None


def _port_diff_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-m", "g4v", "port-diff", *args], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=400)


def test_cli_fail_on_diff_exits_0_when_the_port_agrees():
    """The default (trained) checkpoint on an example picture: its features are larger than the
    random checkpoint's and so is their float32 rounding (the old absolute rule said DIFFERS here)."""
    done = _port_diff_cli("--image", str(EXAMPLES_DIR / "shapes-wide.png"), "--prompt", PROMPT,
                          "--max-new-tokens", "2", "--fail-on-diff")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "verdict: OK" in done.stdout
    # Issue 31, item 11: vLLM's start and stop wrote about 70 log lines before the report; now
    # nothing but transformers' own loading bar (its redraws read as lines here: text mode turns
    # carriage returns into newlines).
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert [line for line in lines if not line.startswith("Loading weights:")] == [], lines
    assert "per-level tolerance: |vLLM - transformers| <= 1e-05 + 0.0001 * max(|transformers|, token RMS) " \
           "(float32 defaults)" in done.stdout


def test_cli_json_on_a_checkpoint_vllm_misreads(tmp_path):
    """Two Q-Former heads in config.json: the weights load everywhere, transformers (5.19) builds
    two heads, vLLM silently builds one. The CLI reports the field and the levels it breaks, and
    ``--fail-on-diff`` turns the verdict into exit status 3."""
    folder = _checkpoint_with_qformer(tmp_path, num_attention_heads=2)
    image_path = tmp_path / "picture.png"
    picture(150, 260, seed=3).save(image_path)
    png = tmp_path / "port.png"
    done = _port_diff_cli("--model", folder, "--image", str(image_path), "--prompt", PROMPT, "--max-new-tokens", "4",
                          "--json", "--png", str(png), "--fail-on-diff")
    assert done.returncode == 3, done.stderr[-2000:]
    data = json.loads(done.stdout)  # stdout holds the JSON and nothing else (vLLM logs to stderr)
    assert set(data) >= {"levels", "trajectory", "next_token", "config_audit", "ok", "message"}
    assert len(data["levels"]) == 8
    for row in data["levels"]:
        assert set(row) >= {"name", "llm_layer", "max_abs_diff", "max_rel_diff", "share_of_tolerance_used"}
        assert isinstance(row["llm_layer"], int) and isinstance(row["max_abs_diff"], float)
    assert set(data["trajectory"]) >= {"layers", "transformers", "vllm", "first_departure", "ok"}
    assert set(data["next_token"]) >= {"kl_divergence", "top5_overlap", "first_divergence"}
    audit = data["config_audit"]
    assert audit["mismatches"] == ["qformer_config.num_attention_heads"]
    heads = next(row for row in audit["fields"] if row["field"] == "qformer_config.num_attention_heads")
    assert (heads["checkpoint"], heads["transformers"], heads["vllm"]) == (2, 2, 1)
    assert "qformer_config.num_attention_heads" in audit["message"] and "vLLM built 1" in audit["message"]
    assert not data["ok"]
    assert not all(row["ok"] for row in data["levels"]), "one head instead of two must change the features"
    assert png.stat().st_size > 10_000
