"""Every Redis key and Lua script: runs, steps, events, budgets, rate limits,
conversations, and the broker transport. Nothing outside this folder talks to Redis."""
