--! include budget_common
-- Renew the lease of a call in flight's hold in every scope (it is still running).
-- KEYS: (budget, leases, holds) per scope. ARGV: step_id, lease_ms, scope count.
local now = now_ms()
for i = 0, tonumber(ARGV[3]) - 1 do
  redis.call('ZADD', KEYS[3 * i + 2], 'XX', 'GT', now + tonumber(ARGV[2]), ARGV[1])
end
return 1
