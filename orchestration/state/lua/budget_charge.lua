--! include budget_common
-- Charge a hold now: its call's worker process is dead (the step was taken over), so its
-- outcome is unknown, as for a hold whose lease ran out.
-- KEYS: (budget, leases, holds) per scope. ARGV: step_id, scope count.
local charged = 0
for i = 0, tonumber(ARGV[2]) - 1 do
  charged = charged + charge_one(KEYS[3 * i + 1], KEYS[3 * i + 2], KEYS[3 * i + 3], ARGV[1])
end
return charged
