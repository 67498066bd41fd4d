"""The stand-in holds every request to the installed SDKs' own request types, as the real
APIs do: an unknown key at any level, or a setting the API version lacks (Anthropic's
``temperature``, where the installed SDK's type has none), is a 400 in the vendor's error
shape, which the SDK raises as its ``BadRequestError``. A config setting one is refused
before anything is sent, whatever the SDK."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from duet.standin.server import FakeLLM
from tests.reliability import ENGINE, Reliability, lost_of

pytestmark = pytest.mark.system

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "review-openai-anthropic.toml"
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def llm() -> Iterator[FakeLLM]:
    with FakeLLM() as server:
        yield server


# Any: the tests send what the SDK types refuse. Each client is closed after its test (an
# unclosed one's socket is a ResourceWarning whenever it is collected, in any later test).
@pytest.fixture
def gpt(llm: FakeLLM) -> Iterator[Any]:
    with openai.OpenAI(base_url=llm.url, api_key="x", max_retries=0) as client:
        yield client


@pytest.fixture
def claude(llm: FakeLLM) -> Iterator[Any]:
    with anthropic.Anthropic(base_url=llm.anthropic_url, api_key="x", max_retries=0) as client:
        yield client


def _anthropic_refusal(call: Any) -> str:
    """The message of the 400 ``call`` gets, checked to be in Anthropic's error shape."""
    with pytest.raises(anthropic.BadRequestError) as caught:
        call()
    assert caught.value.status_code == 400
    body = caught.value.body
    assert isinstance(body, dict) and set(body) == {"type", "error"} and body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    return str(body["error"]["message"])


def _openai_refusal(call: Any) -> openai.BadRequestError:
    """The 400 ``call`` gets, checked to be in OpenAI's error shape."""
    with pytest.raises(openai.BadRequestError) as caught:
        call()
    assert caught.value.status_code == 400
    error = caught.value.response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" == caught.value.type
    return caught.value


#: A valid Anthropic request, which the Anthropic tests here vary.
ASK = {"model": "claude-opus-4-7", "max_tokens": 2000, "messages": HI}


def _not_refused_as_extra(refused: dict[str, str]) -> list[str]:
    """Which of the ``refused`` messages do not refuse a key the request type lacks."""
    return [
        what for what, message in refused.items() if "Extra inputs are not permitted" not in message
    ]


def _sdk_types_a_temperature() -> bool:
    """Whether the installed anthropic SDK's request type still has ``temperature`` (SDKs
    before API version 2026-10-21 do): the stand-in holds requests to that type."""
    from anthropic.types.message_create_params import MessageCreateParamsNonStreaming as Params

    return "temperature" in Params.__required_keys__ | Params.__optional_keys__


def test_anthropic_unknown_keys_are_refused(claude: Any, reliability: Reliability) -> None:
    client = claude
    refused = {
        "top-level key": _anthropic_refusal(
            lambda: client.messages.create(**ASK, extra_body={"bogus": 1})
        ),
        "key in a content block": _anthropic_refusal(
            lambda: client.messages.create(
                model="claude-opus-4-7",
                max_tokens=50,
                messages=[
                    {"role": "user", "content": [{"type": "text", "text": "hi", "bogus": 1}]}
                ],
            )
        ),
        "key in a batch request": _anthropic_refusal(
            lambda: client.messages.batches.create(
                requests=[{"custom_id": "a", "params": {**ASK, "bogus": 1}}]
            )
        ),
    }
    answered = client.messages.create(**ASK)
    wrong = _not_refused_as_extra(refused)
    reliability.record(
        section=ENGINE,
        fault="Strict vendor schemas: Anthropic requests with unknown keys (at the top, in a "
        "content block, in a batch request), checked against the installed SDK's "
        "`MessageCreateParams`",
        load=f"{len(refused)} refused requests and 1 valid one, through the anthropic SDK",
        lost=f"{lost_of(len(wrong), len(refused), 'not refused as the API does')}: each a 400 "
        "`invalid_request_error` naming the key, raised as `BadRequestError`",
    )
    assert not wrong, refused
    assert "requests.0.params.bogus" in refused["key in a batch request"]
    assert answered.content and answered.stop_reason == "end_turn"


def test_anthropic_temperature_is_refused_where_the_sdk_types_none(
    claude: Any, reliability: Reliability
) -> None:
    if _sdk_types_a_temperature():
        pytest.skip(
            f"anthropic {anthropic.__version__}'s MessageCreateParams still has `temperature` "
            "(before API version 2026-10-21): the stand-in takes what the installed SDK types"
        )
    client = claude
    refused = {
        "temperature": _anthropic_refusal(
            lambda: client.messages.create(**ASK, extra_body={"temperature": 0.2})
        ),
        "batch request's temperature": _anthropic_refusal(
            lambda: client.messages.batches.create(
                requests=[{"custom_id": "a", "params": {**ASK, "temperature": 0.2}}]
            )
        ),
    }
    wrong = _not_refused_as_extra(refused)
    reliability.record(
        section=ENGINE,
        fault="Strict vendor schemas: an Anthropic request with a `temperature`, absent from "
        "API version 2026-10-21 (in a message request, in a batch request), checked against "
        "the installed SDK's `MessageCreateParams`",
        load=f"{len(refused)} refused requests, through the anthropic SDK",
        lost=f"{lost_of(len(wrong), len(refused), 'not refused as the API does')}: each a 400 "
        "`invalid_request_error` naming the key, raised as `BadRequestError`",
    )
    assert not wrong, refused
    assert "temperature" in refused["temperature"]
    assert "requests.0.params.temperature" in refused["batch request's temperature"]


