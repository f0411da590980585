"""The mask-and-replace D3PM mathematics (mdc_workbench.masked_conditional.d3pm) against explicit matrices and
brute-force enumeration."""

import itertools

import pytest
import torch
import torch.nn.functional as F

from mdc_workbench.masked_conditional import d3pm

T = 6


@pytest.fixture
def sched():
    return d3pm.mask_replace_schedule(T)


def test_schedule_endpoints_and_monotonicity():
    s = d3pm.mask_replace_schedule(100)
    assert s.steps == 100
    assert (s.alpha_bar[0], s.gamma_bar[0]) == (1.0, 0.0)
    assert s.alpha_bar[1] == pytest.approx(0.99999) and s.alpha_bar[100] == pytest.approx(0.000009)
    assert s.gamma_bar[1] == pytest.approx(0.000009) and s.gamma_bar[100] == pytest.approx(0.99999)
    assert bool((s.alpha_bar.diff() < 0).all()) and bool((s.gamma_bar.diff() > 0).all())
    with pytest.raises(ValueError):
        d3pm.mask_replace_schedule(0)


@pytest.mark.parametrize("K", [3, 4, 50])
def test_transition_rows_are_distributions(sched, K):
    for t in range(1, T + 1):
        for q in (d3pm.transition_matrix(sched, t, K), d3pm.cumulative_matrix(sched, t, K)):
            assert bool((q >= 0).all())
            torch.testing.assert_close(q.sum(1), torch.ones(K + 1, dtype=torch.float64))
            assert q[K, K] == 1.0  # [MASK] is absorbing


def test_one_step_matrix_has_the_paper_form(sched):
    K = 4
    a, b, g = d3pm.step_coefficients(sched, 2, 3, K)
    q = d3pm.transition_matrix(sched, 3, K)
    assert q[1, 1] == pytest.approx(float(a + b)) and q[1, 2] == pytest.approx(float(b))
    assert q[1, K] == pytest.approx(float(g)) and q[K, 1] == 0.0
    assert float(a + K * b + g) == pytest.approx(1.0)


@pytest.mark.parametrize("K", [3, 4])
def test_cumulative_product_matches_closed_form(sched, K):
    prod = torch.eye(K + 1, dtype=torch.float64)
    for t in range(1, T + 1):
        prod = prod @ d3pm.transition_matrix(sched, t, K)
        torch.testing.assert_close(prod, d3pm.cumulative_matrix(sched, t, K), rtol=1e-10, atol=1e-12)
    # multi-step transitions s -> t compose the same way
    a, b, g = d3pm.step_coefficients(sched, 2, 5, K)
    q25 = d3pm._matrix(a, b, g, K)
    direct = torch.linalg.multi_dot([d3pm.transition_matrix(sched, u, K) for u in (3, 4, 5)])
    torch.testing.assert_close(q25, direct, rtol=1e-10, atol=1e-12)


def _brute_force_posterior(sched, K, x0, xt, s, t):
    """q(x_s | x_t, x_0) by summing the probabilities of every path x_0 -> x_1 -> ... -> x_t."""
    Qs = [None] + [d3pm.transition_matrix(sched, u, K) for u in range(1, t + 1)]
    joint = torch.zeros(K + 1, dtype=torch.float64)
    for path in itertools.product(range(K + 1), repeat=t - 1):  # x_1 .. x_{t-1}
        states = (x0, *path, xt)
        p = torch.prod(torch.stack([Qs[u][states[u - 1], states[u]] for u in range(1, t + 1)]))
        joint[states[s]] += p
    return joint / joint.sum()


@pytest.mark.parametrize("K", [3, 4])
def test_posterior_matches_brute_force_enumeration(sched, K):
    t_max = 4
    for t in range(1, t_max + 1):
        for s in range(t):
            for x0, xt in itertools.product(range(K), range(K + 1)):
                want = _brute_force_posterior(sched, K, x0, xt, s, t)
                got = d3pm.q_posterior(torch.tensor(xt), F.one_hot(torch.tensor(x0), K).double(),
                                       torch.tensor(t), torch.tensor(s), sched)
                torch.testing.assert_close(got, want, rtol=1e-8, atol=1e-12)


