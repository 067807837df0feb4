-- decide.lua: backends/base.py's pure decision, line by line, in Lua 5.1 (Redis scripting).
--
-- Precision. Lua numbers are IEEE doubles: integers are exact only below 2^53 (about 9.007e15), and a
-- nanosecond Unix timestamp (about 1.7e18) is NOT. So no absolute nanosecond value is ever formed here:
-- time is a pair (seconds, nanoseconds within the second), and the elapsed time since the anchor is turned
-- into (cycle, offset within the cycle) by exact long division (cycle_of). Every value the decision then
-- touches is small: offsets and waits are below the period (or a few periods), cycles are counts.
-- Limits: limit_refresh_period * 10 < 2^53 (periods up to ~10 days) and cycle numbers below 2^53 (e.g.
-- 104 days of 1 ns cycles, 142 years of 500 ns cycles); redis.py checks the first when a limiter is built.

local NS_PER_S = 1000000000

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

-- base.nanos_to_wait, with (current_cycle + 1) * period_ns - now_ns written as period_ns - offset_ns
-- (offset_ns = now_ns - current_cycle * period_ns, the time since the current cycle began): same value,
-- small numbers.
local function nanos_to_wait(permissions, permits, offset_ns, period_ns, limit)
  if permissions >= permits then
    return 0
  end
  local to_next_cycle = period_ns - offset_ns
  return to_next_cycle + div_ceil(permits - (permissions + limit), limit) * period_ns
end

-- (cycle, offset_ns) of the instant elapsed_s * 1e9 + elapsed_ns after the anchor: floor division by the
-- period done digit by digit (nine times ten = 1e9), so no intermediate reaches 2^53.
local function cycle_of(elapsed_s, elapsed_ns, period_ns)
  local q, r = divmod(elapsed_s, period_ns)
  for _ = 1, 9 do
    local q2, r2 = divmod(r * 10, period_ns)
    q = q * 10 + q2
    r = r2
  end
  local q3, r3 = divmod(r + elapsed_ns, period_ns)
  return q + q3, r3
end

-- base.decide over (cycle, offset) instead of now_ns: (new_cycle, new_permissions, wait, granted).
local function decide(cycle, permissions, permits, timeout_ns, current_cycle, offset_ns, period_ns, limit)
  permissions = refresh(cycle, permissions, current_cycle, limit)
  local wait = nanos_to_wait(permissions, permits, offset_ns, period_ns, limit)
  local granted = timeout_ns >= wait
  if granted then
    permissions = permissions - permits
  end
  return current_cycle, permissions, wait, granted
end
