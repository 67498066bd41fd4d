-- KEYS: request, pending, collect marker. ARGV: member, request JSON, TTL s, gather ms.
-- Returns {new, schedule}: whether the request was parked now (not by an earlier
-- delivery) and whether the caller should schedule the group's collector.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local new = 0
if redis.call('SET', KEYS[1], ARGV[2], 'NX', 'EX', ARGV[3]) then
  redis.call('ZADD', KEYS[2], 'NX', now, ARGV[1])
  new = 1
end
local schedule = 0
if redis.call('SET', KEYS[3], '1', 'NX', 'PX', ARGV[4]) then schedule = 1 end
return {new, schedule}
