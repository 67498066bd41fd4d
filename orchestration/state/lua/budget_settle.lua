--! include budget_common
-- KEYS: (budget, leases, holds) per scope, then the step's settled marker.
-- ARGV: step_id, marker ttl (s), amount, scope count.
local step, ttl, amount, n = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
local marker = KEYS[3 * n + 1]
if redis.call('EXISTS', marker) == 1 then return 0 end
local actual = split(amount)
for i = 0, n - 1 do
  release_one(KEYS[3 * i + 1], KEYS[3 * i + 2], KEYS[3 * i + 3], step)
  add(KEYS[3 * i + 1], 'spent:', actual, '')
end
redis.call('SET', marker, '1', 'EX', ttl)
return 1
