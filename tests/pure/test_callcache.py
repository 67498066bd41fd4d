"""The model-call cache's key, TTL syntax and disk store (docs/cache.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestration import Agent
from orchestration.core.callcache import (
    CacheSpec,
    cache_spec,
    call_key,
    entry_from,
    entry_json,
    parse_ttl,
)
from orchestration.core.completion import Completion
from orchestration.core.errors import ConfigError
from orchestration.services.callcaching import identity
from orchestration.state.callcache import DiskCallStore, default_path

MESSAGES = [{"role": "user", "content": "review this"}]


def _key(messages=MESSAGES, structured: bool = False, **agent: object) -> str:  # type: ignore[no-untyped-def]
    settings = {"model": "openai:gpt-4.1", "base_url": "http://llm.local/v1", **agent}
    spec = Agent("Be strict.", **settings).spec  # type: ignore[arg-type]
    return call_key(identity(spec, structured), messages)


def test_the_key_changes_with_everything_that_determines_the_answer() -> None:
    base = _key()
    assert _key() == base, "the same call, the same key"
    assert _key(base_url="HTTP://LLM.local/v1/") == base, "case of host and scheme, last /"
    changed = [
        _key(model="openai:gpt-4.1-mini"),
        _key(base_url="http://other.local/v1"),
        # the whole base_url (issue 33, row 9): two servers behind one host
        _key(base_url="http://llm.local/other/v1"),
        _key(base_url="http://llm.local:8080/v1"),
        _key(base_url="https://llm.local/v1"),
        _key(api_key_env="TENANT_B_KEY"),
        _key(temperature=0.5),
        _key(max_tokens=99),
        _key(structured=True),
        _key(messages=[{"role": "user", "content": "review that"}]),
        call_key(
            identity(
                Agent("Be kind.", model="openai:gpt-4.1", base_url="http://llm.local/v1").spec,
                False,
            ),
            MESSAGES,
        ),
    ]
    assert base not in changed and len(set(changed)) == len(changed)


@pytest.mark.parametrize(("text", "seconds"), [("90", 90), ("30m", 1800), ("7d", 604800), (12, 12)])
def test_ttls_read(text: str, seconds: float) -> None:
    assert parse_ttl(text) == seconds


@pytest.mark.parametrize("text", ["", "7x", "-1d", "0", True])
def test_bad_ttls_are_refused_naming_where(text: object) -> None:
    with pytest.raises(ConfigError, match="--cache"):
        parse_ttl(text, "--cache")  # type: ignore[arg-type]


def test_cache_spec_from_the_team_argument() -> None:
    assert cache_spec(None) is None and cache_spec(False) is None
    assert cache_spec(True) == CacheSpec()
    assert cache_spec("1h") == CacheSpec(ttl_s=3600)


def test_refusals_and_cut_replies_are_not_entries() -> None:
    whole = Completion("ok", 3, 4, "end")
    assert entry_from(entry_json(whole)) == whole
    assert entry_from(entry_json(Completion("no", 1, 1, "refusal"))) is None
    assert entry_from(entry_json(Completion("cut", 1, 1, "max_tokens"))) is None
    assert entry_from("not json") is None


def test_the_disk_store_serves_within_the_ttl_and_evicts_least_recently_used(
    tmp_path: Path,
) -> None:
    store = DiskCallStore(tmp_path / "c" / "calls.sqlite")
    for k in ("a", "b", "c"):
        store.put(k, f"v{k}", max_entries=3, max_bytes=1 << 20)
    assert store.get("a", 60) == "va"  # a is now the most recently used
    store.put("d", "vd", max_entries=3, max_bytes=1 << 20)
    assert store.get("b", 60) is None, "the least recently used went"
    assert store.get("a", 60) == "va"
    assert store.get("a", 0.0) is None, "older than the TTL: not served"
    stats = store.stats()
    assert (stats.entries, stats.hits, stats.misses) == (3, 2, 2)
    assert store.clear(older_than_s=3600) == 0
    assert store.clear() == 3 and store.stats().entries == 0


def test_the_disk_file_follows_the_overrides(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("DUET_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_path() == tmp_path / "xdg" / "duet" / "calls.sqlite"
    monkeypatch.setenv("DUET_CACHE_DIR", str(tmp_path / "own"))
    assert default_path() == tmp_path / "own" / "calls.sqlite"
