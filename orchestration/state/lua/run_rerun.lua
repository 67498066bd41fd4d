-- Re-open an interrupted run (``resume --interrupted``) at the transition ARGV[2], if it is
-- still as the caller read it (interrupted, at transition ARGV[1]): drop the step that
-- stopped it (ARGV[3], '' for none) and note what the dropped attempts spent (ARGV[4],
-- the record's ``retried``). Every other stored step is kept. KEYS[5..]: the run's other
-- keys, its steps first (see runs.py, _reopen_keys).
local run, batch, events, open, steps = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local st = redis.call('HMGET', run, 'status', 'seq', 'run_id', 'created_at', 'usage')
if not st[1] then return {'gone'} end
if st[1] ~= 'interrupted' or st[2] ~= ARGV[1] then return {'moved'} end
local seq = tonumber(ARGV[2])
redis.call('HSET', run, 'status', seq == 0 and 'queued' or 'running', 'seq', seq,
           'cancelled', '0', 'reason', '', 'error', '', 'finished_at', '', 'retried', ARGV[4])
if ARGV[3] ~= '' then
  redis.call('HDEL', steps, ARGV[3])
  redis.call('HDEL', run, 'o:' .. ARGV[3])
end
redis.call('PERSIST', run)
for i = 5, #KEYS do redis.call('PERSIST', KEYS[i]) end
redis.call('ZADD', open, tonumber(st[4] or '0') or 0, st[3])
if batch ~= '' and redis.call('EXISTS', batch) == 1 then
  redis.call('HINCRBY', batch, 'done', -1)
  redis.call('HINCRBY', batch, 'status:interrupted', -1)
  -- The batch keeps what the run spent (a batch's spend never goes down); its finish adds
  -- only what it spends from here (``counted``, see run_transition.lua).
  redis.call('HSET', run, 'counted', st[5] or '{}')
end
redis.call('XADD', events, '*', 'e', ARGV[5])
return {'running', tostring(seq)}
