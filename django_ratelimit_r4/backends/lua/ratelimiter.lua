-- ratelimiter.lua: every Redis rate-limiter operation; the script is fast.lua + decide.lua + this file.
--
-- KEYS: per limiter i, KEYS[2i-1] = its anchor ("<s> <ns>": when cycle 0 began, shared by all its client
--   keys) and KEYS[2i] = its state ("<cycle> <permissions> <anchor>": the anchor it was written under;
--   absent means full). "r" takes the anchor then any number of state keys to delete.
-- Time: Redis server TIME, unless the caller runs on its own clock (a FakeClock in tests): then it appends
--   now_s, now_ns to ARGV (their presence is how the script tells the two modes apart).
-- L, six arguments per limiter: token (the anchor value the client cached, '' for none), base (server time:
--   the client's base instant, the anchor plus K whole periods, in absolute microseconds; client time: the
--   units elapsed since that instant), K, limit_for_period, period (in units), m (units per microsecond:
--   1000 for nanosecond limiters, 1 for microsecond ones). When the token is the anchor in Redis and the
--   elapsed time is below 2^53 units, one divmod gives (cycle, offset): the fast path. Otherwise the exact
--   slow path reads the anchor itself, and the reply carries {now_us, i, anchor, cycle} so the client
--   refreshes its cache (a reset by another process takes effect at once).
-- ops (waits in the limiter's unit; a stale reply is {reply, {now_us, i, anchor, cycle, ...}}, now_us 0 on
-- a client clock):
--   "a" acquire: 'a', L, permits, timeout, deadline_us -> wait >= 0 granted and reserved, -wait rejected.
--   "s" state:   'a''s layout -> {cycle, permissions, wait for permits, units to the next cycle}; no write.
--   "d" drain:   'a''s layout -> the drained count.
--   "m" many:    'm', permits, n, L1 .. Ln, deadline_us (timeout 0, all-or-nothing) -> {0} granted
--                everywhere, else {worst index, its wait, every rejecting index...} with nothing reserved.
--   "q" acquire with quota: 'a''s layout -> {wait as "a", remaining, reset}: the RateLimit figures after
--                the decision (as "s" then reads them): reset is the time to the next cycle while a permit
--                is left, else the wait for one.
--   "A", "Q": "a" and "q" of one permit without waiting (what a request asks): 'a''s layout without permits
--                and timeout (op, L, deadline_us [, now_s, now_ns]). "A" replies as "a". "Q" replies with
--                ONE integer when it can (a table reply costs the server ~5 000 instructions, an integer
--                ~300): n >= 2 granted (wait 0) with remaining, reset = divmod(n // 2, period + 1) for an
--                even n, and remaining, reset / 1000 = divmod(n // 2, period / 1000 + 1) for an odd one;
--                n <= -1 rejected with wait = reset = -n and remaining 0. Otherwise (a grant whose n would
--                not be exact below 2^53, a rejection in debt) "q"'s table. (Never a string: LATE is one.)
--   "M" many with quotas: 'm''s layout -> {remaining1, reset1, .., remainingN, resetN, then "m"'s reply}.
--   "g" give back: 'm''s layout, the deadline slot holding `since` -> {remaining1, reset1, ..}: returns
--                `permits` taken by an "m"/"M" to each limiter whose current cycle began no later than
--                `since` (server time: absolute microseconds, no later than the take ran; client time: ns
--                elapsed since it, at least): the take was in this cycle, so permissions + permits is exactly
--                the state as if they had never been taken (other decisions meanwhile kept). A cycle begun
--                since may have absorbed the take in its refill: nothing is given back (never more permissive
--                than without the take). The compensation of an all-or-nothing decision split over cluster
--                slots; run at most once, never refused as late.
--   "r" reset:   'r', '' -> {anchor, now_us}: anchor := now, the listed states deleted.
-- deadline_us ('' for none): server time after which the caller has given up; a later execution changes
--   nothing and returns the status reply LATE (no ghost charges after a client timeout). fast.lua checks it.

-- Everything about limiter i (its L at ARGV[j]) now: current cycle, offset, the stored (cycle, permissions)
-- (absent or stale: full), and the anchor to report to the client (nil when its cache is right).
local function locate(i, j, create_anchor)
  local e = {limit = tonumber(ARGV[j + 3]), period = tonumber(ARGV[j + 4]), m = tonumber(ARGV[j + 5])}
  local token = ARGV[j]
  local c, p, a
  local state = redis.call('GET', KEYS[2 * i])
  if state then
    c, p, a = string.match(state, '^(%-?%d+) (%-?%d+) (.*)$')
  end
  local anchor = a
  if token == '' or a ~= token then
    anchor = redis.call('GET', KEYS[2 * i - 1])
  end
  if anchor and anchor == token then
    local elapsed
    if now_us then
      elapsed = (now_us - ARGV[j + 1]) * e.m
    else
      elapsed = tonumber(ARGV[j + 1])
    end
    if elapsed >= 0 and elapsed < EXACT / 2 then
      local q, r = divmod(elapsed, e.period)
      e.current, e.offset = ARGV[j + 2] + q, r
    end
  end
  if not e.current then
    -- The exact slow path, from the anchor in Redis.
    if not anchor then
      -- First use by any process: cycle 0 starts now.
      anchor = string.format('%.0f %.0f', now_s, now_ns)
      if create_anchor then
        redis.call('SET', KEYS[2 * i - 1], anchor)
        e.report = anchor
      end
    else
      e.report = anchor
    end
    local s, ns = string.match(anchor, '^(%-?%d+) (%d+)$')
    local es, ens = now_s - tonumber(s), now_ns - tonumber(ns)
    if ens < 0 then
      es = es - 1
      ens = ens + NS_PER_S
    end
    if e.m == 1 then
      e.current, e.offset = cycle_of(es, math.floor(ens / 1000), e.period, 6)
    else
      e.current, e.offset = cycle_of(es, ens, e.period, 9)
    end
  end
  e.anchor = anchor
  e.cycle, e.permissions = e.current, e.limit
  -- A state of another anchor (replaced, evicted, flushed) or from a later cycle (the server clock stepped
  -- back) is ignored (full) rather than blocking the key until time catches up.
  if a == anchor then
    c = tonumber(c)
    if c <= e.current then
      e.cycle, e.permissions = c, tonumber(p)
    end
  end
  -- Its expiry is the end of this cycle while it is of this cycle and not in debt (see store).
  e.keep = e.cycle == e.current and a == anchor and e.permissions >= 0
  return e
end

-- Write (cycle, permissions); a full state is deleted, any other expires once lazily refreshed to full.
local function store(e, permissions)
  if permissions >= e.limit then
    redis.call('DEL', KEYS[2 * e.i])
    return
  end
  local value = string.format('%d %d ', e.current, permissions) .. e.anchor
  if e.keep and permissions >= 0 then
    redis.call('SET', KEYS[2 * e.i], value, 'KEEPTTL')
    return
  end
  local ms = math.ceil((div_ceil(e.limit - permissions, e.limit) * e.period - e.offset) / (1000 * e.m)) + slack
  redis.call('SET', KEYS[2 * e.i], value, 'PX', math.min(ms, 1e15))
end

-- (remaining, reset) of a limiter left with `permissions` (see "q").
local function figures_of(e, permissions)
  if permissions >= 1 then
    return permissions, e.period - e.offset
  end
  return permissions, nanos_to_wait(permissions, 1, e.offset, e.period, e.limit)
end

local function stale_reply(reply, stale)
  if stale then
    table.insert(stale, 1, now_us or 0)
    return {reply, stale}
  end
  return reply
end

if op == 'a' or op == 'q' or op == 's' or op == 'd' then
  local e = locate(1, 2, op ~= 's')
  e.i = 1
  local stale = e.report and {1, e.report, e.current}
  if op == 'a' or op == 'q' then
    local permits, timeout = 1, 0 -- ("A", "Q": one permit, no wait)
    if not one then
      permits, timeout = tonumber(ARGV[8]), tonumber(ARGV[9])
    end
    local _, left, wait, granted = decide(e.cycle, e.permissions, permits, timeout, e.current, e.offset, e.period, e.limit)
    if granted then
      store(e, left)
    else
      wait = -wait
    end
    if op == 'q' then
      local remaining, reset = figures_of(e, left)
      return stale_reply({wait, remaining, reset}, stale)
    end
    return stale_reply(wait, stale)
  end
  local permissions = refresh(e.cycle, e.permissions, e.current, e.limit)
  if op == 's' then
    local wait = nanos_to_wait(permissions, tonumber(ARGV[8]), e.offset, e.period, e.limit)
    return stale_reply({e.current, permissions, wait, e.period - e.offset}, stale)
  end
  local drained = 0
  if permissions > 0 then
    drained = permissions
  end
  store(e, permissions - drained)
  return stale_reply(drained, stale)
end

if many then
  local permits, n = tonumber(ARGV[2]), tonumber(ARGV[3])
  local entries = {}
  local worst, worst_wait, worst_ns = 0, -1, -1
  local rejecting = {}
  local stale
  for i = 1, n do
    local e = locate(i, 4 + 6 * (i - 1), true)
    e.i = i
    if e.report then
      stale = stale or {}
      stale[#stale + 1] = i
      stale[#stale + 1] = e.report
      stale[#stale + 1] = e.current
    end
    local _, left, wait, granted =
      decide(e.cycle, e.permissions, permits, 0, e.current, e.offset, e.period, e.limit)
    e.left = left
    entries[i] = e
    if not granted then
      rejecting[#rejecting + 1] = i
      -- The longest wait, compared in nanoseconds (two limiters' units may differ).
      if wait * 1000 / e.m > worst_ns then
        worst, worst_wait, worst_ns = i, wait, wait * 1000 / e.m
      end
    end
  end
  local reply = {}
  if quota then
    for i = 1, n do
      local e = entries[i]
      local permissions = e.left
      if worst > 0 then
        permissions = refresh(e.cycle, e.permissions, e.current, e.limit) -- nothing reserved anywhere
      end
      reply[2 * i - 1], reply[2 * i] = figures_of(e, permissions)
    end
  end
  if worst > 0 then
    reply[#reply + 1] = worst
    reply[#reply + 1] = worst_wait
    for _, i in ipairs(rejecting) do
      reply[#reply + 1] = i
    end
    return stale_reply(reply, stale)
  end
  for i = 1, n do
    store(entries[i], entries[i].left)
  end
  reply[#reply + 1] = 0
  return stale_reply(reply, stale)
end

if op == 'g' then
  local permits, n = tonumber(ARGV[2]), tonumber(ARGV[3])
  local reply = {}
  local stale
  for i = 1, n do
    local e = locate(i, 4 + 6 * (i - 1), false)
    e.i = i
    if e.report then
      stale = stale or {}
      stale[#stale + 1] = i
      stale[#stale + 1] = e.report
      stale[#stale + 1] = e.current
    end
    local permissions = refresh(e.cycle, e.permissions, e.current, e.limit)
    -- Units since `since` (rounded up: the check below must never pass early).
    local back
    if now_us then
      back = (now_us - ARGV[at - 1]) * e.m
    else
      back = math.ceil(ARGV[at - 1] * e.m / 1000)
    end
    if e.offset >= back then
      -- Same cycle as the take, no refill in between: p - k - j + k = p - j. A state of another anchor (a
      -- reset since) reads as full and stays full.
      permissions = math.min(permissions + permits, e.limit)
      store(e, permissions)
    end
    reply[2 * i - 1], reply[2 * i] = figures_of(e, permissions)
  end
  return stale_reply(reply, stale)
end

if op == 'r' then
  local anchor = string.format('%.0f %.0f', now_s, now_ns)
  redis.call('SET', KEYS[1], anchor)
  for i = 2, #KEYS do
    redis.call('DEL', KEYS[i])
  end
  return {anchor, now_us or 0}
end

return redis.error_reply('ratelimiter.lua: unknown op ' .. tostring(op))
