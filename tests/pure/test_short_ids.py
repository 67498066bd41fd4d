"""Short ids: the shortest prefix naming one id, and what a typed prefix resolves to."""

from __future__ import annotations

import pytest

from duet.short_ids import resolve, shortest_unique


@pytest.mark.parametrize(
    ("ids", "expected"),
    [
        ([], {}),
        (["4c9e34663fac4c9d"], {"4c9e34663fac4c9d": "4c9e3466"}),
        (
            ["aaaaaaaa1111", "aaaaaaaa2222", "b0000000ffff"],
            {"aaaaaaaa1111": "aaaaaaaa1", "aaaaaaaa2222": "aaaaaaaa2", "b0000000ffff": "b0000000"},
        ),
        # Neighbours in sorted order decide: the middle one needs the longer of its two.
        (
            ["abcdefgh00", "abcdefgh0100", "abcdefgh0199"],
            {
                "abcdefgh00": "abcdefgh00",
                "abcdefgh0100": "abcdefgh010",
                "abcdefgh0199": "abcdefgh019",
            },
        ),
        # An id that is a prefix of another is shown whole; short ids are shown whole.
        (["abcdefghij", "abcdefghijk"], {"abcdefghij": "abcdefghij", "abcdefghijk": "abcdefghijk"}),
        (["abc"], {"abc": "abc"}),
    ],
)
def test_shortest_unique_prefix(ids: list[str], expected: dict[str, str]) -> None:
    assert shortest_unique(ids) == expected


def test_every_short_id_names_exactly_its_own_id() -> None:
    ids = [f"{n:032x}" for n in range(0, 4000, 7)] + ["ffff" * 8, "fffe" + "f" * 28]
    for ident, short in shortest_unique(ids).items():
        assert len(short) >= 8
        assert [other for other in ids if other.startswith(short)] == [ident]


def test_resolve_takes_the_id_itself_or_the_one_it_starts() -> None:
    assert resolve("4c9e", True, [], "batch") == "4c9e"
    assert resolve("4c9e", False, ["4c9e34663fac"], "batch") == "4c9e34663fac"


def test_resolve_says_what_is_missing_or_ambiguous() -> None:
    with pytest.raises(LookupError, match=r"batch 4c9e not found"):
        resolve("4c9e", False, [], "batch")
    many = [f"4c9e{n:04d}" for n in range(7)]
    with pytest.raises(LookupError, match=r"4c9e is the start of several run ids .*4c9e0000.*…"):
        resolve("4c9e", False, many, "run")
