-- A run of a batch with max_in_flight asks for a place before its first transition.
-- KEYS[1]: the batch's gate (set of runs holding a place); KEYS[2]: its waiting runs;
-- KEYS[3]: the sweep's index of unfinished runs; KEYS[4]: the batches with waiting runs.
-- ARGV[1]: the run; ARGV[2]: max_in_flight; ARGV[3]: its place in the queue if it waits;
-- ARGV[4]: the batch.
-- 1: it holds a place (already, or now); 0: it waits (queued once, however often asked),
-- out of the sweep's index: the sweep hands its batch's places on instead.
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 then return 1 end
if redis.call('SCARD', KEYS[1]) < tonumber(ARGV[2]) then
  redis.call('SADD', KEYS[1], ARGV[1])
  redis.call('ZREM', KEYS[2], ARGV[1])
  return 1
end
redis.call('ZADD', KEYS[2], 'NX', ARGV[3], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('SADD', KEYS[4], ARGV[4])
return 0
