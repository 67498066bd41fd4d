"""Random ids: version-4 UUID text, unique, and not repeated by a forked child or by code
that seeds the ``random`` module."""

from __future__ import annotations

import os
import random
import uuid

from orchestration.state import ids


def test_uuid4_text_is_the_text_of_a_version_4_uuid() -> None:
    made = [ids.uuid4_text() for _ in range(20_000)]
    assert len(set(made)) == len(made)
    for text in made[:2000]:
        parsed = uuid.UUID(text)
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122 and str(parsed) == text


def test_random_hex_has_the_digits_asked_for() -> None:
    assert {len(ids.random_hex(12)) for _ in range(1000)} == {12}
    assert all(c in "0123456789abcdef" for c in ids.random_hex(64))


def test_a_forked_child_draws_other_ids_than_its_parent() -> None:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent
        try:
            os.write(write, " ".join(ids.uuid4_text() for _ in range(4)).encode())
        finally:
            os._exit(0)
    os.close(write)
    mine = [ids.uuid4_text() for _ in range(4)]
    with os.fdopen(read) as pipe:
        theirs = pipe.read().split()
    os.waitpid(pid, 0)
    assert len(theirs) == 4 and set(theirs).isdisjoint(mine)


def test_seeding_the_random_module_does_not_repeat_ids() -> None:
    state = random.getstate()
    try:
        random.seed(7)
        first = ids.uuid4_text()
        random.seed(7)
        assert ids.uuid4_text() != first
    finally:
        random.setstate(state)
