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
    -- The run's spend so far is counted again, in full, when it finishes again.
    local ok, u = pcall(cjson.decode, redis.call('HGET', run, 'usage') or '{}')
    if ok and type(u) == 'table' then
      -- A zero is skipped: Lua writes -0 as "-0", which HINCRBY refuses as not an integer.
      local usd = tonumber(u['usd']) or 0
      local tokens = (tonumber(u['input_tokens']) or 0) + (tonumber(u['output_tokens']) or 0)
      local calls = tonumber(u['calls']) or 0
      if usd ~= 0 then redis.call('HINCRBYFLOAT', batch, 'usd', -usd) end
      if tokens ~= 0 then redis.call('HINCRBY', batch, 'tokens', -tokens) end
      if calls ~= 0 then redis.call('HINCRBY', batch, 'calls', -calls) end
    end
  end
  redis.call('XADD', events, '*', 'e', ARGV[1])
  return {'running', tostring(seq), st[3] or ''}
end
if st[1] == 'queued' or st[1] == 'running' then
  return {st[1], st[2] or '0', st[3] or ''}
end
return {'finished'}
