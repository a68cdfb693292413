"""g4v.model.hooks: the one place hooks are added and removed, checked on real torch modules."""

import pytest
import torch

from g4v.model.hooks import Hooks
from g4v.port.worker import _TrajectoryProbe


def _hook_count(module) -> int:
    return sum(len(m._forward_pre_hooks) + len(m._forward_hooks) for m in module.modules())


def test_a_with_block_removes_every_hook_even_when_it_fails():
    layer = torch.nn.Linear(3, 2)
    seen = []
    with pytest.raises(ValueError):
        with Hooks() as hooks:
            hooks.before(layer, lambda m, args: seen.append("before"))
            hooks.after(layer, lambda m, args, out: seen.append("after"))
            layer(torch.zeros(1, 3))
            assert _hook_count(layer) == 2
            raise ValueError("inside the block")
    assert seen == ["before", "after"]
    assert _hook_count(layer) == 0
    layer(torch.zeros(1, 3))
    assert seen == ["before", "after"]  # nothing fires after the block


def test_remove_twice_and_pre_hooks_with_kwargs():
    layer = torch.nn.Linear(3, 3)
    hooks = Hooks()
    hooks.before(layer, lambda m, args, kwargs: ((args[0] * 0,), kwargs), with_kwargs=True)
    assert torch.equal(layer(torch.ones(1, 3)), layer.bias.expand(1, 3))  # the hook replaced the input
    hooks.remove()
    hooks.remove()
    assert _hook_count(layer) == 0


class _VllmStyleLayer(torch.nn.Module):
    """Called as vLLM calls its decoder layers: ``layer(positions, hidden_states)`` -> (hidden, residual)."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, positions, hidden_states):
        return self.linear(hidden_states), None


def test_the_vllm_worker_probe_records_norms_and_leaves_no_hook():
    """The port's worker-side probe (it runs inside vLLM's workers) through the same Hooks: the
    norms of the stream entering each layer and leaving the last, against a plain computation."""
    torch.manual_seed(0)
    layers = torch.nn.ModuleList(_VllmStyleLayer() for _ in range(3))
    probe = _TrajectoryProbe(layers, expected_tokens=5)
    hidden = torch.randn(5, 4)
    expected = [hidden.norm(dim=-1)]
    with torch.no_grad():
        for layer in layers:
            hidden = layer(None, hidden)[0]
            expected.append(hidden.norm(dim=-1))
    probe.remove()
    assert _hook_count(layers) == 0
    recorded = probe.result()
    assert recorded["tokens"] == 5
    torch.testing.assert_close(recorded["norms"], torch.stack(expected))
