--! include budget_common
-- KEYS: (budget, leases, holds) per scope. ARGV: scope count, include_reserved (0/1).
-- Returns {blocked scope index + 1 (0: none), blocked unit, then per warning not yet
-- emitted: scope index, unit, fraction}. It sets no flag: the transition that emits the
-- warning does, in its own script (see ``warning_flag``), so a lost race emits nothing
-- and loses nothing.
-- A scope without any limit has nothing to check: neither the clock nor its holds are read.
-- A scope that lost its limit (see budget_common's LIMIT_MARK) returns {-(index + 1)}.
local n, with_reserved = tonumber(ARGV[1]), ARGV[2] == '1'
local now = nil
local out = {0, ''}
for i = 0, n - 1 do
  local bkey = KEYS[3 * i + 1]
  local limits, spent, reserved, warn_at = {}, nil, nil, nil
  if limited(bkey) then
    if lost(bkey, KEYS[3 * i + 3]) then return {-(i + 1)} end
    now = now or now_ms()
    purge(bkey, KEYS[3 * i + 2], KEYS[3 * i + 3], now)
    limits, spent, reserved, warn_at = load(bkey)
  end
  for _, unit in ipairs(UNITS) do
    local limit = limits[unit]
    if limit then
      local used = value(spent, unit)
      if with_reserved then used = used + value(reserved, unit) end
      if out[1] == 0 and used >= limit then
        out[1] = i + 1
        out[2] = unit
      end
      if used >= warn_at * limit and redis.call('HEXISTS', bkey, 'warned:' .. unit) == 0 then
        local fraction = 1
        if limit > 0 then fraction = used / limit end
        table.insert(out, i)
        table.insert(out, unit)
        table.insert(out, tostring(fraction))
      end
    end
  end
end
return out
