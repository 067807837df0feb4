-- gcra.lua: the Redis GCRA script (algorithm "gcra"), backends/algorithms.py's gcra_decide in Lua 5.1.
-- A script of its own (own SHA): the cycle script (fast.lua + decide.lua + ratelimiter.lua) is untouched.
--
-- State per limiter (or client key), KEYS[i]: "<tat_s> <tat_u> <scale>", the theoretical arrival time as
-- whole seconds plus units within the second, a unit being 1/scale ns (scale = limit / gcd(limit, period),
-- so the emission interval `step` is a whole number of units). A limiter of a period over ~10.4 days counts
-- time in whole microseconds instead (a unit is 1/scale us, the units within the second fewer than 10^6 *
-- scale; its scale argument is sent negated), as the cycle and sliding-window scripts do, so a monthly limit
-- stays exact; its answers are in ns all the same. Absent or in the past means full; the key
-- expires once its tat has passed, so an idle limiter costs nothing. Every value the script forms (tat - now,
-- units within a second) stays below 2^53, so Lua's doubles are exact (the client checks the bound once).
--
-- ARGV: op, permits, timeout (ns), n, then per limiter i four arguments at j = 5 + 4 * (i - 1): step (units),
--   span (burst * step), scale (sent as -scale when counted in microseconds), period (ns); then the deadline
--   (server microseconds, '' for none); then
--   now_s, now_ns of a caller on its own clock (absent: server TIME).
-- ops:
--   "a" acquire (n = 1) -> wait >= 0 granted (tat moved), -wait rejected (nothing changed).
--   "q" acquire and quota (n = 1) -> {"a"'s reply, remaining, reset ns} read right after the decision.
--   "s" state   (n = 1) -> {0, remaining, wait for 1 permit, reset ns} (gcra_quota's figures); no write.
--   "d" drain   (n = 1) -> permits taken (every available one).
--   "m" many (timeout 0, all-or-nothing) -> {0} all granted, else {index, wait} of the largest wait.
--   "M" many with quotas -> {"m"'s reply, {remaining_1, reset_1, ...}} read right after the decision.
--   "n", "N": "m", "M" whose grant {0, state_1, ..., state_n} names the states written (what "g" needs): the
--       takes of an all-or-nothing decision split over algorithms or cluster slots.
--   "g" give back: "m"'s layout, the deadline slot holding the states that "n"/"N" wrote, joined by ","
--       -> {remaining_1, reset_1, ...}: undoes that take of `permits` (another part of a split all-or-nothing
--       decision rejected) as algorithms.gcra_give_back: tat moves back by the part of the take still ahead
--       of now, min(permits * step, written tat - now), never below now (full). Exact when nothing came in
--       between, never more permissive than without the take whatever did; never LATE.
-- With server time and an empty deadline the reply is {reply, {now_us}} (the client learns the server time);
-- with a deadline in the past the script changes nothing and answers the status LATE (no ghost charges).

-- (Redis CPU: a string -> number conversion, x + 0, is a strtod; the usual '1' / '0' are recognised by
-- comparing with a constant instead: interned strings, a pointer comparison. See fast.lua.)
local op, permits, timeout, n = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
if permits == '1' then
  permits = 1
else
  permits = permits + 0
end
if timeout == '0' then
  timeout = 0
else
  timeout = timeout + 0
end
if n == '1' then
  n = 1
else
  n = n + 0
end
local at = 5 + 4 * n
-- slack: ms added to a state's expiry; on a caller's clock (a FakeClock) its time and Redis's are unrelated,
-- so a state outlives an hour of real time whatever the fake time does.
local now_s, now_ns, now_us, slack
if ARGV[at + 1] then
  now_s, now_ns, slack = ARGV[at + 1] + 0, ARGV[at + 2] + 0, 3600000
else
  local t = redis.call('TIME')
  local us = t[2] + 0
  now_s, now_ns, slack = t[1] + 0, us * 1000, 2
  now_us = now_s * 1000000 + us
  if op ~= 'g' and ARGV[at] ~= '' and now_us > ARGV[at] + 0 then -- ("g" carries the take there)
    return redis.status_reply('LATE')
  end
end

-- Exact floor division with remainder for integers |a| < 2^53, b > 0.
local function divmod(a, b)
  local q = math.floor(a / b)
  local r = a - q * b
  if r < 0 then
    q, r = q - 1, r + b
  elseif r >= b then
    q, r = q + 1, r - b
  end
  return q, r
end

local function div_ceil(a, b)
  local q, r = divmod(a, b)
  if r > 0 then
    q = q + 1
  end
  return q
end

-- tat - now in units (0 when full) of a state string, one of another scale (the limit changed) rescaled.
local function ahead_of(s, scale)
  if not s then
    return 0
  end
  local ts, tu, sc = string.match(s, '^(%-?%d+) (%d+) (%d+)$')
  ts, tu, sc = ts + 0, tu + 0, sc + 0
  if ts - now_s < -1 then
    return 0
  end
  local d
  if scale > 0 then
    d = (ts - now_s) * 1000000000 * sc + tu - now_ns * sc
  else
    scale = -scale
    d = (ts - now_s) * 1000000 * sc + tu - math.floor(now_ns / 1000) * sc
  end
  if d <= 0 then
    return 0
  end
  if sc ~= scale then
    d = div_ceil(d * scale, sc)
  end
  return d
end

local function ahead(i, scale)
  return ahead_of(redis.call('GET', KEYS[i]), scale)
end

-- tat := now + d (d > 0 units); expires once passed. Returns the state written.
local function store(i, scale, d)
  local q, r, ms
  if scale > 0 then
    q, r = divmod(now_ns * scale + d, 1000000000 * scale)
    ms = math.floor(d / scale / 1000000)
  else
    scale = -scale
    q, r = divmod(math.floor(now_ns / 1000) * scale + d, 1000000 * scale)
    ms = math.floor(d / scale / 1000)
  end
  local s = string.format('%d %d %d', now_s + q, r, scale)
  -- (the expiry as a string: redis.call formats a Lua number with %.17g, several times the cost of %d)
  redis.call('SET', KEYS[i], s, 'PX', string.format('%d', ms + slack))
  return s
end

local function wait_of(d, k, step, span, scale)
  local early = d + k * step - span
  if early <= 0 then
    return 0
  end
  if scale > 0 then
    return div_ceil(early, scale)
  end
  return div_ceil(early, -scale) * 1000 -- (whole microseconds, rounded up)
end

-- gcra_quota's (remaining, reset ns) at tat - now = d.
local function quota_of(d, step, span, scale)
  local remaining = (divmod(span - d, step))
  if remaining >= 1 then
    if scale > 0 then
      return remaining, div_ceil(d, scale)
    end
    return remaining, div_ceil(d, -scale) * 1000
  end
  return remaining, wait_of(d, 1, step, span, scale)
end

local reply
if op == 'g' then
  local written = {}
  for w in string.gmatch(ARGV[at], '[^,]+') do
    written[#written + 1] = w
  end
  reply = {}
  for i = 1, n do
    local j = 1 + 4 * i
    local step, span, scale = ARGV[j] + 0, ARGV[j + 1] + 0, ARGV[j + 2] + 0
    local d = ahead(i, scale)
    local back = math.min(permits * step, ahead_of(written[i], scale))
    if d > 0 and back > 0 then
      d = d - back
      if d > 0 then
        store(i, scale, d)
      else
        d = 0
        redis.call('DEL', KEYS[i]) -- full again
      end
    end
    reply[2 * i - 1], reply[2 * i] = quota_of(d, step, span, scale)
  end
  return reply
end
local report = op == 'n' or op == 'N'
if op == 'N' then
  op = 'M'
elseif report then
  op = 'm'
end
if op == 'm' or op == 'M' then
  local worst, worst_wait = 0, 0
  local ds = {}
  for i = 1, n do
    local j = 1 + 4 * i
    local step, span, scale = ARGV[j] + 0, ARGV[j + 1] + 0, ARGV[j + 2] + 0
    local d = ahead(i, scale)
    ds[i] = d
    local wait
    if permits * step > span then
      wait = math.max(1, ARGV[j + 3] + 0)
    else
      wait = wait_of(d, permits, step, span, scale)
    end
    if wait > worst_wait then
      worst, worst_wait = i, wait
    end
  end
  if worst > 0 then
    reply = {worst, worst_wait}
  else
    reply = {0}
    for i = 1, n do
      local j = 1 + 4 * i
      ds[i] = ds[i] + permits * ARGV[j]
      local written = store(i, ARGV[j + 2] + 0, ds[i])
      if report then
        reply[i + 1] = written
      end
    end
  end
  if op == 'M' then
    local quotas = {}
    for i = 1, n do
      local j = 1 + 4 * i
      local remaining, reset = quota_of(ds[i], ARGV[j] + 0, ARGV[j + 1] + 0, ARGV[j + 2] + 0)
      quotas[2 * i - 1], quotas[2 * i] = remaining, reset
    end
    reply = {reply, quotas}
  end
else
  local step, span, scale = ARGV[5] + 0, ARGV[6] + 0, ARGV[7] + 0
  local d = ahead(1, scale)
  if op == 'a' or op == 'q' then
    local wait = wait_of(d, permits, step, span, scale)
    if permits * step <= span and timeout >= wait then
      d = d + permits * step
      store(1, scale, d)
      reply = wait
    else
      reply = -wait
    end
    if op == 'q' then
      local remaining, reset = quota_of(d, step, span, scale)
      reply = {reply, remaining, reset}
    end
  else
    local remaining = (divmod(span - d, step))
    if op == 'd' then
      reply = 0
      if remaining > 0 then
        store(1, scale, d + remaining * step)
        reply = remaining
      end
    else
      local wait = wait_of(d, 1, step, span, scale)
      local reset = wait
      if remaining >= 1 then
        reset = scale > 0 and div_ceil(d, scale) or div_ceil(d, -scale) * 1000
      end
      reply = {0, remaining, wait, reset}
    end
  end
end
if now_us and ARGV[at] == '' then
  return {reply, {now_us}}
end
return reply
