-- The model-call cache: write one entry, then evict the least recently used of the
-- cache's own entries while over the cap (never anything else: no maxmemory eviction).
-- KEYS: entries, used, stored, stats. ARGV: key, now, value, max_entries, max_bytes.
-- Returns how many entries were evicted.
local old = redis.call('HSTRLEN', KEYS[1], ARGV[1])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[2], ARGV[1])
local bytes = redis.call('HINCRBY', KEYS[4], 'bytes', string.len(ARGV[3]) - old)
local max_entries, max_bytes = tonumber(ARGV[4]), tonumber(ARGV[5])
local evicted = 0
while redis.call('ZCARD', KEYS[2]) > max_entries or bytes > max_bytes do
  local oldest = redis.call('ZRANGE', KEYS[2], 0, 0)
  if #oldest == 0 then break end
  local k = oldest[1]
  bytes = redis.call('HINCRBY', KEYS[4], 'bytes', -redis.call('HSTRLEN', KEYS[1], k))
  redis.call('HDEL', KEYS[1], k)
  redis.call('ZREM', KEYS[2], k)
  redis.call('ZREM', KEYS[3], k)
  evicted = evicted + 1
end
return evicted
