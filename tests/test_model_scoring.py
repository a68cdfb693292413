"""g4v.model.scoring's one KL divergence, against scipy's (an independent implementation)."""

import math

import pytest
import torch
from scipy.special import rel_entr

from g4v.model.scoring import kl_divergence


def test_kl_matches_scipy_row_by_row():
    torch.manual_seed(1)
    logits_p, logits_q = torch.randn(4, 50, dtype=torch.float64), torch.randn(4, 50, dtype=torch.float64) * 3
    log_p, log_q = torch.log_softmax(logits_p, -1), torch.log_softmax(logits_q, -1)
    got = kl_divergence(log_p, log_q)
    expected = [float(rel_entr(p, q).sum()) for p, q in zip(log_p.exp().numpy(), log_q.exp().numpy())]
    assert got.shape == (4,)
    assert got.tolist() == pytest.approx(expected, rel=1e-12)
    assert float(kl_divergence(log_p[0], log_p[0])) == 0.0


def test_tokens_p_never_gives_add_nothing_and_q_missing_a_token_p_gives_is_infinite():
    """The port compares against vLLM's top logprobs only: tokens outside them have q = 0."""
    p = torch.tensor([0.5, 0.5, 0.0])
    q = torch.tensor([0.25, 0.75, 0.0])
    expected = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    assert float(kl_divergence(p.log(), q.log())) == pytest.approx(expected, rel=1e-6)
    assert float(kl_divergence(q.log(), torch.tensor([0.5, 0.5, 0.0]).log())) == pytest.approx(
        float(rel_entr(q.numpy(), p.numpy()).sum()), rel=1e-6)
    assert math.isinf(float(kl_divergence(p.log(), torch.tensor([1.0, 0.0, 0.0]).log())))
