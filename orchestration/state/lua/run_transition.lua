-- Make transition `seq` (a step or the finish) exactly once; emit its events with it.
-- KEYS[2] ('' for none): the step's queue, onto which ARGV[6], the step's message, is
-- pushed when (and only when) this script makes the transition.
local run, events, batch, batch_done = KEYS[1], KEYS[3], KEYS[4], KEYS[5]
local open = KEYS[6]  -- runs in flight
local moved = KEYS[7]  -- unfinished runs by when they last moved (the sweep reads it)
-- KEYS[8..13] (a finish in a batch): the batch's other keys, given the finished TTL with
-- its last run ('' for none); KEYS[13] is its gate (max_in_flight), whose place the run
-- gives back here. KEYS[14..]: the run's keys, and its budget scope's.
-- One read and one write of the run record: the record's `moved_at` says when the run
-- last moved; the sweep's index is re-scored from it only when the sweep looks (see
-- RunStore.stale_runs), not here on every transition.
local st = redis.call('HMGET', run, 'status', 'seq', 'started_at', 'counted')
local status = st[1]
if not status then return -1 end
local FINISHED = {{FINISHED_STATUSES}}
if FINISHED[status] then return -2 end
local seq = tonumber(st[2] or '0')
if seq ~= tonumber(ARGV[1]) then return 0 end
local now = ARGV[3]
local set = {'seq', seq + 1, 'moved_at', now}
if not st[3] then
  set[#set + 1] = 'started_at'
  set[#set + 1] = now
end
local function add(...)
  for _, v in ipairs({...}) do set[#set + 1] = v end
end
if ARGV[2] == 'step' then
  -- The step's input goes in the record (``in:<step>``): its begin script reads it with
  -- the record, and the finish drops it (ARGV[12]). ARGV[12] of a step: JSON object of
  -- more record fields to set (the outcome of the step before, ``o:<step>``).
  add('status', 'running', 'current_step', ARGV[4], 'in:' .. ARGV[4], ARGV[5])
  for field, value in pairs(cjson.decode(ARGV[12])) do add(field, value) end
  redis.call('HSET', run, unpack(set))
  if KEYS[2] ~= '' then redis.call('LPUSH', KEYS[2], ARGV[6]) end
else
  local final = ARGV[4]
  add('status', final, 'reason', ARGV[5], 'error', ARGV[6], 'finished_at', now, 'usage', ARGV[7])
  redis.call('HSET', run, unpack(set))
  redis.call('ZREM', open, ARGV[9])
  redis.call('ZREM', moved, ARGV[9])
  if KEYS[13] ~= '' then redis.call('SREM', KEYS[13], ARGV[9]) end
  local total = batch ~= '' and redis.call('HGET', batch, 'total')
  if total then
    local done = redis.call('HINCRBY', batch, 'done', 1)
    redis.call('HINCRBY', batch, 'status:' .. final, 1)
    -- A zero is not added: one command less, and Lua would write -0 for some. A run
    -- re-opened after a cancel adds what it spent since: the batch already has the rest.
    local u = cjson.decode(ARGV[7])
    local c = st[4] and cjson.decode(st[4]) or {}
    local function spent(t)
      return tonumber(t['usd']) or 0,
        (tonumber(t['input_tokens']) or 0) + (tonumber(t['output_tokens']) or 0),
        tonumber(t['calls']) or 0
    end
    local usd, tokens, calls = spent(u)
    local usd0, tokens0, calls0 = spent(c)
    usd, tokens, calls = usd - usd0, tokens - tokens0, calls - calls0
    if usd ~= 0 then redis.call('HINCRBYFLOAT', batch, 'usd', usd) end
    if tokens ~= 0 then redis.call('HINCRBY', batch, 'tokens', tokens) end
    if calls ~= 0 then redis.call('HINCRBY', batch, 'calls', calls) end
    redis.call('XADD', batch_done, '*', 'run', ARGV[9], 'status', final)
    if done >= tonumber(total) then
      redis.call('EXPIRE', batch, ARGV[8])
      redis.call('EXPIRE', batch_done, ARGV[8])
      for i = 8, 13 do
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
-- ARGV[12] of a finish: JSON list of the record's fields it drops (the steps' outcomes
-- and inputs, which only the coordinator and the steps read while the run moves).
-- ARGV[13..]: the events.
local once, flags = {}, cjson.decode(ARGV[10])
for n, flag in ipairs(flags) do once[flag[1]] = {KEYS[#KEYS - #flags + n], flag[2]} end
for i = 13, #ARGV do
  local flag = once[i - 12]
  if not flag or redis.call('HSETNX', flag[1], flag[2], '1') == 1 then
    redis.call('XADD', events, '*', 'e', ARGV[i])
  end
end
if ARGV[2] ~= 'step' then
  local ttl, forget = tonumber(ARGV[8]), tonumber(ARGV[11])
  local drop = cjson.decode(ARGV[12])
  if #drop > 0 then redis.call('HDEL', run, unpack(drop)) end
  -- A stream's first node is allocated for 4 kB (stream-node-max-bytes) whatever it
  -- holds; the finished run's events stay as they are: a stream loaded from its own dump
  -- holds just what its entries need.
  local dump = redis.call('DUMP', events)
  if dump then redis.call('RESTORE', events, 0, dump, 'REPLACE') end
  local last = #KEYS - #flags
  for i = 14, last - forget do redis.call('EXPIRE', KEYS[i], ttl) end
  for i = last - forget + 1, last do redis.call('DEL', KEYS[i]) end
end
return 1
