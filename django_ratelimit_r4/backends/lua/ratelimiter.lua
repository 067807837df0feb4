-- ratelimiter.lua: every Redis rate-limiter operation, appended to decide.lua and loaded as ONE script.
--
-- KEYS: per limiter i, KEYS[2i-1] = its anchor ("<s> <ns>": when cycle 0 began, shared by all its client
--   keys) and KEYS[2i] = its state ("<cycle> <permissions>"; absent means full). "reset" takes the anchor
--   then any number of state keys to delete.
-- ARGV: op, now_s, now_ns (now_s "" = use Redis server TIME), permits, timeout_ns, ttl_slack_ms,
--   then per limiter i: limit_for_period, limit_refresh_period_ns.
-- ops: "acquire" (one limiter: wait >= 0 granted and reserved, -wait rejected), "many" (all-or-nothing:
--   {0} granted everywhere, else {worst index, its wait, every rejecting index...}, nothing reserved),
--   "state" ({cycle, permissions, wait for 1, ns to the next cycle}; writes nothing), "drain" (drained
--   count), "reset" (anchor := now, states deleted).

local op = ARGV[1]
local now_s, now_ns
if ARGV[2] == '' then
  local t = redis.call('TIME')
  now_s = tonumber(t[1])
  now_ns = tonumber(t[2]) * 1000
else
  now_s = tonumber(ARGV[2])
  now_ns = tonumber(ARGV[3])
end
local permits = tonumber(ARGV[4])
local timeout_ns = tonumber(ARGV[5])
local slack_ms = tonumber(ARGV[6])
local MAX_TTL_MS = 1e15

local function fmt(x)
  return string.format('%.0f', x)
end

-- One limiter's state refreshed to now (nothing written unless create_anchor and the anchor was missing).
local function load(i, create_anchor)
  local e = {limit = tonumber(ARGV[5 + 2 * i]), period = tonumber(ARGV[6 + 2 * i]), key = KEYS[2 * i]}
  local a_s, a_ns = now_s, now_ns
  local anchor = redis.call('GET', KEYS[2 * i - 1])
  if anchor then
    local s, ns = string.match(anchor, '^(%-?%d+) (%d+)$')
    a_s, a_ns = tonumber(s), tonumber(ns)
  elseif create_anchor then
    -- First use by any process: cycle 0 starts now.
    redis.call('SET', KEYS[2 * i - 1], fmt(now_s) .. ' ' .. fmt(now_ns))
  end
  local es, ens = now_s - a_s, now_ns - a_ns
  if ens < 0 then
    es = es - 1
    ens = ens + NS_PER_S
  end
  e.current, e.offset = cycle_of(es, ens, e.period)
  -- An absent key reads as (current cycle, limit): full, exactly like a key never seen.
  e.cycle, e.permissions = e.current, e.limit
  local state = redis.call('GET', e.key)
  if state then
    local c, p = string.match(state, '^(%-?%d+) (%-?%d+)$')
    c, p = tonumber(c), tonumber(p)
    -- A state from a later cycle means the anchor was replaced (evicted, flushed) or the server clock
    -- stepped back: it is ignored (full) rather than blocking the key until time catches up.
    if c <= e.current then
      e.cycle, e.permissions = c, p
    end
  end
  return e
end

-- Write (cycle, permissions); a full state is deleted, any other expires once lazily refreshed to full.
local function store(e, cycle, permissions)
  if permissions >= e.limit then
    redis.call('DEL', e.key)
    return
  end
  local cycles_to_full = div_ceil(e.limit - permissions, e.limit)
  local ms = math.ceil((cycles_to_full * e.period - e.offset) / 1000000) + slack_ms
  redis.call('SET', e.key, fmt(cycle) .. ' ' .. fmt(permissions), 'PX', fmt(math.min(ms, MAX_TTL_MS)))
end

if op == 'acquire' then
  local e = load(1, true)
  local cycle, permissions, wait, granted =
    decide(e.cycle, e.permissions, permits, timeout_ns, e.current, e.offset, e.period, e.limit)
  if granted then
    store(e, cycle, permissions)
    return wait
  end
  return -wait
end

if op == 'many' then
  local n = #KEYS / 2
  local entries, decisions = {}, {}
  local worst, worst_wait = 0, -1
  local rejecting = {}
  for i = 1, n do
    local e = load(i, true)
    local cycle, permissions, wait, granted =
      decide(e.cycle, e.permissions, permits, timeout_ns, e.current, e.offset, e.period, e.limit)
    entries[i] = e
    decisions[i] = {cycle, permissions}
    if not granted then
      rejecting[#rejecting + 1] = i
      if wait > worst_wait then
        worst, worst_wait = i, wait
      end
    end
  end
  if worst > 0 then
    local reply = {worst, worst_wait}
    for _, i in ipairs(rejecting) do
      reply[#reply + 1] = i
    end
    return reply
  end
  for i = 1, n do
    store(entries[i], decisions[i][1], decisions[i][2])
  end
  return {0}
end

if op == 'state' then
  local e = load(1, false)
  local permissions = refresh(e.cycle, e.permissions, e.current, e.limit)
  return {e.current, permissions, nanos_to_wait(permissions, 1, e.offset, e.period, e.limit), e.period - e.offset}
end

if op == 'drain' then
  local e = load(1, true)
  local permissions = refresh(e.cycle, e.permissions, e.current, e.limit)
  local drained = 0
  if permissions > 0 then
    drained = permissions
  end
  store(e, e.current, permissions - drained)
  return drained
end

if op == 'reset' then
  redis.call('SET', KEYS[1], fmt(now_s) .. ' ' .. fmt(now_ns))
  for i = 2, #KEYS do
    redis.call('DEL', KEYS[i])
  end
  return 0
end

return redis.error_reply('ratelimiter.lua: unknown op ' .. tostring(op))
