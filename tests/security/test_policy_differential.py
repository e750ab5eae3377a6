"""Random realistic trees and policies against the policy reference, through every
interface, judged by the effect on the host (`tests/policy_oracle.py`).

A fixed derandomized seed here; `scripts/policy_differential.py` runs as many policies as
you like (the README gives the command and the last result).
"""

from __future__ import annotations

import random
import sys
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sandbox_kernel_ext import SandboxManager

import policy_oracle

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")

_MANAGER: list[SandboxManager] = []


@pytest.fixture(scope="module", autouse=True)
def _manager():
    with SandboxManager() as manager:
        _MANAGER.append(manager)
        yield
        _MANAGER.clear()


@settings(max_examples=150, derandomize=True, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
@given(rng=st.randoms(use_true_random=False))
def test_every_interface_does_what_the_reference_says(rng: random.Random) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # a host without a layer says so once
        problems = policy_oracle.check(rng, _MANAGER[0])
    assert not problems, "\n".join(problems)
