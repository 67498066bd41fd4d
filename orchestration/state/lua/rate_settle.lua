-- Settle or give back one permit of rate_acquire.lua, and note what the vendor's headers
-- said. A permit is taken back once (a second settlement finds nothing).
-- KEYS: state, permits.
-- ARGV: permit ('' for none), actual tokens (-1: given back, the call was answered 429 or
--       never sent), learn (1: ARGV[4..5] are what the headers said), rpm, tpm (-1: the
--       header was absent), pause_us (0: none; else no slot before now + pause_us).
-- Returns {1 if the permit was settled now else 0, 1 if a learned limit is in force}.
local state, permits = KEYS[1], KEYS[2]
local member, actual = ARGV[1], tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local done = 0
if member ~= '' and redis.call('ZREM', permits, member) == 1 then
  done = 1
  local ir, tokens, it = string.match(member, ':([%d.]+):(%d+):([%d.]+)$')
  ir, tokens, it = tonumber(ir), tonumber(tokens), tonumber(it)
  local s = redis.call('HMGET', state, 'tat_r', 'tat_t')
  if actual < 0 then
    if ir > 0 and s[1] then
      redis.call('HSET', state, 'tat_r', string.format('%.0f', tonumber(s[1]) - ir))
    end
    if it > 0 and s[2] then
      redis.call('HSET', state, 'tat_t', string.format('%.0f', tonumber(s[2]) - tokens * it))
    end
  elseif it > 0 and s[2] then
    redis.call('HSET', state, 'tat_t', string.format('%.0f', tonumber(s[2]) + (actual - tokens) * it))
  end
end
if ARGV[3] == '1' then
  redis.call('HSET', state, 'learned_at', string.format('%.0f', now))
  for i, field in ipairs({'rpm', 'tpm'}) do
    local v = tonumber(ARGV[3 + i])
    if v > 0 then redis.call('HSET', state, field, ARGV[3 + i]) else redis.call('HDEL', state, field) end
  end
end
local pause = tonumber(ARGV[6])
if pause > 0 then
  local cur = tonumber(redis.call('HGET', state, 'until') or '0')
  redis.call('HSET', state, 'until', string.format('%.0f', math.max(cur, now + pause)))
end
redis.call('PEXPIRE', state, 86400000)
local learned = redis.call('HEXISTS', state, 'rpm') + redis.call('HEXISTS', state, 'tpm')
return {done, learned > 0 and 1 or 0}
