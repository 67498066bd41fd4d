--! include budget_common
-- A worker takes a step: read its input, or learn it is done / cancelled / someone's else.
-- Taking it also notes that the step reached a worker (``dispatched``, read by a
-- redelivered coordinator) and reads the fleet-wide pause of the step's model (unless the
-- worker knows it lately: ARGV[6..]) and, when the input names one (see
-- ``RunStore.record_step``), the role's conversation history, so a step needs no other
-- read before its call.
-- The claim is one delivery's (ARGV[2], new for every delivery): another delivery of the
-- same step — a duplicate, or a redelivery while the call is in flight — finds it 'busy'.
-- A delivery that re-scheduled itself hands its claim on to the retry (ARGV[5], the
-- claim it held), so the retry takes it over at once. 'busy' names the holder (a claim
-- whose process is dead is taken over by ``step_takeover``).
local run, inputs, steps, claim, events = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
-- One read of the record: its input field holds the step's input (``in:<step>``, set by
-- the transition; a run recorded before inputs moved there has it in the inputs hash);
-- the step is stored when the steps hash holds it (the record's ``o:<step>``, written by
-- the transition after it, says so too).
-- ARGV[6] = n, ARGV[7..6+n]: pause keys whose read may be skipped (the worker learned
-- them lately, see ``orchestration.services.pauses``): the reply's pause is then false (nil:
-- not read) instead of the key's PTTL.
-- ARGV[7+n..]: the run's earlier steps of this role, oldest first: their inputs are read
-- with the record too, for a conversation that is the run's own (``own`` below).
local skip, first_earlier = {}, 7 + tonumber(ARGV[6])
for i = 7, first_earlier - 1 do skip[ARGV[i]] = true end
local fields = {'status', 'cancelled', 'spec_id', 'user_id', 'budget_scopes', 'current_step',
                'seq', 'dispatched', 'o:' .. ARGV[1], 'in:' .. ARGV[1]}
for i = first_earlier, #ARGV do fields[#fields + 1] = 'in:' .. ARGV[i] end
local st = redis.call('HMGET', run, unpack(fields))
if not st[1] then return {'gone'} end
-- A delivery that ends here lets go of the claim it, or the delivery that re-scheduled
-- it, held: else a resumed run's step would find it 'busy' for a whole lease.
local function release()
  local held = redis.call('GET', claim)
  if held and (held == ARGV[2] or held == ARGV[5]) then redis.call('DEL', claim) end
end
if st[1] ~= 'running' then release() return {'stop'} end
if st[9] or redis.call('HEXISTS', steps, ARGV[1]) == 1 then return {'done'} end
if st[2] == '1' then release() return {'cancelled'} end
local input = st[10] or redis.call('HGET', inputs, ARGV[1])
if not input then return {'gone'} end
-- Claim it if free (one command); a claim already there is this delivery's own (a retry,
-- or the one that re-scheduled it: taken over) or another's ('busy').
local holder = redis.call('SET', claim, ARGV[2], 'NX', 'GET', 'EX', ARGV[3])
if holder then
  if holder ~= ARGV[2] and holder ~= ARGV[5] then return {'busy', holder} end
  redis.call('SET', claim, ARGV[2], 'EX', ARGV[3])
end
-- The step's started event once: when it first reaches a worker (not on a retry, nor on
-- a takeover from a delivery that died).
local current = st[6] == ARGV[1]
if not holder and not (current and st[8] == st[7]) then
  redis.call('XADD', events, '*', 'e', ARGV[4])
end
if current then redis.call('HSET', run, 'dispatched', st[7]) end
local meta = cjson.decode(input)
-- Whether any of the run's budget scopes has a limit (1) or none has (0: the call needs
-- no hold; its usage is only counted, when it is stored). The input names the scopes'
-- budget hashes (``budgets``); an input without them, with scopes, counts as limited.
local scoped = st[5] and st[5] ~= ''
local any_limit = scoped and 1 or 0
if scoped and type(meta['budgets']) == 'table' then
  any_limit = 0
  for _, bkey in ipairs(meta['budgets']) do
    if limited(bkey) then
      any_limit = 1
      break
    end
  end
end
local paused = false
if not skip[meta['pause']] then paused = redis.call('PTTL', meta['pause']) end
local out = {'go', input, st[3], st[4] or '', st[5] or '', paused, any_limit}
local turns = tonumber(meta['turns']) or 0
if type(meta['conv']) == 'string' and turns > 0 then
  out[8] = 'h'
  local turn = redis.call('LRANGE', meta['conv'], -turns, -1)
  for i = 1, #turn do out[8 + i] = turn[i] end
elseif meta['own'] and turns > 0 then
  -- The run's own conversation: its last `turns` earlier steps of the role, each as its
  -- input and its stored result ('' where there is none).
  out[8] = 'o'
  local first = math.max(first_earlier, #ARGV - turns + 1)
  if first <= #ARGV then
    local got = redis.call('HMGET', steps, unpack(ARGV, first, #ARGV))
    for i = first, #ARGV do
      out[#out + 1] = ARGV[i]
      out[#out + 1] = st[11 + i - first_earlier] or ''
      out[#out + 1] = got[i - first + 1] or ''
    end
  end
end
return out
