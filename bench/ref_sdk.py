"""The raw-SDK reference: the loop's calls with nothing around them.

    python -m bench.ref_sdk BASE_URL RUNS CONCURRENCY ROUNDS

``CONCURRENCY`` coroutines on one ``AsyncOpenAI`` client take runs in turn; a run is
``1 + 2 x ROUNDS`` calls one after another (actor and critic shaped requests alternate),
as Duet's never-approving loop makes them. Prints one JSON object: process CPU seconds,
wall seconds, runs, calls.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from bench.overhead import ACTOR_INSTRUCTIONS, CRITIC_INSTRUCTIONS, prompt_for


async def main(base_url: str, runs: int, concurrency: int, rounds: int) -> dict[str, float]:
    import openai

    # The SDK's default retries: 50 connections opened at once can overflow the stand-in's
    # listen backlog on a busy machine (Duet's steps retry such a failure too).
    client = openai.AsyncOpenAI(base_url=base_url, api_key="not-needed", max_retries=2)
    critique = "Review this answer:\n\n" + "def parse(s):\n    return int(s)\n" * 8

    async def call(model: str, system: str, user: str) -> None:
        await client.chat.completions.create(
            model=model,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": user}],
            max_tokens=1024,
            timeout=120.0,
        )

    async def one_run(n: int) -> None:
        await call("sim", ACTOR_INSTRUCTIONS, prompt_for(n))
        for _ in range(rounds):
            await call("sim:critic?scores=0.1", CRITIC_INSTRUCTIONS, critique)
            await call("sim", ACTOR_INSTRUCTIONS, prompt_for(n))

    queue: asyncio.Queue[int] = asyncio.Queue()

    async def slot() -> None:
        while not queue.empty():
            await one_run(queue.get_nowait())

    for n in range(min(4, runs)):  # warm-up
        queue.put_nowait(-n - 1)
    await asyncio.gather(*(slot() for _ in range(4)))
    for n in range(runs):
        queue.put_nowait(n)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(slot() for _ in range(concurrency)))
    out = {
        "cpu_s": time.process_time() - cpu0,
        "wall_s": time.perf_counter() - wall0,
        "runs": runs,
        "calls": runs * (1 + 2 * rounds),
    }
    await client.close()
    return out


if __name__ == "__main__":
    url, n_runs, conc, n_rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    print(json.dumps(asyncio.run(main(url, n_runs, conc, n_rounds))))
