-- A sliding log per (provider, model): one sorted-set member "<seq>:<tokens>" per granted
-- request, scored by its server time in microseconds (integers, exact in a double), plus
-- a running token sum. A request goes when, counting it, the last window holds at most
-- rpm requests and tpm tokens; otherwise the reply is how long until enough old grants
-- leave the window. Unlike GCRA with a full burst, no window ever holds more than rpm.
-- KEYS: log, token sum hash, pause. ARGV: rpm (-1: off), tpm (-1: off), tokens, window_us.
-- Returns {wait_us, server_now_us}.
local log, state, pause = KEYS[1], KEYS[2], KEYS[3]
local rpm, tpm = tonumber(ARGV[1]), tonumber(ARGV[2])
local tokens, window = tonumber(ARGV[3]), tonumber(ARGV[4])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local paused = redis.call('PTTL', pause)
if paused > 0 then return {paused * 1000, now} end
if rpm < 0 and tpm < 0 then return {0, now} end
local horizon = now - window
local old = redis.call('ZRANGEBYSCORE', log, '-inf', horizon)
if #old > 0 then
  local freed = 0
  for _, m in ipairs(old) do freed = freed + tonumber(string.match(m, ':(%d+)$')) end
  if freed > 0 then redis.call('HINCRBY', state, 'tokens', -freed) end
  redis.call('ZREMRANGEBYSCORE', log, '-inf', horizon)
end
local wait = 0
local count = redis.call('ZCARD', log)
if rpm >= 0 and count >= rpm then
  -- the oldest count - rpm + 1 grants must leave the window first
  local e = redis.call('ZRANGE', log, count - rpm, count - rpm, 'WITHSCORES')
  wait = tonumber(e[2]) + window - now
end
if tpm >= 0 then
  local need = tonumber(redis.call('HGET', state, 'tokens') or '0') + tokens - tpm
  if need > 0 then
    local freed, start, w = 0, 0, window
    while freed < need do
      local batch = redis.call('ZRANGE', log, start, start + 99, 'WITHSCORES')
      if #batch == 0 then break end
      for j = 1, #batch, 2 do
        freed = freed + tonumber(string.match(batch[j], ':(%d+)$'))
        if freed >= need then
          w = tonumber(batch[j + 1]) + window - now
          break
        end
      end
      start = start + 100
    end
    if w > wait then wait = w end
  end
end
if wait > 0 then return {wait, now} end
local seq = redis.call('HINCRBY', state, 'seq', 1)
redis.call('ZADD', log, now, seq .. ':' .. ARGV[3])
redis.call('HINCRBY', state, 'tokens', ARGV[3])
local idle_ms = math.floor(window / 1000) + 1000
redis.call('PEXPIRE', log, idle_ms)
redis.call('PEXPIRE', state, idle_ms)
return {0, now}
