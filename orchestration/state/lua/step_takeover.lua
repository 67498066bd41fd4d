-- Take over a step whose claim names a dead process: the claim is still ARGV[1] (the
-- holder the begin script saw) and that process's liveness key is gone. Only then the
-- claim becomes ARGV[2]'s, for ARGV[3] seconds.
-- KEYS: the claim, the holder's process liveness key.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
return 1
