-- Take over a step whose claim names a dead process: the claim is still ARGV[1] (the
-- holder the begin script saw), that process's liveness key is gone, and the fleet has
-- been saying it is alive without a break for a whole process TTL (ARGV[4] ms) — after a
-- Redis outage every liveness key lapses at once, live ones included, so none is presumed
-- dead until each live process has had the time to say so again. Only then the claim
-- becomes ARGV[2]'s, for ARGV[3] seconds.
-- KEYS: the claim, the holder's process liveness key, the fleet's since key.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
local since = tonumber(redis.call('GET', KEYS[3]))
if not since then return 0 end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if now - since < tonumber(ARGV[4]) then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
return 1
