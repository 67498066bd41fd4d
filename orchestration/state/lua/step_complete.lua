--! include budget_common
-- Store a step's result once; a second store of the same step is refused. The first
-- store also appends the turn to the role's
-- conversation (KEYS[5], '' for none: ARGV[6] turn, ARGV[7] turns kept, ARGV[8] '' unless
-- the conversation's TTL, ARGV[12], is renewed, ARGV[9] characters kept ('' for no
-- bound), ARGV[10] how this run's turns begin).
-- Past the character bound the oldest turns are dropped down to *half* of it, so the kept
-- prefix stays the same for the next calls (the vendors' prompt caches match prefixes);
-- the run's own turns are never dropped. ARGV[4] is not read (the run's record is left
-- alone: the next transition notes the step's outcome in it).
-- KEYS[4] ('' for none): the coordinator's queue, onto which ARGV[5], the message handing
-- the run to its coordinator, is pushed whether this store or an earlier one stored the
-- step (the transition it asks for is made once whatever the messages).
local steps, claim, events, queue, conv = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local stored = redis.call('HSETNX', steps, ARGV[1], ARGV[2])
if stored == 1 then
  redis.call('XADD', events, '*', 'e', ARGV[3])
  if conv ~= '' then
    local kept = tonumber(ARGV[7])
    local n = redis.call('RPUSH', conv, ARGV[6])
    if n > kept then redis.call('LTRIM', conv, -kept, -1) end
    -- The TTL is set when the list is new and renewed by a run's first turns ('' else).
    if n == 1 or ARGV[8] ~= '' then redis.call('EXPIRE', conv, ARGV[12]) end
    local max_chars = tonumber(ARGV[9])
    if max_chars then
      local turns = redis.call('LRANGE', conv, 0, -1)
      local total = 0
      for _, t in ipairs(turns) do total = total + #t end
      if total > max_chars then
        local drop, own = 0, ARGV[10]
        for _, t in ipairs(turns) do
          if total <= max_chars / 2 or string.sub(t, 1, #own) == own then break end
          total = total - #t
          drop = drop + 1
        end
        if drop > 0 then redis.call('LTRIM', conv, drop, -1) end
      end
    end
  end
end
-- ARGV[11] (or ''): the call's usage ("input,output,usd_micros,calls"), added to the
-- spent counters of the budget hashes KEYS[6..] (scopes without limits: the call held
-- nothing). Counted once per delivery: when this result is the one stored, or when
-- another delivery's is (that call was made and billed too) — not when this delivery's
-- own store is sent again after a lost reply.
if ARGV[11] and ARGV[11] ~= '' then
  if stored == 1 or redis.call('HGET', steps, ARGV[1]) ~= ARGV[2] then
    local parts = split(ARGV[11])
    for i = 6, #KEYS do add(KEYS[i], 'spent:', parts, '') end
  end
end
-- The step is stored (now or before): every claim on it is moot, whoever holds it (a
-- delivery that begins it finds it done before it looks at claims).
redis.call('DEL', claim)
if queue ~= '' then redis.call('LPUSH', queue, ARGV[5]) end
return stored