def test_posterior_matches_the_paper_formula_and_mixes_linearly(sched):
    K, t = 4, 5
    Qt, Qbar_prev, Qbar_t = (d3pm.transition_matrix(sched, t, K), d3pm.cumulative_matrix(sched, t - 1, K),
                             d3pm.cumulative_matrix(sched, t, K))
    p0 = torch.tensor([0.1, 0.5, 0.3, 0.1], dtype=torch.float64)
    for xt in range(K + 1):
        mix = torch.zeros(K + 1, dtype=torch.float64)
        for x0 in range(K):
            # paper: q(x_{t-1} | x_t, x_0) = (x_t Q_t^T) * (x_0 Qbar_{t-1}) / (x_0 Qbar_t x_t^T)
            post = Qt[:, xt] * Qbar_prev[x0] / Qbar_t[x0, xt]
            torch.testing.assert_close(post.sum(), torch.tensor(1.0, dtype=torch.float64))
            mix += p0[x0] * post
        got = d3pm.q_posterior(torch.tensor(xt), p0, torch.tensor(t), torch.tensor(t - 1), sched)
        torch.testing.assert_close(got, mix, rtol=1e-8, atol=1e-12)


def test_posterior_is_batched_and_never_unmasks_back(sched):
    K = 4
    xt = torch.tensor([[0, 4], [2, 3]])
    p0 = torch.rand(2, 2, K, dtype=torch.float64).softmax(-1)
    t = torch.tensor([[3, 3], [6, 2]])
    got = d3pm.q_posterior(xt, p0, t, t - 1, sched)
    assert got.shape == (2, 2, K + 1)
    for i, j in itertools.product(range(2), range(2)):
        one = d3pm.q_posterior(xt[i, j], p0[i, j], t[i, j], t[i, j] - 1, sched)
        torch.testing.assert_close(got[i, j], one)
    assert float(got[0, 0, K]) == 0.0  # a content token at t came from a content token at t-1
    # the final step (s = 0) never leaves a [MASK]
    final = d3pm.q_posterior(xt, p0, torch.ones_like(t), torch.zeros_like(t), sched)
    assert bool((final[..., K] == 0).all())


def test_q_sample_frequencies_match_the_cumulative_row(sched):
    K, t, n = 4, 4, 200_000
    gen = torch.Generator().manual_seed(0)
    x0 = torch.full((n,), 2)
    xt = d3pm.q_sample(x0, torch.full((n,), t), sched, K, gen)
    freq = torch.bincount(xt, minlength=K + 1).double() / n
    torch.testing.assert_close(freq, d3pm.cumulative_matrix(sched, t, K)[2], atol=4e-3, rtol=0)


def test_vlb_terms_zero_for_a_perfect_model_and_cross_entropy_at_t1(sched):
    K = 5
    x0 = torch.tensor([0, 1, 2, 3, 4, 1])
    xt = torch.tensor([0, 5, 2, 1, 5, 5])
    t = torch.tensor([3, 3, 1, 6, 1, 2])
    perfect = F.one_hot(x0, K).float() * 60.0
    vb, ce = d3pm.vlb_terms(x0, xt, perfect, t, sched)
    assert float(vb.abs().max()) < 1e-4 and float(ce.max()) < 1e-4
    logits = torch.randn(6, K, generator=torch.Generator().manual_seed(1))
    vb, ce = d3pm.vlb_terms(x0, xt, logits, t, sched)
    assert bool((vb >= -1e-6).all())
    torch.testing.assert_close(vb[t == 1], F.cross_entropy(logits, x0, reduction="none")[t == 1])
    torch.testing.assert_close(ce, F.cross_entropy(logits, x0, reduction="none"))


def test_reverse_times():
    assert d3pm.reverse_times(100)[0] == (100, 99) and d3pm.reverse_times(100)[-1] == (1, 0)
    assert len(d3pm.reverse_times(100)) == 100
    assert d3pm.reverse_times(100, 30) == [(100, 70), (70, 40), (40, 10), (10, 0)]
    with pytest.raises(ValueError):
        d3pm.reverse_times(10, 0)


def test_ancestral_chain_with_an_oracle_recovers_x0(sched):
    """Running the reverse chain with p0 = the true x_0 from the all-[MASK] prior ends exactly at x_0."""
    K = 7
    gen = torch.Generator().manual_seed(0)
    x0 = torch.randint(0, K, (64, 5), generator=gen)
    x = torch.full_like(x0, K)
    for t, s in d3pm.reverse_times(T):
        probs = d3pm.q_posterior(x, F.one_hot(x0, K).float(), torch.tensor(t), torch.tensor(s), sched)
        x = d3pm.sample_states(probs, gen)
    assert torch.equal(x, x0)
