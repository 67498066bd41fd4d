-- Make transition `seq` (a step or the finish) exactly once; emit its events with it.
local run, inputs, events, batch, batch_done = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local open = KEYS[6]  -- runs in flight
local moved = KEYS[7]  -- unfinished runs by when they last moved (the sweep reads it)
-- KEYS[8..12] (a finish in a batch): the batch's other keys, given the finished TTL with
-- its last run ('' for none). KEYS[13..]: the run's keys, and its budget scope's.
local status = redis.call('HGET', run, 'status')
if not status then return -1 end
local FINISHED = {{FINISHED_STATUSES}}
if FINISHED[status] then return -2 end
local seq = tonumber(redis.call('HGET', run, 'seq') or '0')
if seq ~= tonumber(ARGV[1]) then return 0 end
local now = ARGV[3]
redis.call('HSET', run, 'seq', seq + 1)
if redis.call('HEXISTS', run, 'started_at') == 0 then
  redis.call('HSET', run, 'started_at', now)
end
if ARGV[2] == 'step' then
  redis.call('HSET', inputs, ARGV[4], ARGV[5])
  redis.call('HSET', run, 'status', 'running', 'current_step', ARGV[4])
  redis.call('ZADD', moved, now, redis.call('HGET', run, 'run_id'))
else
  local final = ARGV[4]
  redis.call('HSET', run, 'status', final, 'reason', ARGV[5], 'error', ARGV[6],
             'finished_at', now, 'usage', ARGV[7])
  redis.call('ZREM', open, ARGV[9])
  redis.call('ZREM', moved, ARGV[9])
  if batch ~= '' and redis.call('EXISTS', batch) == 1 then
    redis.call('HINCRBY', batch, 'done', 1)
    redis.call('HINCRBY', batch, 'status:' .. final, 1)
    local u = cjson.decode(ARGV[7])
    redis.call('HINCRBYFLOAT', batch, 'usd', u['usd'] or 0)
    redis.call('HINCRBY', batch, 'tokens', (u['input_tokens'] or 0) + (u['output_tokens'] or 0))
    redis.call('HINCRBY', batch, 'calls', u['calls'] or 0)
    redis.call('XADD', batch_done, '*', 'run', ARGV[9], 'status', final)
    local b = redis.call('HMGET', batch, 'done', 'total')
    if tonumber(b[1]) >= (tonumber(b[2]) or math.huge) then
      redis.call('EXPIRE', batch, ARGV[8])
      redis.call('EXPIRE', batch_done, ARGV[8])
      for i = 8, 12 do
        if KEYS[i] ~= '' then redis.call('EXPIRE', KEYS[i], ARGV[8]) end
      end
    end
  end
end
-- ARGV[10]: the one-time events among the events (JSON [[event number, flag field]...]);
-- the last #once KEYS are their flags' hashes, in that order. Such an event is emitted
-- only by the transition that sets its flag, here, with the transition itself.
-- ARGV[11]: how many KEYS before the flags' hashes a finish deletes (what nothing reads
-- once the run is over: step inputs, the run's own conversations); the run's keys before
-- them get the finished-run TTL.
local once, flags = {}, cjson.decode(ARGV[10])
for n, flag in ipairs(flags) do once[flag[1]] = {KEYS[#KEYS - #flags + n], flag[2]} end
for i = 12, #ARGV do
  local flag = once[i - 11]
  if not flag or redis.call('HSETNX', flag[1], flag[2], '1') == 1 then
    redis.call('XADD', events, '*', 'e', ARGV[i])
  end
end
if ARGV[2] ~= 'step' then
  local ttl, forget = tonumber(ARGV[8]), tonumber(ARGV[11])
  local last = #KEYS - #flags
  for i = 13, last - forget do redis.call('EXPIRE', KEYS[i], ttl) end
  for i = last - forget + 1, last do redis.call('DEL', KEYS[i]) end
end
return 1
