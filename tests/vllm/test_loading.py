"""Configs read in the vLLM environment, whose transformers (< 5.21) builds the Q-Former differently."""

from g4v.loading import load_config
from g4v.paths import REAL_CONFIG_DIR


def test_the_real_configs_q_former_is_as_wide_as_the_vision_tower():
    """config.json leaves the Q-Former's widths out; vLLM (and transformers >= 5.21) take them from
    the vision tower, so the transformers engine here must too, or it cannot hold the real weights."""
    config = load_config(REAL_CONFIG_DIR)
    width = config.vision_config.hidden_size
    qformer = config.qformer_config
    assert (qformer.hidden_size, qformer.encoder_hidden_size, qformer.num_attention_heads) == (width, width, width // 64)
