-- A worker process says it is alive for ARGV[1] ms, and keeps the fleet's unbroken run
-- of signs of life going (KEYS[2]: since when, epoch ms; its TTL is half a process's, so
-- it lapses in a Redis outage before any live process's key can, and starts again after).
-- KEYS[3] notes its last sign of life (member ARGV[2]) for the fleet to notice its death.
-- KEYS: the process's liveness key, the fleet's since key, the fleet's processes index.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[1])
redis.call('SET', KEYS[1], '1', 'PX', ttl)
local half = math.max(1, math.floor(ttl / 2))
if not redis.call('SET', KEYS[2], now, 'NX', 'PX', half) then
  redis.call('PEXPIRE', KEYS[2], half)
end
redis.call('ZADD', KEYS[3], now, ARGV[2])
return 1
