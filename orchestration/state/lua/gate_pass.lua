-- Hand the batch's free places to its first waiting runs: each is moved from the queue
-- to the gate here, so no place is given twice, and into the sweep's index (as moved
-- now): the caller sends each its first transition, and one lost in a crash is sent by
-- the sweep. A batch left with no waiting run leaves the set of gated batches.
-- KEYS[1]: the gate; KEYS[2]: the waiting runs; KEYS[3]: the sweep's index of
-- unfinished runs; KEYS[4]: the batches with waiting runs.
-- ARGV[1]: max_in_flight; ARGV[2]: now; ARGV[3]: the batch.
local free = tonumber(ARGV[1]) - redis.call('SCARD', KEYS[1])
local handed = {}
if free > 0 then
  local next = redis.call('ZPOPMIN', KEYS[2], free)
  for i = 1, #next, 2 do
    redis.call('SADD', KEYS[1], next[i])
    redis.call('ZADD', KEYS[3], ARGV[2], next[i])
    handed[#handed + 1] = next[i]
  end
end
if redis.call('ZCARD', KEYS[2]) == 0 then redis.call('SREM', KEYS[4], ARGV[3]) end
return handed
