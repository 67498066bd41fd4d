-- A tool task takes its call: KEYS[1] the run's turns hash, ARGV[1] the call's field
-- (``<step>|t<n>|<i>``), ARGV[2] this delivery's claim. 'done' when its result is stored;
-- 'go' when the call is free (now this delivery's) or already this delivery's; else
-- 'held' and the holder (a delivery that may still be running it, or died running it).
local turns, call = KEYS[1], ARGV[1]
if redis.call('HEXISTS', turns, call) == 1 then return {'done'} end
local holder = redis.call('HGET', turns, call .. '|run')
if not holder or holder == ARGV[2] then
  redis.call('HSET', turns, call .. '|run', ARGV[2])
  return {'go'}
end
return {'held', holder}
