-- decide.lua: backends/base.py's pure decision, line by line, in Lua 5.1 (Redis scripting).
--
-- Precision. Lua numbers are IEEE doubles: integers are exact only below 2^53 (about 9.007e15). Time is
-- counted in a limiter's UNIT: nanoseconds for periods up to MAX_NS_PERIOD (~10.4 days), microseconds for
-- longer ones (the period must then be whole microseconds). Every value a decision touches is kept below
-- 2^53 units: on the fast path the client sends a base instant (the anchor plus K whole periods, computed
-- exactly in Python) so the time elapsed since it is small and one divmod gives (cycle, offset); on the slow
-- path the elapsed time is a pair (seconds, units within the second) turned into (cycle, offset) by exact
-- long division (cycle_of). Absolute microseconds since the epoch (~1.8e15) are exact, absolute
-- nanoseconds are not, so no absolute nanosecond value is ever formed.

local NS_PER_S = 1000000000
local EXACT = 9007199254740992 -- 2^53

-- Exact floor division with remainder for integers |a| < 2^53, b > 0 (a / b is rounded: correct it).
local function divmod(a, b)
  local q = math.floor(a / b)
  local r = a - q * b
  if r < 0 then
    q = q - 1
    r = r + b
  elseif r >= b then
    q = q + 1
    r = r - b
  end
  return q, r
end

-- base.div_ceil: Java's (x + y - 1) / y, truncating toward zero (0 for every x <= 0 with x > -y).
local function div_ceil(x, y)
  local n = x + y - 1
  if n >= 0 then
    return (divmod(n, y))
  end
  return -(divmod(-n, y))
end

-- base.refresh: min(permissions + elapsed_cycles * limit, limit). A product too large to be exact is still
-- larger than limit, so min() gives the exact answer.
local function refresh(cycle, permissions, current_cycle, limit)
  if current_cycle == cycle then
    return permissions
  end
  return math.min(permissions + (current_cycle - cycle) * limit, limit)
end

-- base.nanos_to_wait, with (current_cycle + 1) * period - now written as period - offset (offset = the time
-- since the current cycle began): same value, small numbers. In the limiter's unit.
local function nanos_to_wait(permissions, permits, offset, period, limit)
  if permissions >= permits then
    return 0
  end
  local to_next_cycle = period - offset
  return to_next_cycle + div_ceil(permits - (permissions + limit), limit) * period
end

-- (cycle, offset) of the instant elapsed_s seconds + elapsed_sub units after the anchor, for a period in
-- units where one second is 10^digits units: floor division by the period done digit by digit, so no
-- intermediate reaches 2^53 (needs period * 10 < 2^53).
local function cycle_of(elapsed_s, elapsed_sub, period, digits)
  local q, r = divmod(elapsed_s, period)
  for _ = 1, digits do
    local q2, r2 = divmod(r * 10, period)
    q = q * 10 + q2
    r = r2
  end
  local q3, r3 = divmod(r + elapsed_sub, period)
  return q + q3, r3
end

-- base.decide over (cycle, offset) instead of now: (new_cycle, new_permissions, wait, granted).
local function decide(cycle, permissions, permits, timeout, current_cycle, offset, period, limit)
  permissions = refresh(cycle, permissions, current_cycle, limit)
  local wait = nanos_to_wait(permissions, permits, offset, period, limit)
  local granted = timeout >= wait
  if granted then
    permissions = permissions - permits
  end
  return current_cycle, permissions, wait, granted
end
