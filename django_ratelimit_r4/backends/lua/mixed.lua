-- mixed.lua: the driver of the ONE all-or-nothing script over limits of several algorithms in one slot.
-- backends/redis_mixed.py composes the script at import time: first each algorithm's whole script, unchanged,
-- as a local function whose parameters shadow the globals it reads,
--   local function r4_cycle(KEYS, ARGV, redis) <fast.lua decide.lua ratelimiter.lua> end
--   local function r4_gcra(KEYS, ARGV, redis) <gcra.lua> end
--   local function r4_sliding(KEYS, ARGV, redis) <sliding_window.lua> end
-- then this file. Each group of limits (one algorithm) takes with its script's own all-or-nothing op ("m"/"M"
-- for cycle limits, "n"/"N" for GCRA and the sliding window: the grant names what a give-back needs); when
-- any group rejects, the groups that granted give back with their op "g" in this same run. Nothing runs in
-- between (a script is atomic), so the give-back is exact and no other decision sees the taken permits.
--
-- KEYS: every group's keys, group after group (cycle: anchor, state per limiter; GCRA, sliding: the state).
-- ARGV: op ('m' or 'M'), permits, G (groups), then per group: its kind ('c', 'g', 's'), n (its limiters),
--   then n times its script's per-limiter arguments (cycle: 6, GCRA: 4, sliding: 3; see each script); then
--   the deadline (server microseconds, '' unknown); then now_s, now_ns of a caller on its own clock (absent:
--   server TIME).
-- Reply: the cycle script's shape over the limits in KEYS order, waits and resets in each limiter's unit:
--   "m": {0} granted everywhere, else {worst, its wait, every rejecting index...} (the largest wait compared
--   in ns; GCRA and the sliding window name their worst rejection only); "M": {remaining_1, reset_1, ..., then
--   "m"'s reply}, each limit's figures after the decision (after its give-back). Wrapped as {reply, {now_us,
--   i, anchor, cycle, ...}} when a cycle limiter's anchor must be reported to the client (as the cycle script
--   does) or, on server time, when the deadline was unknown (the client learns the server time); now_us 0 on
--   a caller's clock. A deadline in the past: nothing changes, the status LATE (checked once, here).
--
-- Time: one instant for the whole decision. On server time this driver reads TIME once and every script it
-- runs gets that reply for its own TIME (the proxy below; the scripts' other calls go to Redis unchanged), so
-- a cycle give-back always finds the cycle of its take, and the decision is the pure references' at one now.

local r4_many, r4_permits, r4_count = ARGV[1], ARGV[2], ARGV[3] + 0
-- Per group, an array {kind, n, at (its first argument), keys (its first key), first (index, in KEYS order,
-- of its first limiter)}: Redis CPU, a table built by one array constructor is sized once (hash-keyed tables
-- and their growth cost ~20 000 instructions per decision here).
local r4_groups = {}
local r4_deadline_at
do
  local j, k, first = 4, 1, 1
  for g = 1, r4_count do
    local kind, n = ARGV[j], ARGV[j + 1]
    if n == '1' then
      n = 1
    else
      n = n + 0
    end
    local width, per
    if kind == 'c' then
      width, per = 6, 2
    elseif kind == 'g' then
      width, per = 4, 1
    elseif kind == 's' then
      width, per = 3, 1
    else
      return redis.error_reply('mixed.lua: unknown kind ' .. tostring(kind))
    end
    r4_groups[g] = {kind, n, j + 2, k, first}
    j = j + 2 + width * n
    k = k + per * n
    first = first + n
  end
  r4_deadline_at = j
end
local r4_deadline = ARGV[r4_deadline_at]
local r4_now_s, r4_now_ns = ARGV[r4_deadline_at + 1], ARGV[r4_deadline_at + 2]
local r4_time, r4_now_us
if not r4_now_s then
  r4_time = redis.call('TIME')
  r4_now_us = r4_time[1] * 1000000 + r4_time[2]
  if r4_deadline ~= '' and r4_now_us > r4_deadline + 0 then
    return redis.status_reply('LATE') -- the caller has given up: nothing changed
  end
end

-- The `redis` each script sees: Redis's own, except that its first TIME answers this decision's instant.
local r4_call = redis.call
local r4_proxy = setmetatable({}, {__index = redis})
local function r4_timed(command, ...)
  if command == 'TIME' then
    r4_proxy.call = r4_call
    return r4_time
  end
  return r4_call(command, ...)
end

-- One run of group `gr`'s script with `op`; `slot` fills its deadline slot (a take: no deadline left to
-- check; a give-back: what its take reported).
local function r4_group_run(gr, op, slot)
  local kind, n, at, first_key = gr[1], gr[2], gr[3], gr[4]
  local run, width, per = r4_sliding, 3, 1
  if kind == 'c' then
    run, width, per = r4_cycle, 6, 2
  elseif kind == 'g' then
    run, width = r4_gcra, 4
  end
  local last = at + width * n - 1
  -- The slot (and a caller clock's now_s, now_ns) follow the group's arguments: the unpack runs that far (into
  -- the next group's arguments, or onto the deadline and the clock after the last group) so that the table
  -- is sized once and the slot is overwritten, not appended (each append past the constructor's size is a
  -- reallocation).
  local tail = 1
  if r4_now_s then
    tail = 3
  end
  local keys, argv, base
  if n <= 1000 then
    -- Redis CPU: a table built by one constructor is sized once; element by element it grows 1, 2, 4, 8, 16,
    -- a reallocation each (about 8 000 instructions per decision here). (unpack's values go on Lua's C
    -- stack, at most 8 000: hence the bound.)
    keys = {unpack(KEYS, first_key, first_key + per * n - 1)}
    if kind == 'c' then
      argv, base = {op, r4_permits, n, unpack(ARGV, at, last + tail)}, 3
    else
      argv, base = {op, r4_permits, 0, n, unpack(ARGV, at, last + tail)}, 4
    end
  else
    keys = {}
    for i = 0, per * n - 1 do
      keys[i + 1] = KEYS[first_key + i]
    end
    if kind == 'c' then
      argv, base = {op, r4_permits, n}, 3
    else
      argv, base = {op, r4_permits, 0, n}, 4
    end
    for i = at, last do
      argv[base + i - at + 1] = ARGV[i]
    end
  end
  local s = base + last - at + 2
  argv[s] = slot
  if r4_now_s then
    argv[s + 1] = r4_now_s
    argv[s + 2] = r4_now_ns
    r4_proxy.call = r4_call
  else
    r4_proxy.call = r4_timed
  end
  return run(keys, argv, r4_proxy)
end

local r4_stale -- {i, anchor, cycle, ...} of cycle limiters whose anchor the client must learn

-- A cycle reply without its stale wrapping (its limiter indexes moved to KEYS order).
local function r4_unwrap(gr, reply)
  if type(reply[1]) == 'table' then
    local stale = reply[2]
    r4_stale = r4_stale or {}
    for k = 2, #stale, 3 do
      r4_stale[#r4_stale + 1] = gr[5] + stale[k] - 1
      r4_stale[#r4_stale + 1] = stale[k + 1]
      r4_stale[#r4_stale + 1] = stale[k + 2]
    end
    return reply[1]
  end
  return reply
end

local quota = r4_many == 'M'
-- (Redis CPU: tables only where needed; each costs ~1 000 instructions and more as it grows.)
local figures = quota and {} -- per limiter in KEYS order: remaining, reset
local worst, worst_wait, worst_ns = 0, 0, -1
local rejecting
local granted, ngranted = {}, 0 -- groups that took, and their verdicts (what their give-backs need)
for g = 1, r4_count do
  local gr = r4_groups[g]
  local kind, n = gr[1], gr[2]
  local verdict, own
  if kind == 'c' then
    local reply = r4_unwrap(gr, r4_group_run(gr, r4_many, ''))
    if quota then
      own = reply
      verdict = {}
      for k = 2 * n + 1, #reply do
        verdict[#verdict + 1] = reply[k]
      end
    else
      verdict = reply
    end
  else
    local reply = r4_group_run(gr, quota and 'N' or 'n', r4_now_us or '')
    if quota then
      verdict, own = reply[1], reply[2]
    else
      verdict = reply
    end
  end
  if quota then
    for i = 1, 2 * n do
      figures[2 * (gr[5] - 1) + i] = own[i]
    end
  end
  if verdict[1] == 0 then
    granted[ngranted + 1], granted[ngranted + 2] = gr, verdict -- (a give-back's slot is formed only if one runs)
    ngranted = ngranted + 2
  else
    local i = verdict[1]
    -- the wait in ns: cycle units are 1000 / m ns (m: units per microsecond), GCRA's ns, the sliding window's
    -- `unit` ns
    local ns
    if kind == 'c' then
      ns = verdict[2] * 1000 / ARGV[gr[3] + 6 * (i - 1) + 5]
    elseif kind == 'g' then
      ns = verdict[2]
    else
      ns = verdict[2] * ARGV[gr[3] + 3 * (i - 1) + 2]
    end
    if ns > worst_ns then
      worst, worst_wait, worst_ns = gr[5] + i - 1, verdict[2], ns
    end
    rejecting = rejecting or {}
    if kind == 'c' then
      for k = 3, #verdict do
        rejecting[#rejecting + 1] = gr[5] + verdict[k] - 1
      end
    else
      rejecting[#rejecting + 1] = gr[5] + i - 1
    end
  end
end

local reply
if worst > 0 then
  for k = 1, ngranted, 2 do
    local gr, verdict = granted[k], granted[k + 1]
    local taken -- the give-back's slot: cycle: the take's time (this instant); GCRA: the states written;
    if gr[1] == 'c' then -- sliding: the time logged
      taken = r4_now_us or 0
    elseif gr[1] == 'g' then
      taken = table.concat(verdict, ',', 2, gr[2] + 1)
    else
      taken = string.format('%d %d', verdict[2], verdict[3])
    end
    local back = r4_group_run(gr, 'g', taken)
    if gr[1] == 'c' then
      back = r4_unwrap(gr, back)
    end
    if quota then
      for i = 1, 2 * gr[2] do
        figures[2 * (gr[5] - 1) + i] = back[i]
      end
    end
  end
  table.sort(rejecting)
  reply = figures or {}
  reply[#reply + 1] = worst
  reply[#reply + 1] = worst_wait
  for k = 1, #rejecting do
    reply[#reply + 1] = rejecting[k]
  end
elseif figures then
  reply = figures
  reply[#reply + 1] = 0
else
  reply = {0}
end
if r4_stale or (r4_now_us and r4_deadline == '') then
  local tail = {r4_now_us or 0}
  for k = 1, r4_stale and #r4_stale or 0 do
    tail[k + 1] = r4_stale[k]
  end
  return {reply, tail}
end
return reply
