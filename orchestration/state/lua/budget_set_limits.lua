--! include budget_common
-- KEYS: budget, holds. ARGV: warn_at, then one limit per unit ('' = off). A changed limit or
-- threshold re-arms its one-time warning; setting the same values again changes nothing.
local bkey = KEYS[1]
if redis.call('HGET', bkey, 'warn_at') ~= ARGV[1] then
  redis.call('HSET', bkey, 'warn_at', ARGV[1])
  for _, unit in ipairs(UNITS) do redis.call('HDEL', bkey, 'warned:' .. unit) end
end
for k, unit in ipairs(UNITS) do
  local new, old = ARGV[k + 1], redis.call('HGET', bkey, 'limit:' .. unit)
  if new == '' then
    if old then redis.call('HDEL', bkey, 'limit:' .. unit, 'warned:' .. unit) end
  elseif old ~= new then
    redis.call('HSET', bkey, 'limit:' .. unit, new)
    redis.call('HDEL', bkey, 'warned:' .. unit)
  end
end
if has_limit(bkey) then
  redis.call('HSET', KEYS[2], LIMIT_MARK, '1')
else
  redis.call('HDEL', KEYS[2], LIMIT_MARK)
end
return 1
