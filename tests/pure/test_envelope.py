"""Which broker texts a worker can take (``orchestration.core.envelope``)."""

from __future__ import annotations

import pytest

from orchestration.core.envelope import examine

GOOD = (
    '{"body": "W10=", "headers": {"task": "duet.coordinate"}, "properties": '
    '{"delivery_tag": "t", "body_encoding": "base64", '
    '"delivery_info": {"exchange": "", "routing_key": "coordinator"}}}'
)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "not JSON"),
        ("{'a': 1}", "not JSON"),
        ("[1, 2]", "not a JSON object but a list"),
        ('"text"', "not a JSON object but a str"),
        ('{"body": "e30="}', "no 'properties' object"),
        ('{"properties": []}', "no 'properties' object"),
        ('{"properties": {"delivery_tag": 5}}', "no 'properties.delivery_tag'"),
        ('{"properties": {"delivery_tag": "t"}}', "no 'properties.delivery_info.routing_key'"),
        (GOOD.replace('"W10="', "[1]"), "'body' is a list"),
        (GOOD.replace('"base64"', '"rot13"'), "unknown 'properties.body_encoding' 'rot13'"),
        (GOOD.replace('"W10="', '"abc"'), "'body' is not base64"),
    ],
)
def test_a_text_no_worker_can_take_says_why(text: str, reason: str) -> None:
    payload, problem = examine(text)
    assert payload is None and problem is not None and problem.startswith(reason), problem


def test_a_celery_message_is_taken() -> None:
    payload, problem = examine(GOOD)
    assert problem is None and payload is not None
    assert payload["properties"]["delivery_tag"] == "t"
