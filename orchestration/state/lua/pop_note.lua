#!lua
-- A broker pop and its note as unacknowledged in one step (orchestration/state/broker.py):
-- up to COUNT messages from the first non-empty queue key (one LMPOP, as the plain pop's
-- BLMPOP), each noted in the unacknowledged set, so no message is ever popped and not
-- noted. The acks gathered since the last write go first. The shebang (no allow-oom
-- flag) has Redis refuse the whole script while it is at maxmemory: nothing is popped.
-- KEYS: the unacknowledged set, then the queue keys in pop order.
-- ARGV: count, score (the worker's clock), the number of acked members, those members,
-- then for each queue key the JSON text of its queue's name.
-- Returns false when every queue is empty, else {the queue key's place (1 = first),
-- its messages as LMPOP ... RIGHT returns them}.
local set = KEYS[1]
local count, score, acked = tonumber(ARGV[1]), ARGV[2], tonumber(ARGV[3])
for first = 4, 3 + acked, 500 do
  redis.call('ZREM', set, unpack(ARGV, first, math.min(first + 499, 3 + acked)))
end
local args = {#KEYS - 1}
for k = 2, #KEYS do args[k] = KEYS[k] end
args[#KEYS + 1], args[#KEYS + 2], args[#KEYS + 3] = 'RIGHT', 'COUNT', count
local popped = redis.call('LMPOP', unpack(args))
if not popped then return false end
local place = 1
while KEYS[place + 1] ~= popped[1] do place = place + 1 end
local queue = ARGV[3 + acked + place]
local notes = {}
for j, text in ipairs(popped[2]) do
  notes[2 * j - 1] = score
  notes[2 * j] = '[' .. text .. ', "", ' .. queue .. ']'
end
redis.call('ZADD', set, unpack(notes))
return {place, popped[2]}
