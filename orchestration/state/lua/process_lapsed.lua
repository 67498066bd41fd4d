-- Which of the worker processes ARGV[2..] (last seen over ARGV[1] ms ago) are dead: their
-- liveness key (KEYS[2 + i]) gone. Each is taken off the index here, so one caller alone
-- acts on a death. None while the fleet's since key is younger than ARGV[1] ms (after a
-- Redis outage every key lapses at once: live processes are given a whole TTL to return).
-- KEYS: the fleet's processes index, the fleet's since key, each process's liveness key.
local ttl = tonumber(ARGV[1])
local since = tonumber(redis.call('GET', KEYS[2]))
if not since then return {} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if now - since < ttl then return {} end
local gone = {}
for i = 2, #ARGV do
  if redis.call('EXISTS', KEYS[i + 1]) == 0 and redis.call('ZREM', KEYS[1], ARGV[i]) == 1 then
    gone[#gone + 1] = ARGV[i]
  end
end
return gone
