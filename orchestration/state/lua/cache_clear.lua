-- The model-call cache: drop the entries written before a cutoff (at most a batch).
-- KEYS: entries, used, stored, stats. ARGV: cutoff, batch. Returns how many were dropped.
local old = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', '(' .. ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, k in ipairs(old) do
  redis.call('HINCRBY', KEYS[4], 'bytes', -redis.call('HSTRLEN', KEYS[1], k))
  redis.call('HDEL', KEYS[1], k)
  redis.call('ZREM', KEYS[2], k)
  redis.call('ZREM', KEYS[3], k)
end
return #old
