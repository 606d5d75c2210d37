"""Whole train steps (backward + optimizer.step) captured on a real GPU."""

import copy

import pytest
import torch
from torch import nn

from graphmodule import CudaGraphModule

pytestmark = pytest.mark.cuda


def _make(cuda, seed=0):
    torch.manual_seed(seed)
    critic = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1)).to(cuda)
    actor = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2), nn.Tanh()).to(cuda)
    return critic, actor


def _step_fn(critic, actor, q_opt, a_opt):
    def step(obs, target):
        q_opt.zero_grad()
        q_loss = (critic(obs) - target).pow(2).mean()
        q_loss.backward()
        q_opt.step()
        a_opt.zero_grad()
        a_loss = -critic(obs).mean() + actor(obs).pow(2).mean()
        a_loss.backward()
        a_opt.step()
        return q_loss.detach(), a_loss.detach()

    return step


def test_graphed_train_step_matches_eager_training(cuda):
    critic, actor = _make(cuda)
    critic_ref, actor_ref = copy.deepcopy(critic), copy.deepcopy(actor)
    opts = [torch.optim.Adam(m.parameters(), lr=1e-3, capturable=True) for m in (critic, actor)]
    opts_ref = [torch.optim.Adam(m.parameters(), lr=1e-3, capturable=True) for m in (critic_ref, actor_ref)]
    g = CudaGraphModule(_step_fn(critic, actor, *opts), warmup=3)
    eager = _step_fn(critic_ref, actor_ref, *opts_ref)
    gen = torch.Generator(device=cuda).manual_seed(1)
    for _ in range(20):
        obs = torch.randn(256, 8, device=cuda, generator=gen)
        target = torch.randn(256, 1, device=cuda, generator=gen)
        q, a = g(obs, target)
        q_ref, a_ref = eager(obs, target)
        torch.testing.assert_close(q, q_ref, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(a, a_ref, rtol=1e-4, atol=1e-5)
    assert g.stats.replays == 17
    for p, p_ref in zip(list(critic.parameters()) + list(actor.parameters()),
                        list(critic_ref.parameters()) + list(actor_ref.parameters())):
        torch.testing.assert_close(p, p_ref, rtol=1e-4, atol=1e-5)


def test_parameters_loaded_in_place_are_seen_by_replays(cuda):
    net = nn.Linear(4, 4).to(cuda)
    g = CudaGraphModule(net, warmup=1)
    x = torch.randn(2, 4, device=cuda)
    with torch.no_grad():
        g(x)
        g(x)
        other = nn.Linear(4, 4).to(cuda)
        g.load_state_dict(other.state_dict())
        torch.testing.assert_close(g(x), other(x))
