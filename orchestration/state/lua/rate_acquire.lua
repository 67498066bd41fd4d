-- GCRA per rate limit (provider, model, endpoint): requests and tokens as smooth rates.
-- The state hash keeps each dimension's theoretical arrival time (tat_r, tat_t, server
-- microseconds), what the vendor's headers taught (rpm, tpm, learned_at) and a bucket
-- pause (until). A request books the earliest slot both rates allow, if it is no more
-- than the horizon ahead, and holds a permit until its call is settled or given back
-- (rate_settle.lua); a permit whose worker died lapses at its expiry (its slot stays spent).
-- KEYS: state, permits (zset member -> expiry), fleet pause.
-- ARGV: configured rpm (-1: none), configured tpm (-1: none), tokens, window_us, burst_us,
--       horizon_us, learn (1: the vendor's headers teach the limit), probe rpm, permit
--       id, hold_us (how long past its slot a permit lives).
-- Returns {wait_us, server_now_us, permit, rpm, tpm}: a permit ('' for none) booked for
-- now + wait_us; or no permit and the wait before asking again. rpm/tpm: the limits
-- applied (-1: none).
local state, permits, pause = KEYS[1], KEYS[2], KEYS[3]
local rpm, tpm = tonumber(ARGV[1]), tonumber(ARGV[2])
local tokens, window = tonumber(ARGV[3]), tonumber(ARGV[4])
local burst, horizon = tonumber(ARGV[5]), tonumber(ARGV[6])
local learn, probe, hold = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[10])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local paused = redis.call('PTTL', pause)
if paused > 0 then return {paused * 1000, now, '', -1, -1} end
redis.call('ZREMRANGEBYSCORE', permits, '-inf', now)
local s = redis.call('HMGET', state, 'rpm', 'tpm', 'learned_at', 'tat_r', 'tat_t', 'until')
local lrpm, ltpm = tonumber(s[1]), tonumber(s[2])
if lrpm and (rpm < 0 or lrpm < rpm) then rpm = lrpm end
if ltpm and (tpm < 0 or ltpm < tpm) then tpm = ltpm end
if rpm < 0 and tpm < 0 then
  if learn == 1 and not s[3] then
    rpm, horizon = probe, 0 -- the vendor has not answered yet: a few calls, none booked ahead
  else
    return {0, now, '', -1, -1}
  end
end
local slot = math.max(now, tonumber(s[6]) or 0)
local tat_r, tat_t = tonumber(s[4]) or 0, tonumber(s[5]) or 0
local ir, it = 0, 0
if rpm > 0 then
  ir = window / rpm
  slot = math.max(slot, math.max(tat_r, now) + ir - math.max(burst, ir))
end
if tpm > 0 and tokens > 0 then
  it = window / tpm
  local need = tokens * it
  slot = math.max(slot, math.max(tat_t, now) + need - math.max(burst, need))
end
if slot - now > horizon then return {slot - now - horizon, now, '', rpm, tpm} end
if ir > 0 then
  redis.call('HSET', state, 'tat_r', string.format('%.0f', math.max(tat_r, slot) + ir))
end
if it > 0 then
  redis.call('HSET', state, 'tat_t', string.format('%.0f', math.max(tat_t, slot) + tokens * it))
end
-- what the permit added, so a give-back or settlement takes back exactly that
local member = string.format('%s:%.0f:%d:%.3f', ARGV[9], ir, tokens, it)
redis.call('ZADD', permits, string.format('%.0f', slot + hold), member)
redis.call('PEXPIRE', state, 86400000)
redis.call('PEXPIRE', permits, math.floor((slot - now + hold) / 1000) + 1000)
return {slot - now, now, member, rpm, tpm}
