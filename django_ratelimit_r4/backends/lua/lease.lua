-- lease.lua: permit leases ("lease": N) for the cycle rate limiter. The script is decide.lua + this file,
-- a script of its own (own SHA); it reads and writes the very keys and state format of ratelimiter.lua, so
-- leasing and non-leasing processes share one budget and every read ('s', quota) stays the shared truth.
--
-- KEYS[1]: the limiter's anchor ("<s> <ns>", when cycle 0 began); KEYS[2]: its state (or a client key's),
--   "<cycle> <permissions> <anchor>" as ratelimiter.lua writes it (absent or of another anchor: full).
-- ARGV: op 'l', permits, timeout (units), lease, limit_for_period, period (units), m (units per microsecond:
--   1000 for nanosecond limiters, 1 for microsecond ones), deadline (server microseconds, '' for none), then
--   now_s, now_ns of a caller on its own clock (absent: server TIME).
-- 'l' lease: with at least `permits` permissions left in the current cycle, takes
--   max(permits, min(lease, floor(left / 2) + 1)) of them (the batch shrinks as the budget nears empty, so
--   the last permits are spread over the processes asking); the caller spends `permits` now and keeps the
--   rest until the end of THIS cycle. Otherwise it is ratelimiter.lua's 'a' for `permits` (a reservation
--   within the timeout makes debt, a rejection changes nothing).
--   Reply: {taken, wait (>= 0 granted, -wait rejected), permissions left, reset, units to the next cycle,
--   cycle, anchor}; reset is ratelimiter.lua's 'q' figure (time to the next cycle while a permit is left,
--   else the wait for one).
-- With server time and an empty deadline the reply is {reply, {now_us}} (the client learns the server time);
-- with a deadline in the past the script changes nothing and answers the status LATE (no ghost charges).
-- The cycle comes from the anchor by ratelimiter.lua's exact slow path (cycle_of): one call per batch, so
-- the anchor cache of the per-request path is not needed.

local permits, timeout, lease = ARGV[2] + 0, ARGV[3] + 0, ARGV[4] + 0
local limit, period, m = ARGV[5] + 0, ARGV[6] + 0, ARGV[7] + 0
local now_s, now_ns, now_us, slack
if ARGV[9] then
  now_s, now_ns, slack = ARGV[9] + 0, ARGV[10] + 0, 3600000
else
  local t = redis.call('TIME')
  now_s, slack = t[1] + 0, 1
  now_us = now_s * 1000000 + t[2]
  now_ns = t[2] * 1000
  if ARGV[8] ~= '' and now_us > ARGV[8] + 0 then
    -- The caller has given up (its socket timeout passed): change nothing.
    return redis.status_reply('LATE')
  end
end
if ARGV[1] ~= 'l' then
  return redis.error_reply('lease.lua: unknown op ' .. tostring(ARGV[1]))
end

local anchor = redis.call('GET', KEYS[1])
if not anchor then
  -- First use by any process: cycle 0 starts now (as ratelimiter.lua).
  anchor = string.format('%.0f %.0f', now_s, now_ns)
  redis.call('SET', KEYS[1], anchor)
end
local s, ns = string.match(anchor, '^(%-?%d+) (%d+)$')
local es, ens = now_s - s, now_ns - ns
if ens < 0 then
  es = es - 1
  ens = ens + NS_PER_S
end
local current, offset
if m == 1 then
  current, offset = cycle_of(es, math.floor(ens / 1000), period, 6)
else
  current, offset = cycle_of(es, ens, period, 9)
end

local cycle, left = current, limit
local state = redis.call('GET', KEYS[2])
if state then
  local c, p, a = string.match(state, '^(%-?%d+) (%-?%d+) (.*)$')
  -- A state of another anchor, or from a later cycle (the server clock stepped back), is full.
  if a == anchor and c + 0 <= current then
    cycle, left = c + 0, p + 0
  end
end
left = refresh(cycle, left, current, limit)

local taken, wait = 0, 0
if left >= permits then
  taken = math.min(lease, math.floor(left / 2) + 1)
  if taken < permits then
    taken = permits
  end
  if taken > left then
    taken = left
  end
else
  wait = nanos_to_wait(left, permits, offset, period, limit)
  if timeout >= wait then
    taken = permits -- a reservation (debt), waited for by the caller: nothing is leased
  else
    wait = -wait
  end
end
if taken > 0 then
  left = left - taken
  if left >= limit then
    redis.call('DEL', KEYS[2])
  else
    -- Expires when lazily refreshed to full: after div_ceil(limit - left, limit) cycles from this one.
    local ms = math.ceil((div_ceil(limit - left, limit) * period - offset) / (1000 * m)) + slack
    redis.call('SET', KEYS[2], string.format('%d %d ', current, left) .. anchor, 'PX', math.min(ms, 1e15))
  end
end
local reset = period - offset
if left < 1 then
  reset = nanos_to_wait(left, 1, offset, period, limit)
end
local reply = {taken, wait, left, reset, period - offset, current, anchor}
if now_us and ARGV[8] == '' then
  return {reply, {now_us}}
end
return reply
