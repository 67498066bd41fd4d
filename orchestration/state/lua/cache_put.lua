#!lua flags=allow-oom
-- The model-call cache: write one entry, then evict the least recently used of the
-- cache's own entries while over the cap (never anything else: no maxmemory eviction).
-- Under a maxmemory, the cache also yields to run state: it keeps no more than its own
-- bytes plus the server's room beyond a reserve (ARGV[6], a share of maxmemory), and
-- evicts before it writes (HDEL is allowed at maxmemory; HSET is not), so a cache that
-- filled the server makes room instead of leaving run writes to meet OOM.
-- KEYS: entries, used, stored, stats.
-- ARGV: key, now, value, max_entries, max_bytes, reserve share (0..1).
-- Returns how many entries were evicted (-1: the entry did not fit, not stored).
local max_entries, max_bytes = tonumber(ARGV[4]), tonumber(ARGV[5])
local size = string.len(ARGV[3])
local bytes = tonumber(redis.call('HGET', KEYS[4], 'bytes') or '0')
local info = redis.call('INFO', 'memory')
local maxmemory = tonumber(string.match(info, 'maxmemory:(%d+)') or '0')
if maxmemory > 0 then
  local used = tonumber(string.match(info, 'used_memory:(%d+)') or '0')
  local room = maxmemory * (1 - tonumber(ARGV[6])) - used
  local cap = bytes + room
  if cap < max_bytes then max_bytes = math.max(0, math.floor(cap)) end
end
local old = redis.call('HSTRLEN', KEYS[1], ARGV[1])
local evicted = 0
local function evict_oldest()
  local oldest = redis.call('ZRANGE', KEYS[2], 0, 0)
  if #oldest == 0 then return false end
  local k = oldest[1]
  bytes = redis.call('HINCRBY', KEYS[4], 'bytes', -redis.call('HSTRLEN', KEYS[1], k))
  redis.call('HDEL', KEYS[1], k)
  redis.call('ZREM', KEYS[2], k)
  redis.call('ZREM', KEYS[3], k)
  evicted = evicted + 1
  return true
end
local function adding()
  if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return 0 end
  return 1
end
-- Room first, with the cache's own entries (the new one counted as written). The
-- script may write at maxmemory (allow-oom): it writes only what fits the room.
while bytes - old + size > max_bytes or redis.call('ZCARD', KEYS[2]) + adding() > max_entries do
  if not evict_oldest() then break end
  old = redis.call('HSTRLEN', KEYS[1], ARGV[1])
end
if bytes - old + size > max_bytes then return -1 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[2], ARGV[1])
redis.call('HINCRBY', KEYS[4], 'bytes', size - old)
return evicted
