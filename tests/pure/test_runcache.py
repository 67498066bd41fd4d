"""Whole-run cache entries, the pure part: what a run key covers, which runs may have an
entry, and what a served record bills."""

from __future__ import annotations

from typing import Any

from duet.commands.run_cache import served_record, served_usage
from orchestration.core.agents import Agent
from orchestration.core.architecture import ActorCritic, LoopSpec
from orchestration.core.results import RunResult, UsageReport
from orchestration.core.runcache import (
    RESULT_KEY_PREFIX,
    RUN_KEY_PREFIX,
    kept_result,
    loop_cacheable,
    result_key,
    run_cacheable,
    run_key,
    served_result,
)
from orchestration.core.usage import Usage

API = ("openai==1.0", "anthropic==1.0")


def _spec(**loop: Any) -> LoopSpec:
    actor = loop.pop("actor", Agent("Fix.", model="gpt-4o"))
    critic = loop.pop("critic", Agent("Review.", model="claude-opus-4-7"))
    loop.setdefault("cache", "7d")
    return ActorCritic(actor=actor, critic=critic, **loop).to_spec()


def test_the_key_covers_the_loop_the_sdks_and_the_prompt_not_the_ttl() -> None:
    base = run_key(_spec(), "p", API)
    assert base.startswith(RUN_KEY_PREFIX)
    assert run_key(_spec(), "p", API) == base
    assert run_key(_spec(cache="1d"), "p", API) == base  # a TTL changes no answer
    assert run_key(_spec(), "q", API) != base
    assert run_key(_spec(), "p", ("openai==2.0", API[1])) != base
    assert run_key(_spec(approval_threshold=0.5), "p", API) != base
    assert run_key(_spec(critique_template="{output}!"), "p", API) != base
    other_key = Agent("Fix.", model="gpt-4o", api_key_env="TENANT_B_KEY")
    assert run_key(_spec(actor=other_key), "p", API) != base


def test_which_runs_may_have_an_entry() -> None:
    assert loop_cacheable(_spec())
    assert not loop_cacheable(_spec(cache=None))
    refusing = Agent("Review.", model="claude-opus-4-7", cache=False)
    assert not loop_cacheable(_spec(critic=refusing))
    assert run_cacheable(_spec(), None) and run_cacheable(_spec(), "alice")
    # A user's shared conversation makes the run depend on its history.
    shared = _spec().model_copy(update={"memory": "per_user", "persistent_subagents": True})
    assert not run_cacheable(shared, "alice")
    assert run_cacheable(shared, None)  # no user: the run's own conversation
    assert run_cacheable(shared.model_copy(update={"persistent_subagents": False}), "alice")


def test_a_served_record_bills_nothing_and_counts_what_it_saved() -> None:
    usage = {
        "input_tokens": 10,
        "output_tokens": 5,
        "calls": 3,
        "usd": 0.5,
        "cached_calls": 1,
        "saved_usd": 0.25,
        "by_role": {"actor": {"input_tokens": 4, "output_tokens": 2, "calls": 2, "usd": 0.3}},
    }
    served = served_usage(usage)
    assert (served["calls"], served["usd"], served["input_tokens"]) == (0, 0.0, 0)
    assert (served["cached_calls"], served["saved_usd"]) == (4, 0.75)
    assert served["by_role"]["actor"]["cached_calls"] == 2
    stored = {"status": "approved", "output": "o", "usage": usage, "run_id": "r1"}
    record = served_record(stored, 7, {"id": "x", "prompt": "p", "metadata": {"k": 1}})
    assert record["index"] == 7 and record["id"] == "x" and record["metadata"] == {"k": 1}
    assert record["cached"] is True and record["run_id"] == "r1" and record["output"] == "o"


def _python(code: str) -> str:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_checking_a_sim_model_imports_no_celery() -> None:
    """An all-hit rerun of a ``sim`` config checks its model names: no Celery for that."""
    code = (
        "import sys; from workers.providers.sim import parse_sim_model; "
        "parse_sim_model('sim?scores=0.9'); print('celery' in sys.modules)"
    )
    assert _python(code) == "False"


def test_celery_finds_the_app_whatever_was_imported_first() -> None:
    """``celery -A workers`` finds the app with ``workers`` loading it lazily, also where
    ``workers.app`` (the submodule) was imported first."""
    find = "from celery.app.utils import find_app; print(type(find_app('workers')).__name__)"
    assert _python(f"import workers; {find}") == "Celery"
    assert _python(f"import workers.app; {find}") == "Celery"


def _result(**fields: Any) -> RunResult:
    usage = Usage(input_tokens=10, output_tokens=5, calls=2, usd=0.5)
    return RunResult(
        run_id="r1",
        status=fields.pop("status", "approved"),
        output="fixed",
        final_score=0.95,
        usage=UsageReport(total=usage, by_role={"actor": usage}),
        input_id="a",
        batch_id="b",
        user_id="u",
        metadata={"k": 1},
        created_at=1.0,
        **fields,
    )


def test_a_kept_result_holds_no_identity_and_is_served_billing_nothing() -> None:
    kept = RunResult.model_validate_json(kept_result(_result()))
    assert (kept.run_id, kept.input_id, kept.batch_id, kept.user_id) == ("", None, None, None)
    assert (kept.metadata, kept.created_at, kept.output) == ({}, None, "fixed")
    text = served_result(kept_result(_result()))
    assert text is not None
    served = RunResult.model_validate_json(text)
    assert served.cached and served.final_score == 0.95
    total = served.usage.total
    assert (total.calls, total.usd, total.input_tokens) == (0, 0.0, 0)
    assert (total.cached_calls, total.saved_usd) == (2, 0.5)
    assert served.usage.by_role["actor"].cached_calls == 2


def test_only_a_whole_result_that_finished_well_is_served() -> None:
    assert served_result(None) is None
    assert served_result("not json") is None
    assert served_result('{"run_id": "x"}') is None  # no status
    for status in ("interrupted", "failed", "cancelled"):
        assert served_result(kept_result(_result(status=status))) is None
    assert served_result(kept_result(_result(status="max_rounds_reached"))) is not None


def test_a_result_key_is_the_run_key_of_the_current_sdks_under_its_own_prefix() -> None:
    key = result_key(_spec(), "p")
    assert key.startswith(RESULT_KEY_PREFIX) and not key.startswith(RUN_KEY_PREFIX)
    assert result_key(_spec(cache="1d"), "p") == key
    assert result_key(_spec(), "q") != key
