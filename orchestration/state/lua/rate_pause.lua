-- KEYS: pause. ARGV: milliseconds. Keeps the longer of the current and the new pause.
local cur = redis.call('PTTL', KEYS[1])
if cur < tonumber(ARGV[1]) then
  redis.call('SET', KEYS[1], '1', 'PX', ARGV[1])
  return tonumber(ARGV[1])
end
return cur
