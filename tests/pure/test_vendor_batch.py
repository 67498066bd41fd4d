"""Vendor batch execution rules: groups, custom ids, when to submit, how often to poll."""

from __future__ import annotations

from pathlib import Path

import pytest

from duet.config import load_config
from orchestration.core.agents import Agent
from orchestration.core.errors import ConfigError
from orchestration.core.vendor_batch import custom_id, group_of, poll_delay, submit_now
from workers.providers.batch import CUSTOM_ID


def test_groups_split_by_model_endpoint_and_key() -> None:
    base = Agent("a", model="gpt-4o").spec
    same = Agent("other instructions", model="gpt-4o", max_tokens=9).spec
    assert group_of(base) == group_of(same)  # one vendor batch may mix agents of a model
    for other in (
        Agent("a", model="gpt-4o-mini").spec,
        Agent("a", model="gpt-4o", api_key_env="TEAM_B_KEY").spec,
        Agent("a", model="gpt-4o", base_url="http://gw/v1").spec,
        Agent("a", model="anthropic:gpt-4o").spec,
    ):
        assert group_of(other) != group_of(base)
    assert "http" not in group_of(Agent("a", model="gpt-4o", base_url="http://gw/v1").spec)


@pytest.mark.parametrize(
    ("run_id", "key"),
    [
        ("3f2a9c", "r1.critique"),
        ("run:with spaces/and|bars", "r0.generate"),
        ("x" * 80, "r2.refine"),
    ],
)
def test_custom_ids_are_valid_and_stable(run_id: str, key: str) -> None:
    cid = custom_id(run_id, key)
    assert CUSTOM_ID.match(cid) and cid == custom_id(run_id, key)
    assert custom_id(run_id, "r9.refine") != cid


@pytest.mark.parametrize(
    ("pending", "waited", "expected"),
    [(0, 99.0, False), (1, 0.1, False), (1, 2.0, True), (999, 0.0, False), (1000, 0.0, True)],
)
def test_submit_now(pending: int, waited: float, expected: bool) -> None:
    assert submit_now(pending, waited, gather_s=2.0, max_requests=1000) is expected


def test_poll_backoff_doubles_to_a_cap() -> None:
    assert [poll_delay(n, first_s=1, max_s=10) for n in range(6)] == [1, 2, 4, 8, 10, 10]


def test_execution_setting(tmp_path: Path) -> None:
    assert (
        Agent("a", model="claude-haiku-4-5", execution="vendor_batch").spec.execution
        == "vendor_batch"
    )
    assert Agent("a", model="gpt-4o").spec.execution == "sync"
    with pytest.raises(ConfigError, match="vendor_batch runs through OpenAI's or Anthropic's"):
        Agent("a", model="sim", execution="vendor_batch")
    with pytest.raises(ConfigError, match="execution"):
        Agent("a", model="gpt-4o", execution="later")  # type: ignore[arg-type]
    path = tmp_path / "review.toml"
    path.write_text(
        '[actor]\ninstructions = "Fix."\nmodel = "gpt-4o"\nexecution = "vendor_batch"\n\n'
        '[critic]\ninstructions = "Judge."\nmodel = "claude-haiku-4-5"\n'
    )
    actor, critic = load_config(path).build_agents()
    assert (actor.spec.execution, critic.spec.execution) == ("vendor_batch", "sync")
