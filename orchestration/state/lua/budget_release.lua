--! include budget_common
-- KEYS: (budget, leases, holds) per scope. ARGV: step_id, scope count.
local released = 0
for i = 0, tonumber(ARGV[2]) - 1 do
  released = released + release_one(KEYS[3 * i + 1], KEYS[3 * i + 2], KEYS[3 * i + 3], ARGV[1])
end
return released
