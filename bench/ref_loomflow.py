"""The in-process reference: loomflow's actor-critic team on the stand-in server.

Run by ``bench.suite`` with the Python of a separate venv holding ``loomflow`` (it is not
a dependency of Duet); standard library and loomflow only, so it runs there as a file::

    /tmp/loomvenv/bin/python bench/ref_loomflow.py BASE_URL RUNS CONCURRENCY ROUNDS

Prints one JSON object: process CPU seconds, wall seconds, runs finished, model calls
made by the team (counted by the caller from the stand-in's stats).
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

ACTOR = "You fix Python code. Return the whole corrected function."
CRITIC = (
    "Find bugs, security issues, and edge cases. Return strict JSON: "
    '{"score": 0..1, "issues": [...], "summary": "..."}'
)


def prompt_for(n: int) -> str:
    return f"Review and fix snippet #{n}:\n\ndef parse_{n}(s):\n    return eval(s)  # user input\n"


def unstreamed_model() -> type:
    """loomflow's OpenAI model with its ``stream`` made of one ``stream=False`` call: a
    team's agents always stream, and the stand-in (like Duet's own calls) answers the SDK's
    non-streaming request type only."""
    from loomflow.core.types import ModelChunk
    from loomflow.model.openai import OpenAIModel

    class Unstreamed(OpenAIModel):  # type: ignore[misc]
        async def stream(self, messages: object, **options: object) -> object:
            text, tool_calls, usage, finish = await self.complete(messages, **options)
            if text:
                yield ModelChunk(kind="text", text=text)
            for call in tool_calls:
                yield ModelChunk(kind="tool_call", tool_call=call)
            yield ModelChunk(kind="finish", finish_reason=finish, usage=usage)

    return Unstreamed


async def main(base_url: str, runs: int, concurrency: int, rounds: int) -> dict[str, float]:
    from loomflow import Agent
    from loomflow.team import Team

    OpenAIModel = unstreamed_model()  # noqa: N806 - the class, under loomflow's name

    def team() -> object:
        actor = Agent(
            ACTOR, model=OpenAIModel("sim", base_url=base_url, api_key="x"), auto_extract=False
        )
        critic = Agent(
            CRITIC,
            model=OpenAIModel("sim:critic?scores=0.1", base_url=base_url, api_key="x"),
            auto_extract=False,
        )
        return Team.actor_critic(
            actor=actor,
            critic=critic,
            max_rounds=rounds,
            approval_threshold=0.9,
            model=OpenAIModel("sim", base_url=base_url, api_key="x"),
            auto_extract=False,
        )

    gate = asyncio.Semaphore(concurrency)
    teams = [team() for _ in range(concurrency)]
    free = list(range(concurrency))

    async def one(n: int) -> None:
        async with gate:
            slot = free.pop()
            try:
                await teams[slot].run(prompt_for(n))  # type: ignore[attr-defined]
            finally:
                free.append(slot)

    await asyncio.gather(*(one(-n - 1) for n in range(min(4, runs))))  # warm-up
    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(one(n) for n in range(runs)))
    return {
        "cpu_s": time.process_time() - cpu0,
        "wall_s": time.perf_counter() - wall0,
        "runs": runs,
    }


if __name__ == "__main__":
    url, n_runs, conc, n_rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    print(json.dumps(asyncio.run(main(url, n_runs, conc, n_rounds))))