def test_openai_unknown_keys_are_refused_with_their_param(
    gpt: Any, reliability: Reliability, tmp_path: Path
) -> None:
    client = gpt
    line = {
        "custom_id": "a",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "gpt-4.1", "messages": HI, "bogus": 1},
    }
    upload = client.files.create(file=("in.jsonl", json.dumps(line).encode()), purpose="batch")
    errors = {
        "bogus": _openai_refusal(
            lambda: client.chat.completions.create(
                model="gpt-4.1",
                messages=HI,
                extra_body={"bogus": 1},
            )
        ),
        "messages.0.bogus": _openai_refusal(
            lambda: client.chat.completions.create(
                model="gpt-4.1",
                messages=[{"role": "user", "content": "hi", "bogus": 1}],
            )
        ),
        "response_format.json_schema.bogus": _openai_refusal(
            lambda: client.chat.completions.create(
                model="gpt-4.1",
                messages=HI,
                response_format={
                    "type": "json_schema",
                    "json_schema": {"name": "c", "bogus": 1},
                },
            )
        ),
        "batch line": _openai_refusal(
            lambda: client.batches.create(
                input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
        ),
        "batch body": _openai_refusal(
            lambda: client.batches.create(
                input_file_id=upload.id,
                endpoint="/v1/chat/completions",
                completion_window="24h",
                extra_body={"bogus": 1},
            )
        ),
        "upload purpose": _openai_refusal(
            lambda: client.files.create(file=("x.jsonl", b"{}\n"), purpose="bogus")
        ),
    }
    answered = client.chat.completions.create(model="gpt-4.1", messages=HI, temperature=0.2)
    params = {what: exc.param for what, exc in errors.items()}
    wrong = [
        w
        for w in ("bogus", "messages.0.bogus", "response_format.json_schema.bogus")
        if params[w] != w
    ]
    reliability.record(
        section=ENGINE,
        fault="Strict vendor schemas: OpenAI requests the API would refuse (unknown keys at the "
        "top, in a message, in a response format, in a batch's body and file line; a bad upload "
        "purpose), "
        "checked against the installed SDK's `CompletionCreateParams` and batch types",
        load=f"{len(errors)} refused requests and 1 valid one, through the openai SDK",
        lost=f"{lost_of(len(wrong), 3, 'refusals without the key as `param`')}: each a 400 "
        "`invalid_request_error`, raised as `BadRequestError`",
    )
    assert not wrong, params
    assert "input file line 1: body.bogus" in str(errors["batch line"])
    assert "bogus: Extra inputs are not permitted" in str(errors["batch body"])
    assert "purpose" in str(errors["upload purpose"])
    assert answered.choices[0].finish_reason == "stop"


def test_openai_reasoning_models_refuse_a_temperature_and_max_tokens(gpt: Any) -> None:
    client = gpt
    temperature = _openai_refusal(
        lambda: client.chat.completions.create(model="o3", messages=HI, temperature=0.2)
    )
    max_tokens = _openai_refusal(
        lambda: client.chat.completions.create(model="gpt-5-mini", messages=HI, max_tokens=9)
    )
    assert (temperature.param, max_tokens.param) == ("temperature", "max_tokens")
    assert "Only the default (1) value is supported" in str(temperature)
    answered = client.chat.completions.create(
        model="o3", messages=HI, temperature=1, max_completion_tokens=4000
    )
    assert answered.choices[0].finish_reason == "stop"


def _dry_run(config: Path, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DUET_REDIS_URL", "DUET_BROKER_URL")}
    env.update(ANTHROPIC_API_KEY="x", OPENAI_API_KEY="y")
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "duet.commands.main",
            "run",
            str(config),
            "-i",
            str(ROOT / "examples" / "inputs.jsonl"),
            "-o",
            str(tmp_path / "out.jsonl"),
            "--dry-run",
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
    )


def test_the_shipped_example_passes_and_a_claude_temperature_is_refused_before_sending(
    tmp_path: Path, reliability: Reliability
) -> None:
    shipped = _dry_run(EXAMPLE, tmp_path)
    bad = tmp_path / "bad.toml"
    bad.write_text(
        EXAMPLE.read_text().replace(
            "max_tokens = 32000", "temperature = 0.2\nmax_tokens = 32000", 1
        )
    )
    refused = _dry_run(bad, tmp_path)
    expected = "actor.temperature: claude-opus-4-7 takes no temperature"
    reliability.record(
        section=ENGINE,
        fault="Strict vendor schemas: a config setting what its model cannot take (the shipped "
        "example with `temperature` on its Claude actor)",
        load="`duet run --dry-run` of the shipped example, and of it with that line added",
        lost=lost_of(
            int(refused.returncode != 2 or expected not in refused.stderr), 1, "configs sent on"
        )
        + ": refused at submit with its key path, exit 2; the shipped example passes",
        before="the example set it, so every actor call would have been a 400",
    )
    assert shipped.returncode == 0, shipped.stderr
    assert refused.returncode == 2 and expected in refused.stderr, refused.stderr
    assert "Traceback" not in refused.stderr
