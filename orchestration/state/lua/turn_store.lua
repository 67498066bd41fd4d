-- Store one turn of an agent run that asked for tool calls, once: KEYS[1] the run's turns
-- hash, KEYS[2] the step's claim, KEYS[3] the run's events. ARGV[1] the turn's field
-- (``<step>|t<n>``), ARGV[2] its JSON, ARGV[3] how many calls it asked for, ARGV[4] the
-- claim of the delivery storing it (let go here: the next turn is another delivery's),
-- ARGV[5..] the turn's events (one per tool call), added when this store is the first.
-- Returns 1 when this store stored the turn, 0 when one was stored before.
local turns, claim, events = KEYS[1], KEYS[2], KEYS[3]
local stored = redis.call('HSETNX', turns, ARGV[1], ARGV[2])
if stored == 1 then
  redis.call('HSET', turns, ARGV[1] .. '|left', ARGV[3])
  for i = 5, #ARGV do redis.call('XADD', events, '*', 'e', ARGV[i]) end
end
if redis.call('GET', claim) == ARGV[4] then redis.call('DEL', claim) end
return stored
