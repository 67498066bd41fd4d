--! include budget_common
-- KEYS: (budget, leases, holds) per scope, then the run's settled hash, then its record.
-- ARGV: step_id, marker ttl (s), amount, scope count.
-- The settled hash keeps no TTL while the run's record keeps none (an open run): a
-- volatile-* eviction policy cannot drop it, so a store tried again never charges twice.
local step, ttl, amount, n = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local marker, record = KEYS[3 * n + 1], KEYS[3 * n + 2]
if redis.call('HEXISTS', marker, step) == 1 then return 0 end
local actual = split(amount)
for i = 0, n - 1 do
  release_one(KEYS[3 * i + 1], KEYS[3 * i + 2], KEYS[3 * i + 3], step)
  add(KEYS[3 * i + 1], 'spent:', actual, '')
end
redis.call('HSET', marker, step, '1')
local left = redis.call('TTL', record)
if left == -2 then
  redis.call('EXPIRE', marker, ttl)  -- no run record: not a run's call
elseif left > 0 then
  redis.call('EXPIRE', marker, left)  -- a finished run's: kept as long as the run
end
return 1
