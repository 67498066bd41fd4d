"""Credentials in a ``base_url`` name worker environment variables; values are never stored.

``https://USER:${VARIABLE}@host``: the spec keeps the reference, the worker reads the
value when it builds the client and treats the variable as a key variable (a secret). A
password written out is refused with the fix; a missing variable is a run error naming it.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from orchestration.core import url_credentials
from orchestration.core.agents import Agent
from orchestration.core.errors import ConfigError, ProviderError
from orchestration.core.url_credentials import MissingVariable, credentials, problem
from tests.reliability import SECRETS, Reliability
from workers import secrets, spec_keys
from workers.providers.anthropic import AnthropicProvider
from workers.providers.openai import OpenAIProvider

URL = "https://duet-bot:${DUET_TEST_UC_PASSWORD}@gw.internal:8443/v1"
PASSWORD = "gw-pass/9c2e@5b71"


def test_the_reference_is_parsed_and_the_url_kept_without_it() -> None:
    assert url_credentials.variables(URL) == ("DUET_TEST_UC_PASSWORD",)
    assert url_credentials.variables("https://${A_USER}:${A_PASS}@h/v1") == ("A_USER", "A_PASS")
    assert url_credentials.variables("http://127.0.0.1:8/v1") == ()
    assert url_credentials.variables(None) == ()
    assert url_credentials.without_credentials(URL) == "https://gw.internal:8443/v1"
    assert url_credentials.without_credentials("http://h/v1?x=1") == "http://h/v1?x=1"
    assert url_credentials.has_credentials(URL)
    assert not url_credentials.has_credentials("http://h/v1")
    assert not url_credentials.has_credentials(None)


def test_the_worker_substitutes_each_variable_from_its_environment() -> None:
    found = credentials(URL, {"DUET_TEST_UC_PASSWORD": PASSWORD})
    assert found is not None
    assert (found.user, found.password) == ("duet-bot", PASSWORD)
    token = base64.b64encode(f"duet-bot:{PASSWORD}".encode()).decode()
    assert found.header() == f"Basic {token}"
    assert PASSWORD not in repr(found)
    # A written-out user name is percent-decoded; a token alone is the user name.
    named = credentials("https://team%40corp:${P}@h", {"P": "x"})
    assert named is not None and named.user == "team@corp"
    token_only = credentials("https://${T}@h", {"T": "tok-123"})
    assert token_only is not None and (token_only.user, token_only.password) == ("tok-123", "")
    assert credentials("https://h/v1", {}) is None
    assert credentials(None, {}) is None


@pytest.mark.parametrize("environ", [{}, {"DUET_TEST_UC_PASSWORD": ""}])
def test_a_missing_variable_is_named(environ: dict[str, str]) -> None:
    with pytest.raises(MissingVariable) as caught:
        credentials(URL, environ)
    assert caught.value.name == "DUET_TEST_UC_PASSWORD"


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("https://bob:hunter2-secret@gw/v1", "as https://bob:${GATEWAY_PASSWORD}@gw/v1"),
        ("https://:hunter2-secret@gw/v1", "as https://USER:${GATEWAY_PASSWORD}@gw/v1"),
        ("https://bob:pre${P}@gw/v1", "as https://bob:${GATEWAY_PASSWORD}@gw/v1"),
        ("https://hunter2-secret@gw/v1", "or https://${GATEWAY_TOKEN}@gw/v1 for a token"),
        ("https://hunter2-secret:@gw/v1", "USER:${GATEWAY_PASSWORD}@gw/v1"),
        ("https://a${U}:${P}@gw/v1", "the user name is written out, or is one ${VARIABLE}"),
        ("https://gw/v1?key=${P}", "only read in the URL's user:password@ part"),
        ("https://${H}/v1", "only read in the URL's user:password@ part"),
    ],
)
def test_a_credential_written_out_is_refused_with_the_fix(url: str, says: str) -> None:
    found = problem(url)
    assert found is not None and says in found, found
    assert "hunter2" not in found


@pytest.mark.parametrize(
    "url",
    [
        "http://alice:s3cret/PW@gw.example/v1",
        "http://alice:s3cret?PW@gw.example/v1",
        "http://alice:s3cret#PW@gw.example/v1",
        "https://s3cret/PW@gw.example",
    ],
)
def test_a_password_that_ends_the_host_early_is_refused_at_submit(
    url: str, reliability: Reliability
) -> None:
    """Issue 33, row 12: a ``/``, ``?`` or ``#`` in the password ends the host for a URL
    parser, so the password read as a port (or a path) went into Redis unchecked."""
    with reliability.case(
        section=SECRETS,
        fault="`http://alice:s3cret/PW@host` as `base_url` (a `/`, `?` or `#` in the password)",
        before="accepted: the password stored in Redis, its prefix logged, the run `running` "
        "for good",
    ):
        with pytest.raises(ConfigError) as info:
            Agent("a", model="openai:m", base_url=url)
        message = str(info.value)
        assert message.startswith("base_url: credentials in the URL"), message
        assert "s3cret" not in message and "PW" not in message


def test_references_are_accepted_and_stored_as_written() -> None:
    for url in (URL, "https://${U}:${P}@gw/v1", "https://${T}@gw/v1", "http://gw:8/v1"):
        assert problem(url) is None, url
    agent = Agent("a", model="anthropic:claude-x", base_url=URL)
    assert agent.spec.base_url == URL
    assert "${DUET_TEST_UC_PASSWORD}" in agent.spec.model_dump_json()


def test_an_agent_with_a_written_password_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError) as caught:
        Agent("a", model="openai:m", base_url="https://bob:hunter2-secret@gw.example/v1")
    message = str(caught.value)
    assert message.startswith("base_url: credentials in the URL"), message
    assert "https://bob:${GATEWAY_PASSWORD}@gw.example/v1" in message
    assert "hunter2" not in message


def test_a_config_with_a_reference_loads_and_one_with_a_password_names_the_path(
    tmp_path: Path,
) -> None:
    from duet.config import load_config

    def agents(base_url: str) -> object:
        path = tmp_path / "review.toml"
        path.write_text(
            '[actor]\ninstructions = "Fix."\nmodel = "anthropic:m"\n'
            f"base_url = '{base_url}'\n\n"
            '[critic]\ninstructions = "Judge."\nmodel = "sim"\n'
        )
        return load_config(path).build_agents()

    agents(URL)
    with pytest.raises(ConfigError, match=r"actor\.base_url: credentials in the URL"):
        agents("https://bob:hunter2-secret@gw.example/v1")


def test_no_vendor_key_goes_to_a_url_with_its_own_credentials() -> None:
    vendor = Agent("a", model="openai:m", base_url="https://u:${P}@api.openai.com/v1")
    assert vendor.spec.api_key_env is None
    both = Agent("a", model="anthropic:m", base_url=URL, api_key_env="DUET_TEST_UC_KEY")
    assert both.spec.api_key_env == "DUET_TEST_UC_KEY"  # x-api-key and basic auth: both sent
    with pytest.raises(ConfigError, match="api_key_env: .*one Authorization header"):
        Agent("a", model="openai:m", base_url=URL, api_key_env="DUET_TEST_UC_KEY")


def test_a_stored_spec_names_its_url_variables() -> None:
    spec = json.dumps(
        {
            "actor": {"base_url": URL, "api_key_env": None},
            "critic": {"base_url": "https://${DUET_T}@h", "api_key_env": "K"},
        }
    )
    assert spec_keys.named_variables(spec) == {"DUET_TEST_UC_PASSWORD", "DUET_T", "K"}


def test_the_url_variable_is_secret_once_its_adapter_exists(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    value = "own-adapter-pass-4e1d"
    monkeypatch.setenv("DUET_TEST_UC_ADAPTER_PASS", value)
    assert value in secrets.redact(f"x {value}")  # not a key variable yet
    AnthropicProvider(base_url="https://u:${DUET_TEST_UC_ADAPTER_PASS}@gw/v1")
    assert secrets.redact(f"x {value}") == "x [REDACTED]"
    assert secrets.scrub_output(f"said {value}") == "said [REDACTED]"


def test_a_missing_variable_is_a_permanent_run_error_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("DUET_TEST_UC_UNSET", raising=False)
    agent = Agent("a", model="openai:m", base_url="https://u:${DUET_TEST_UC_UNSET}@gw/v1").spec
    adapter = OpenAIProvider(base_url=agent.base_url, api_key_env=agent.api_key_env)
    adapter.warm()  # not an error until a call
    with pytest.raises(ProviderError) as caught:
        adapter.complete(agent, [{"role": "user", "content": "hi"}])
    error = caught.value
    assert (error.kind, error.transient) == ("missing_key", False)
    assert "environment variable DUET_TEST_UC_UNSET is not set on this worker" in str(error)


def test_basic_credentials_and_url_passwords_are_scrubbed_from_messages() -> None:
    token = base64.b64encode(b"duet-bot:anything-at-all").decode()
    assert secrets.redact(f"upstream got Authorization: Basic {token}") == (
        "upstream got Authorization: [REDACTED] [REDACTED]"
    )
    assert secrets.redact(f"header was basic {token}.") == "header was Basic [REDACTED]."
    assert secrets.redact("GET https://bob:any-pass@gw/v1 failed") == (
        "GET https://bob:[REDACTED]@gw/v1 failed"
    )
    # What is not a credential stays: a reference, plain words, base64 without a colon.
    kept = ["see https://bob:${GW_PASS}@gw/v1", "a basic understanding", "Basic dGVzdA=="]
    for text in kept:
        assert secrets.redact(text) == text


def test_duet_run_with_the_embedded_worker_names_an_unset_url_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from duet.commands.intake import load_checked

    monkeypatch.delenv("DUET_TEST_UC_EMBEDDED", raising=False)
    path = tmp_path / "review.toml"
    path.write_text(
        '[actor]\ninstructions = "Fix."\nmodel = "openai:m"\n'
        "base_url = 'https://bot:${DUET_TEST_UC_EMBEDDED}@gw.example/v1'\n\n"
        '[critic]\ninstructions = "Judge."\nmodel = "sim"\n'
    )
    with pytest.raises(ConfigError, match="actor: DUET_TEST_UC_EMBEDDED is not set, and the "):
        load_checked(path, embedded=True)
    monkeypatch.setenv("DUET_TEST_UC_EMBEDDED", "set-on-this-machine")
    assert load_checked(path, embedded=True).actor.base_url == (
        "https://bot:${DUET_TEST_UC_EMBEDDED}@gw.example/v1"
    )
