--! include budget_common
-- KEYS: (budget, leases, holds) per scope, then the run's settled hash (keys.budget_settled).
-- ARGV: step_id, lease_ms, amount, scope count.
local step, lease, amount, n = ARGV[1], tonumber(ARGV[2]), ARGV[3], tonumber(ARGV[4])
if redis.call('HEXISTS', KEYS[3 * n + 1], step) == 1 then return {'settled'} end
local now = now_ms()
local est = split(amount)
local est_n = {tonumber(est[1]), tonumber(est[2]), tonumber(est[3]), tonumber(est[4])}
local everywhere = true
for i = 0, n - 1 do
  if lost(KEYS[3 * i + 1], KEYS[3 * i + 3]) then return {'lost', i} end
end
for i = 0, n - 1 do
  purge(KEYS[3 * i + 1], KEYS[3 * i + 2], KEYS[3 * i + 3], now)
  if redis.call('HEXISTS', KEYS[3 * i + 3], step) == 0 then everywhere = false end
end
if everywhere then
  -- a redelivered step: keep its hold, stretch the lease for the new attempt
  for i = 0, n - 1 do redis.call('ZADD', KEYS[3 * i + 2], 'GT', now + lease, step) end
  return {'held'}
end
for i = 0, n - 1 do
  local limits, spent, reserved = load(KEYS[3 * i + 1])
  local own = redis.call('HGET', KEYS[3 * i + 3], step)
  if own then
    own = split(own)
    for k = 1, 4 do reserved[k] = reserved[k] - tonumber(own[k]) end
  end
  for _, unit in ipairs(UNITS) do
    local limit = limits[unit]
    if limit then
      local s, r, e = value(spent, unit), value(reserved, unit), value(est_n, unit)
      if s + r + e > limit then return {'refused', i, unit, limit, s, r, e} end
    end
  end
end
for i = 0, n - 1 do
  local bkey, lkey, hkey = KEYS[3 * i + 1], KEYS[3 * i + 2], KEYS[3 * i + 3]
  release_one(bkey, lkey, hkey, step)
  add(bkey, 'reserved:', est, '')
  redis.call('HSET', hkey, step, amount)
  redis.call('ZADD', lkey, now + lease, step)
end
return {'ok'}
