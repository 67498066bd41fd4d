#!lua flags=allow-oom
-- The model-call cache yields to run state: evict its least recently used entries until
-- the server is ARGV[1] (a share of maxmemory) below its maxmemory again, or the cache is
-- empty, or ARGV[2] entries went. Deletes only (allowed at maxmemory). No maxmemory: none.
-- KEYS: entries, used, stored, stats. Returns how many entries were evicted.
local info = redis.call('INFO', 'memory')
local maxmemory = tonumber(string.match(info, 'maxmemory:(%d+)') or '0')
if maxmemory == 0 then return 0 end
local used = tonumber(string.match(info, 'used_memory:(%d+)') or '0')
local room = maxmemory * (1 - tonumber(ARGV[1])) - used
local evicted, most = 0, tonumber(ARGV[2])
while room < 0 and evicted < most do
  local oldest = redis.call('ZRANGE', KEYS[2], 0, 0)
  if #oldest == 0 then break end
  local k = oldest[1]
  local n = redis.call('HSTRLEN', KEYS[1], k)
  redis.call('HINCRBY', KEYS[4], 'bytes', -n)
  redis.call('HDEL', KEYS[1], k)
  redis.call('ZREM', KEYS[2], k)
  redis.call('ZREM', KEYS[3], k)
  room = room + n
  evicted = evicted + 1
end
return evicted
