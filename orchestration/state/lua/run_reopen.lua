-- Re-open a cancelled run (or find where an unfinished one stands) for `resume`.
local run, batch, events, open = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local st = redis.call('HMGET', run, 'status', 'seq', 'current_step', 'dispatched', 'run_id')
if not st[1] then return {'gone'} end
if st[1] == 'cancelled' then
  local seq = tonumber(st[2]) - 1
  redis.call('HSET', run, 'status', seq == 0 and 'queued' or 'running', 'seq', seq,
             'cancelled', '0', 'reason', '', 'finished_at', '')
  redis.call('PERSIST', run)
  for i = 5, #KEYS do redis.call('PERSIST', KEYS[i]) end
  local created = tonumber(redis.call('HGET', run, 'created_at') or '0') or 0
  if st[5] then redis.call('ZADD', open, created, st[5]) end
  if batch ~= '' and redis.call('EXISTS', batch) == 1 then
    redis.call('HINCRBY', batch, 'done', -1)
    redis.call('HINCRBY', batch, 'status:cancelled', -1)
    -- The batch keeps the run's spend so far (a batch's spend never goes down); the
    -- run's finish adds only what it spends from here (`counted`, see run_transition.lua).
    redis.call('HSET', run, 'counted', redis.call('HGET', run, 'usage') or '{}')
  end
  redis.call('XADD', events, '*', 'e', ARGV[1])
  return {'running', tostring(seq), st[3] or ''}
end
if st[1] == 'queued' or st[1] == 'running' then
  return {st[1], st[2] or '0', st[3] or ''}
end
return {'finished'}
