--! include budget_common
-- KEYS: budget, leases, holds. Returns {open holds, then the budget hash as pairs}.
purge(KEYS[1], KEYS[2], KEYS[3], now_ms())
local out = redis.call('HGETALL', KEYS[1])
table.insert(out, 1, redis.call('ZCARD', KEYS[2]))
return out
