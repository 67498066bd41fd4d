-- KEYS: pending, taking, collect marker. ARGV: max requests, gather ms, reclaim ms.
-- Returns {'empty'} | {'wait', ms} | {'take', member...}.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local stale = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now - tonumber(ARGV[3]))
for _, m in ipairs(stale) do
  redis.call('ZREM', KEYS[2], m)
  redis.call('ZADD', KEYS[1], 'NX', now, m)
end
local n = redis.call('ZCARD', KEYS[1])
if n == 0 then
  redis.call('DEL', KEYS[3])
  return {'empty'}
end
local oldest = tonumber(redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')[2])
local waited = now - oldest
if n < tonumber(ARGV[1]) and waited < tonumber(ARGV[2]) then
  return {'wait', tonumber(ARGV[2]) - waited}
end
local members = redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[1]) - 1)
redis.call('ZREM', KEYS[1], unpack(members))
for _, m in ipairs(members) do redis.call('ZADD', KEYS[2], now, m) end
redis.call('DEL', KEYS[3])
local out = {'take'}
for _, m in ipairs(members) do out[#out + 1] = m end
return out
