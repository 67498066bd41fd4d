-- The model-call cache: read one entry (a hit) unless missing or older than the TTL.
-- KEYS: entries (hash), used (zset key -> last use), stored (zset key -> written), stats.
-- ARGV: key, now, ttl_s. Returns the entry's text, or false (a miss).
local stored = redis.call('ZSCORE', KEYS[3], ARGV[1])
if stored and tonumber(ARGV[2]) - tonumber(stored) <= tonumber(ARGV[3]) then
  local value = redis.call('HGET', KEYS[1], ARGV[1])
  if value then
    redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
    redis.call('HINCRBY', KEYS[4], 'hits', 1)
    return value
  end
end
redis.call('HINCRBY', KEYS[4], 'misses', 1)
return false
