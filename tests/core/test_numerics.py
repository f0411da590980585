"""The magnitude-scaled comparison accepts reduction-order noise and still rejects a real error."""

import pytest
import torch

from tests.numerics import assert_close_to_scale, scaled_atol


def test_scaled_atol_by_hand():
    assert scaled_atol(torch.tensor([0.5, -2.0, 1e-5]), 1e-4) == pytest.approx(2e-4)
    assert scaled_atol(torch.zeros(3), 1e-4) == torch.finfo(torch.float32).tiny


def test_small_element_off_in_its_last_bits_passes():
    # the failure seen on an Intel Xeon: an element of ~5e-5 off by 1e-6 (relative 0.02) in a tensor of scale ~0.05
    expected = torch.tensor([0.05, -0.03, 5.4e-5, 0.01])
    actual = expected.clone()
    actual[2] += 1.04e-6
    assert_close_to_scale(actual, expected, rel=1e-4)


@pytest.mark.parametrize("where", [0, 2])
def test_a_real_error_still_fails(where):
    expected = torch.tensor([0.05, -0.03, 5.4e-5, 0.01])
    actual = expected.clone()
    actual[where] += 1e-4 * 0.05 * 3  # three times the scaled tolerance
    with pytest.raises(AssertionError):
        assert_close_to_scale(actual, expected, rel=1e-4)
