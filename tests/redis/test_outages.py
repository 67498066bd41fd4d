"""Every outage reply (MISCONF, READONLY, LOADING, MASTERDOWN, TRYAGAIN, CLUSTERDOWN,
NOREPLICAS, OOM, UNBLOCKED) is "not now" for the worker and both broker transports (Duet's,
kombu's stock one), never a bug: sent by a real server (a script's ``redis.error_reply``),
from a command, a pipeline and a transaction."""

from __future__ import annotations

import pytest
import redis

from orchestration.state import broker
from orchestration.state.connection import INFRA_ERRORS, UNAVAILABLE_ERRORS
from orchestration.state.outages import OUTAGE_CLASSES, is_outage

REPLY = "return redis.error_reply(ARGV[1])"


@pytest.mark.parametrize("prefix", sorted(OUTAGE_CLASSES))
def test_an_outage_reply_is_unavailable(redis_url: str, prefix: str) -> None:
    client = redis.Redis.from_url(redis_url)
    with pytest.raises(UNAVAILABLE_ERRORS) as raised:
        client.eval(REPLY, 0, f"{prefix} the server says no")
    assert isinstance(raised.value, INFRA_ERRORS)
    assert isinstance(raised.value, broker.Transport.connection_errors)
    assert isinstance(raised.value, broker.StockTransport.connection_errors)
    assert is_outage(raised.value)
    for transaction in (False, True):  # kombu's stock acks and notes are transactions
        pipe = client.pipeline(transaction=transaction)
        pipe.eval(REPLY, 0, f"{prefix} the server says no")
        with pytest.raises(broker.StockTransport.connection_errors) as raised:
            pipe.execute()
        assert isinstance(raised.value, UNAVAILABLE_ERRORS)
    client.close()


def test_a_script_bug_is_not_an_outage(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    with pytest.raises(redis.exceptions.ResponseError) as raised:
        client.eval(REPLY, 0, "ERR a bug in a script")
    assert not isinstance(raised.value, UNAVAILABLE_ERRORS)
    assert not isinstance(raised.value, broker.Transport.connection_errors)
    assert not isinstance(raised.value, broker.StockTransport.connection_errors)
    assert not is_outage(raised.value)
    client.close()


def test_a_plain_response_error_is_classified_by_its_prefix() -> None:
    assert is_outage(redis.exceptions.ResponseError("MISCONF cannot persist"))
    wrapped = "Command # 1 (SET c 1) of pipeline caused error: NOREPLICAS not enough"
    assert is_outage(redis.exceptions.ResponseError(wrapped))
    assert not is_outage(redis.exceptions.ResponseError("WRONGTYPE Operation against a key"))
    assert not is_outage(ValueError("MISCONF"))
