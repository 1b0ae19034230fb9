"""pass@k without bias from n samples a prompt."""

from __future__ import annotations

import pytest

from turnkeep.primitives.pass_at_k import estimable_ks, pass_at_k


def test_pass_at_k_is_the_unbiased_estimate() -> None:
    assert pass_at_k([0, 4, 2], samples=4, k=1) == pytest.approx((0 + 1 + 0.5) / 3)
    assert pass_at_k([2], samples=4, k=2) == pytest.approx(1 - 1 / 6)  # 1 - C(2,2)/C(4,2)
    assert pass_at_k([1], samples=4, k=4) == 1.0 and pass_at_k([0, 0], samples=8, k=8) == 0.0
    ks = [pass_at_k([1, 3, 0], samples=8, k=k) for k in estimable_ks(8)]
    assert ks == sorted(ks)  # more tries never lower it


def test_the_ks_reported_and_the_refusals() -> None:
    assert estimable_ks(1) == [1] and estimable_ks(4) == [1, 2, 4] and estimable_ks(10) == [1, 2, 4, 8, 10]
    with pytest.raises(ValueError, match="needs 1 <= k <= samples"):
        pass_at_k([1], samples=2, k=3)
    with pytest.raises(ValueError, match="of no prompts"):
        pass_at_k([], samples=2, k=1)
