"""``[inputs] max_prompt_chars`` against the process cap ``DUET_MAX_PROMPT_CHARS``: a
config asking for more than the cap is refused at load, naming both (it was silently
capped, so inputs the config allowed were rejected)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from duet.commands.intake import check_loaded, prompt_limit
from duet.config import parse_config
from orchestration.core.errors import ConfigError
from orchestration.settings import get_settings


def _config(max_prompt_chars: int | None) -> dict:
    data: dict = {
        "actor": {"instructions": "Fix.", "model": "sim"},
        "critic": {"instructions": "Review.", "model": "sim"},
    }
    if max_prompt_chars is not None:
        data["inputs"] = {"max_prompt_chars": max_prompt_chars}
    return data


@pytest.fixture
def cap(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """Set DUET_MAX_PROMPT_CHARS for this test (settings are read once per process)."""
    monkeypatch.delenv("DUET_MAX_PROMPT_CHARS", raising=False)
    get_settings.cache_clear()
    yield monkeypatch
    get_settings.cache_clear()


def test_a_limit_above_the_cap_is_an_error_naming_both(cap: pytest.MonkeyPatch) -> None:
    cfg = parse_config(_config(300_000), source="review.toml")
    with pytest.raises(ConfigError) as err:
        check_loaded(cfg, embedded=False)
    assert str(err.value) == (
        "review.toml: inputs.max_prompt_chars: 300,000 is above this process's cap of "
        "200,000 characters (DUET_MAX_PROMPT_CHARS); raise the cap "
        "(export DUET_MAX_PROMPT_CHARS=300000) or lower the key"
    )


def test_a_raised_cap_lets_the_config_limit_through(cap: pytest.MonkeyPatch) -> None:
    cap.setenv("DUET_MAX_PROMPT_CHARS", "300000")
    get_settings.cache_clear()
    cfg = check_loaded(parse_config(_config(300_000)), embedded=False)
    assert prompt_limit(cfg) == 300_000


@pytest.mark.parametrize(
    ("wanted", "limit"), [(None, 200_000), (50_000, 50_000), (200_000, 200_000)]
)
def test_the_limit_is_the_configs_within_the_cap(
    cap: pytest.MonkeyPatch, wanted: int | None, limit: int
) -> None:
    assert prompt_limit(check_loaded(parse_config(_config(wanted)), embedded=False)) == limit
