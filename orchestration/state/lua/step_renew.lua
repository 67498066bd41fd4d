-- Renew a step's claim for a call in flight, if its claimant still holds it.
-- KEYS: the claim. ARGV: claimant, lease (s).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('EXPIRE', KEYS[1], ARGV[2])
end
return 0
