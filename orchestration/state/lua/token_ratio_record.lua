-- One call's bytes-per-token ratio (ARGV[1]) for a model's hash (KEYS[1]): count the
-- sample, keep the smallest ratio seen.
redis.call('HINCRBY', KEYS[1], 'samples', 1)
local seen = redis.call('HGET', KEYS[1], 'min')
if not seen or tonumber(ARGV[1]) < tonumber(seen) then
  redis.call('HSET', KEYS[1], 'min', ARGV[1])
end
return 1
