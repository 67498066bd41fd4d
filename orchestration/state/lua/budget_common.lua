-- Amounts travel as "input,output,usd_micros,calls" strings, so Lua never formats a
-- large number itself (tostring would switch to exponent notation).
local STORED = {'input_tokens', 'output_tokens', 'usd', 'calls'}
local UNITS = {'input_tokens', 'output_tokens', 'tokens', 'usd', 'calls'}

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function split(s)
  local a, b, c, d = string.match(s, '^(%d+),(%d+),(%d+),(%d+)$')
  return {a, b, c, d}
end

local function add(bkey, prefix, parts, sign)
  for k = 1, 4 do
    if parts[k] ~= '0' then
      local left = redis.call('HINCRBY', bkey, prefix .. STORED[k], sign .. parts[k])
      -- A budget hash evicted and made again (its holds hash kept) holds less than is
      -- released from it: a count never goes below 0.
      if left < 0 then redis.call('HSET', bkey, prefix .. STORED[k], 0) end
    end
  end
end

local function release_one(bkey, lkey, hkey, step)
  redis.call('ZREM', lkey, step)
  local held = redis.call('HGET', hkey, step)
  if not held then return 0 end
  redis.call('HDEL', hkey, step)
  add(bkey, 'reserved:', split(held), '-')
  return 1
end

-- A hold whose lease ran out belongs to a call whose outcome is unknown (its worker died
-- or stopped renewing it): the vendor may have billed it, so it is charged, not released.
local function charge_one(bkey, lkey, hkey, step)
  redis.call('ZREM', lkey, step)
  local held = redis.call('HGET', hkey, step)
  if not held then return 0 end
  redis.call('HDEL', hkey, step)
  local parts = split(held)
  add(bkey, 'reserved:', parts, '-')
  add(bkey, 'spent:', parts, '')
  add(bkey, 'lapsed:', parts, '')  -- of spent, what was charged at its hold
  return 1
end

local function purge(bkey, lkey, hkey, now)
  local expired = redis.call('ZRANGEBYSCORE', lkey, '-inf', now)
  for _, step in ipairs(expired) do charge_one(bkey, lkey, hkey, step) end
end

local function num(v)
  if v then return tonumber(v) end
  return 0
end

local function value(v, unit)
  if unit == 'input_tokens' then return v[1] end
  if unit == 'output_tokens' then return v[2] end
  if unit == 'tokens' then return v[1] + v[2] end
  if unit == 'usd' then return v[3] end
  return v[4]
end

-- Whether budget hash `bkey` has any limit on.
local function has_limit(bkey)
  local r = redis.call('HMGET', bkey, 'limit:input_tokens', 'limit:output_tokens',
                       'limit:tokens', 'limit:usd', 'limit:calls')
  for k = 1, 5 do
    if r[k] then return true end
  end
  return false
end

-- The field of a scope's holds hash that says a limit was set on it (budget_set_limits
-- keeps it). A scope with the mark and no limit lost its limit (its hash evicted or
-- deleted): an error, never "unlimited".
local LIMIT_MARK = '!limit'

local function lost(bkey, hkey)
  return redis.call('HEXISTS', hkey, LIMIT_MARK) == 1 and not has_limit(bkey)
end

-- Whether budget hash `bkey` has a limit on, or had one and lost it (a call there must
-- reserve, which refuses). Its holds hash is `bkey` .. ':holds' (keys.budget_holds).
local function limited(bkey)
  return has_limit(bkey) or redis.call('HEXISTS', bkey .. ':holds', LIMIT_MARK) == 1
end

local function load(bkey)
  local r = redis.call('HMGET', bkey,
    'limit:input_tokens', 'limit:output_tokens', 'limit:tokens', 'limit:usd', 'limit:calls',
    'spent:input_tokens', 'spent:output_tokens', 'spent:usd', 'spent:calls',
    'reserved:input_tokens', 'reserved:output_tokens', 'reserved:usd', 'reserved:calls',
    'warn_at')
  local limits = {}
  for k = 1, 5 do
    if r[k] then limits[UNITS[k]] = tonumber(r[k]) end
  end
  local warn_at = 0.8
  if r[14] then warn_at = tonumber(r[14]) end
  return limits, {num(r[6]), num(r[7]), num(r[8]), num(r[9])},
    {num(r[10]), num(r[11]), num(r[12]), num(r[13])}, warn_at
end
