-- Store a tool call's result once and count it: KEYS[1] the run's turns hash, KEYS[2] the
-- run's events. ARGV[1] the call's field (``<step>|t<n>|<i>``), ARGV[2] its result JSON,
-- ARGV[3] the turn's counter field (``<step>|t<n>|left``), ARGV[4] the result's event,
-- ARGV[5] the claim that ran it ('' when none was taken: an error stored for a lost call).
-- Returns the calls of the turn still without a result: the delivery that sees 0 hands
-- the run to the next turn (so does a redelivery that finds it 0: a copy is harmless).
local turns, events = KEYS[1], KEYS[2]
if redis.call('HSETNX', turns, ARGV[1], ARGV[2]) == 1 then
  redis.call('XADD', events, '*', 'e', ARGV[4])
  return redis.call('HINCRBY', turns, ARGV[3], -1)
end
return tonumber(redis.call('HGET', turns, ARGV[3]) or '0')
