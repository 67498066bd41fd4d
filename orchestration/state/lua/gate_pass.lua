-- Hand the batch's free places to its first waiting runs: each is moved from the queue
-- to the gate here, so no place is given twice; the caller sends each its first
-- transition (one lost in a crash is sent by the sweep: the run is queued, not waiting).
-- KEYS[1]: the gate; KEYS[2]: the waiting runs. ARGV[1]: max_in_flight.
local free = tonumber(ARGV[1]) - redis.call('SCARD', KEYS[1])
if free <= 0 then return {} end
local next = redis.call('ZPOPMIN', KEYS[2], free)
local handed = {}
for i = 1, #next, 2 do
  redis.call('SADD', KEYS[1], next[i])
  handed[#handed + 1] = next[i]
end
return handed
