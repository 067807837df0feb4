-- sliding_window.lua: the Redis sliding-window script (algorithm "sliding_window"), backends/algorithms.py's
-- sliding_decide in Lua 5.1: an exact sliding log, never more than `limit` permits in any window of `period`.
-- A script of its own (own SHA): the cycle script and gcra.lua are untouched.
--
-- State per limiter (or client key), KEYS[i]: one string, a 48-byte header then a ring of `size` slots of 8
-- bytes, every number a big-endian double (struct.pack '>d': integers below 2^53 are exact, and one C call
-- reads or writes the whole header). Header: base (whole seconds), head (ring index of the oldest slot), size
-- (the limit the ring was written for), expiry (units after base until which the key's TTL keeps it; 0
-- unknown), hint, hint_at (the oldest `hint` slots were outside the window at `hint_at`: the header figures'
-- search starts there instead of a binary search over the ring). Slot: a hand-over time in units (1 ns, or
-- 1 us for periods over ~10.4 days) after `base`, always > 0; 0 (zero bytes, or past the string's end) is a
-- slot never written, older than any window. A value of any other shape under the key counts as an empty log.
-- A decision for k permits costs TIME, one GETRANGE of the header, one of the newest and oldest slot (when
-- they are neighbours, else two), a SETRANGE of the k slots and one of the header; the header figures read
-- up to 4 slots at the hint (more, galloping, only when the hint is stale). The TTL is pushed to two periods
-- past the newest permit when it would end before one (so PEXPIRE runs about once per period). The string
-- grows with use up to 48 + 8 * limit bytes and expires at most two periods after the last permit, so an
-- idle limiter costs nothing. Times stay below 2^52 units (the base moves forward, rewriting the ring once,
-- when `now` is 2^50 units past it: every ~13 days of continuous use in ns), so Lua's doubles are exact; the
-- client caps the timeout at 2^51 units.
-- Cost (python benchmarks/bench_redis_server.py): every redis.call costs ~0.7 us of server CPU and every
-- closure the script builds ~0.1 us per run, so calls are counted and rarely used functions are built only
-- in the branch that needs them. A whole-value GET + SET (tried) costs more than these ranges: ~2 us to
-- copy a log of 100 into Lua and back, and more for each string the script builds from it.
--
-- ARGV: op, permits, timeout (units of limiter 1), n, then per limiter i three arguments at j = 5 + 3 * (i - 1):
--   limit, period (units), unit (ns per unit: 1 or 1000); then the deadline (server microseconds, '' for none);
--   then now_s, now_ns of a caller on its own clock (absent: server TIME).
-- ops (waits, resets in the limiter's units):
--   "a" acquire (n = 1) -> wait >= 0 granted (logged), -wait rejected (nothing changed).
--   "q" acquire and quota (n = 1) -> {"a"'s reply, remaining, reset} read right after the decision.
--   "s" state   (n = 1) -> {0, remaining, wait for 1 permit, reset} (sliding_quota's figures); no write.
--   "d" drain   (n = 1) -> permits taken (every available one, logged now).
--   "m" many (timeout 0, all-or-nothing) -> {0} all granted, else {index, wait} of the largest wait.
--   "M" many with quotas -> {"m"'s reply, {remaining_1, reset_1, ...}} read right after the decision.
--   "n", "N": "m", "M" whose grant {0, now_s, now_ns} names the time logged (what "g" needs): the takes of an
--       all-or-nothing decision split over algorithms or cluster slots.
--   "g" give back: "m"'s layout, the deadline slot holding "<now_s> <now_ns>" of an "n"/"N" that granted
--       `permits` -> {remaining_1, reset_1, ...}: undoes that take (another part of a split all-or-nothing
--       decision rejected) as algorithms.sliding_give_back: `permits` logged times equal to the take's leave
--       the log (the newer ones move down, free slots take the old end): exact. Nothing is given back when a
--       time `period` or more after the take's was logged since (later grants may have overwritten its
--       times). Never LATE.
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
local at_deadline = 5 + 3 * n
-- slack: ms added to a state's expiry; on a caller's clock (a FakeClock) its time and Redis's are unrelated,
-- so a state outlives an hour of real time whatever the fake time does.
local now_s, now_ns, now_us, slack
if ARGV[at_deadline + 1] then
  now_s, now_ns, slack = ARGV[at_deadline + 1] + 0, ARGV[at_deadline + 2] + 0, 3600000
else
  local t = redis.call('TIME')
  local us = t[2] + 0
  now_s, now_ns, slack = t[1] + 0, us * 1000, 2
  now_us = now_s * 1000000 + us
  if op ~= 'g' and ARGV[at_deadline] ~= '' and now_us > ARGV[at_deadline] + 0 then -- ("g": the take there)
    return redis.status_reply('LATE')
  end
end

local HDR, W = 48, 8
-- The header's byte range as strings: redis.call formats a Lua number argument with %.17g (about 2 000
-- instructions each, benchmarks/bench_redis_script_parts.py), a constant string costs nothing.
local HDR_FROM, HDR_TO = '0', '47'
-- Ops that read the header figures after the decision (at_of then reads ahead for them).
local figures = op == 'q' or op == 'M' or op == 'N'
local REBASE = 1125899906842624 -- 2^50 units
local floor, sub, rep, call, pack, unpack = math.floor, string.sub, string.rep, redis.call, struct.pack, struct.unpack
local format = string.format -- (a number argument of call as format('%d', x): cheaper than call's %.17g)

-- The time of the slot at byte `off` (0-based) of `s`: 8 bytes, a big-endian double (times are integers below
-- 2^52 units: exact); 0 (zero bytes, or past the string's end) is a slot never written, older than any window
-- (logged times are > 0).
local function time_at(s, off)
  if #s >= off + W then
    local v = unpack('>d', s, off + 1)
    if v > 0 then
      return v
    end
  end
  return nil
end

-- (Functions only some ops need are defined in their branches: a closure is built on every run.)

-- Exact floor division for integers |a| < 2^53, b > 0.
local function div_floor(a, b)
  local q = floor(a / b)
  local r = a - q * b
  if r < 0 then
    q = q - 1
  elseif r >= b then
    q = q + 1
  end
  return q
end

-- The slot at ring index `index`: from the slots at_of read around the newest (st.blk, ring indexes
-- [blk_from, blk_to); st.over is one written since) when they hold it, else one GETRANGE.
local function slot(st, index)
  local b = st.blk
  if b and index >= st.blk_from and index < st.blk_to then
    if index == st.over then
      return st.over_v
    end
    return time_at(b, (index - st.blk_from) * W)
  end
  local from = HDR + index * W
  return time_at(call('GETRANGE', st.key, from, from + W - 1), 0)
end

-- The newest logged time (nil: none), read once per state and kept up to date by write.
local function newest_of(st)
  local v = st.newest
  if v == nil then
    v = slot(st, (st.head - 1) % st.size) or false
    st.newest = v
  end
  return v or nil
end

-- A limiter's state: its key, limit, period and unit, the ring's header and `now` in units after the base.
local function load(i, limit, period, unit)
  local st = {key = KEYS[i], limit = limit, period = period, unit = unit, base = now_s - 1, head = 0, size = limit,
    exp = 0, hint = 0, hint_at = 0, now = 0, newest = nil, dirty = false, ttl = false, at1 = nil,
    blk = false, blk_from = 0, blk_to = 0, over = false, over_v = 0} -- one allocation
  local h = call('GETRANGE', st.key, HDR_FROM, HDR_TO)
  if #h == HDR then
    local base, head, size, exp, hint, hint_at = unpack('>dddddd', h)
    -- anything else under the key (not this layout) counts as an empty log
    if size >= 1 and size <= 100000 and size == floor(size) and head >= 0 and head < size and head == floor(head)
      and base == floor(base) and hint >= 0 and hint < size and exp == exp and hint_at == hint_at then
      st.base, st.head, st.size, st.exp, st.hint, st.hint_at = base, head, size, exp, hint, hint_at
    end
  end
  st.now = div_floor((now_s - st.base) * 1000000000 + now_ns, unit)
  local base
  if st.now > REBASE or st.now <= 0 then -- (logged times stay > 0)
    base = now_s - floor(period * unit / 1000000000) - 2
  elseif st.size ~= limit then
    base = st.base -- the limit changed: keep the newest times
  end
  if base then
    -- Rewrite the whole ring: the newest `limit` times of the log (older ones empty), shifted to `base`.
    local EMPTY = rep('\0', W)
    local raw = call('GET', st.key) or ''
    local times = {}
    local shift = (st.base - base) * (1000000000 / st.unit)
    local edge = div_floor((now_s - base) * 1000000000 + now_ns, st.unit) - st.period
    for i = 0, st.size - 1 do
      local index = (st.head + i) % st.size
      local v = time_at(raw, HDR + index * W)
      if v then
        v = v + shift
        if v <= edge then
          v = nil -- outside every window from now on: an empty slot
        end
      end
      times[#times + 1] = v and pack('>d', v) or EMPTY
    end
    local parts = {}
    for i = 1, limit - st.size do
      parts[i] = EMPTY
    end
    for i = math.max(1, st.size - limit + 1), st.size do
      parts[#parts + 1] = times[i]
    end
    st.base, st.head, st.size, st.exp, st.hint, st.hint_at, st.newest = base, 0, limit, 0, 0, 0, nil
    call('SET', st.key, pack('>dddddd', base, 0, limit, 0, 0, 0) .. table.concat(parts), 'KEEPTTL')
    st.now = div_floor((now_s - st.base) * 1000000000 + now_ns, unit)
  end
  return st
end

-- When `k` permits (k <= size) can be handed over: max(now, times[k - 1] + period, newest).
local function at_of(st, k)
  local head, size = st.head, st.size
  local oldest, newest
  if k == 1 and (head > 0 or figures) and st.newest == nil then
    -- The oldest and (unless the ring just wrapped) the newest slot are neighbours: one read.
    local from, to = head, head
    if head > 0 then
      from = head - 1
    end
    if figures then
      -- The header figures' first read (available: up to 4 slots at the hint, whether this decision writes
      -- or not) is near them, usually just before the newest: read it too when the whole range is short.
      local pos = head
      if st.hint >= 1 and st.hint_at <= st.now then
        pos = (head + st.hint) % size
      end
      local lo, hi = math.min(from, pos), math.min(size - 1, math.max(to, pos + 4))
      if hi - lo < 16 then
        from, to = lo, hi
      end
    end
    local both = call('GETRANGE', st.key, format('%d', HDR + from * W), format('%d', HDR + to * W + W - 1))
    oldest = time_at(both, (head - from) * W)
    if figures then
      st.blk, st.blk_from, st.blk_to = both, from, to + 1
    end
    if head > 0 then
      newest = time_at(both, (head - 1 - from) * W)
      st.newest = newest or false
    else
      newest = newest_of(st)
    end
  else
    oldest = slot(st, (head + k - 1) % size)
    newest = newest_of(st)
  end
  local at = st.now
  if oldest and oldest + st.period > at then
    at = oldest + st.period
  end
  if newest and newest > at then
    at = newest
  end
  if k == 1 then
    st.at1 = at -- (until write changes the log)
  end
  return at
end

-- Log `k` permits handed over at `at` (they replace the oldest slots); the header is written by save.
local function write(st, at, k)
  local v = pack('>d', at)
  local head, size = st.head, st.size
  if st.blk then -- the slots read ahead: the one written is known, more are not
    if k == 1 and not st.over then
      st.over, st.over_v = head, at
    else
      st.blk = false
    end
  end
  local first = math.min(k, size - head)
  call('SETRANGE', st.key, format('%d', HDR + head * W), k == 1 and v or rep(v, first))
  if k > first then
    call('SETRANGE', st.key, HDR, rep(v, k - first))
  end
  st.head, st.newest, st.dirty, st.at1 = (head + k) % size, at, true, nil
  -- the oldest `hint` slots were outside the window at `hint_at`: k of them were just overwritten
  st.hint = st.hint > k and st.hint - k or 0
  if st.exp < at + st.period then -- the key outlives the permits by a period
    st.exp = at + 2 * st.period
    st.ttl = floor((st.exp - st.now) * st.unit / 1000000) + 1 + slack
  end
end

-- After the writes of a decision: the header, and the TTL when write pushed it.
local function save(st)
  if st.dirty then
    call('SETRANGE', st.key, HDR_FROM, pack('>dddddd', st.base, st.head, st.size, st.exp, st.hint, st.hint_at))
    if st.ttl then
      call('PEXPIRE', st.key, st.ttl)
    end
  end
end

local available, quota_of -- (not needed by "a", "m", "n": no closures built for them)
if op ~= 'a' and op ~= 'm' and op ~= 'n' then
  -- sliding_available: permits one request could take now (0 while a reservation is pending): the logged
  -- times outside the window (now - period, now], oldest first. The header's hint says that the oldest `hint`
  -- slots were outside the window at `hint_at` (so are now, when now >= hint_at): the search gallops forward
  -- from there and leaves the answer as the new hint.
  function available(st)
    local size, head = st.size, st.head
    local newest = newest_of(st)
    if not newest then
      return size
    end
    local now = st.now
    if newest > now then
      return 0
    end
    local edge = now - st.period
    if newest <= edge then
      return size
    end
    local lo = 0 -- slots before lo are outside the window; the newest (size - 1) is inside
    if st.hint_at <= now then
      lo = st.hint
    end
    -- first up to 4 slots from lo in one read (or none: at_of read them): where the edge is, when the hint
    -- is recent
    local pos = (head + lo) % size
    local count = math.min(4, size - lo, size - pos)
    local block = false
    if not (st.blk and pos >= st.blk_from and pos + count <= st.blk_to) then
      block = call('GETRANGE', st.key, HDR + pos * W, HDR + (pos + count) * W - 1)
    end
    for j = 0, count - 1 do
      local v
      if block then
        v = time_at(block, j * W)
      else
        v = slot(st, pos + j)
      end
      if v and v > edge then
        st.hint, st.hint_at = lo + j, now
        return lo + j
      end
    end
    lo = lo + count -- <= size - 1: the newest is inside
    local hi, step = lo, 1
    while true do -- gallop: the first slot inside the window is in [lo, hi]
      local v = slot(st, (head + hi) % size)
      if v and v > edge then
        break
      end
      lo = hi + 1
      hi = hi + step
      step = step * 2
      if hi >= size - 1 then
        hi = size - 1
        break
      end
    end
    while lo < hi do -- binary search in [lo, hi]: slot hi is inside the window
      local mid = floor((lo + hi) / 2)
      local v = slot(st, (head + mid) % size)
      if v and v > edge then
        hi = mid
      else
        lo = mid + 1
      end
    end
    st.hint, st.hint_at = lo, now
    return lo
  end

  -- sliding_quota's (remaining, reset).
  function quota_of(st)
    local remaining = available(st)
    if remaining >= 1 then
      local newest = newest_of(st)
      if newest and newest + st.period > st.now then
        return remaining, newest + st.period - st.now
      end
      return remaining, 0
    end
    return remaining, (st.at1 or at_of(st, 1)) - st.now
  end
end

local reply
if op == 'g' then
  local EMPTY = rep('\0', W)

  -- `count` slots from the oldest-first index `from`, as one string (slots never written read as free).
  local function read_slots(st, from, count)
    local start = (st.head + from) % st.size
    local first = math.min(count, st.size - start)
    local s = call('GETRANGE', st.key, HDR + start * W, HDR + (start + first) * W - 1)
    if count > first then
      s = s .. rep('\0', first * W - #s) .. call('GETRANGE', st.key, HDR, HDR + (count - first) * W - 1)
    end
    return s .. rep('\0', count * W - #s)
  end

  local function write_slots(st, from, s)
    local count = #s / W
    st.blk = false
    local start = (st.head + from) % st.size
    local first = math.min(count, st.size - start)
    call('SETRANGE', st.key, HDR + start * W, sub(s, 1, first * W))
    if count > first then
      call('SETRANGE', st.key, HDR, sub(s, first * W + 1))
    end
  end

  -- algorithms.sliding_give_back: drop k logged times equal to `taken` (units after the base).
  local function give_back(st, k, taken)
    local size = st.size
    if k > size then
      return
    end
    local newest = newest_of(st)
    if not newest or newest >= taken + st.period then
      return
    end
    local lo, hi = 0, size -- the first slot (oldest first) at or after `taken`
    while lo < hi do
      local mid = floor((lo + hi) / 2)
      local v = slot(st, (st.head + mid) % size)
      if v and v >= taken then
        hi = mid
      else
        lo = mid + 1
      end
    end
    if lo + k > size or slot(st, (st.head + lo + k - 1) % size) ~= taken then
      return
    end
    local newer = size - lo - k
    if newer > 0 then
      write_slots(st, lo, read_slots(st, lo + k, newer))
    end
    write_slots(st, size - k, rep(EMPTY, k))
    -- free slots now lead the log: the hint starts again from none
    st.head, st.newest, st.hint, st.hint_at, st.dirty, st.at1 = (st.head - k) % size, nil, 0, 0, true, nil
    save(st)
  end

  local taken_s, taken_ns = string.match(ARGV[at_deadline], '^(%d+) (%d+)$')
  reply = {}
  for i = 1, n do
    local j = 2 + 3 * i
    local st = load(i, ARGV[j] + 0, ARGV[j + 1] + 0, ARGV[j + 2] + 0)
    if taken_s then
      give_back(st, permits, div_floor((taken_s - st.base) * 1000000000 + taken_ns, st.unit))
    end
    reply[2 * i - 1], reply[2 * i] = quota_of(st)
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
  local states, ats = {}, {}
  for i = 1, n do
    local j = 2 + 3 * i
    local st = load(i, ARGV[j] + 0, ARGV[j + 1] + 0, ARGV[j + 2] + 0)
    states[i] = st
    local wait
    if permits > st.size then
      wait = math.max(1, st.period)
    else
      ats[i] = at_of(st, permits)
      wait = ats[i] - st.now
    end
    if wait > worst_wait then
      worst, worst_wait = i, wait
    end
  end
  if worst > 0 then
    reply = {worst, worst_wait}
  else
    for i = 1, n do
      write(states[i], ats[i], permits)
    end
    reply = report and {0, now_s, now_ns} or {0}
  end
  if op == 'M' then
    local quotas = {}
    for i = 1, n do
      quotas[2 * i - 1], quotas[2 * i] = quota_of(states[i])
    end
    reply = {reply, quotas}
  end
  for i = 1, n do
    save(states[i])
  end
else
  local st = load(1, ARGV[5] + 0, ARGV[6] + 0, ARGV[7] + 0)
  if op == 'a' or op == 'q' then
    if permits > st.size then
      reply = -st.period
    else
      local at = at_of(st, permits)
      local wait = at - st.now
      if timeout >= wait then
        write(st, at, permits)
        reply = wait
      else
        reply = -wait
      end
    end
    if op == 'q' then
      local remaining, reset = quota_of(st)
      reply = {reply, remaining, reset}
    end
  elseif op == 'd' then
    reply = available(st)
    if reply > 0 then
      write(st, st.now, reply)
    end
  else
    local remaining, reset = quota_of(st)
    reply = {0, remaining, (st.at1 or at_of(st, 1)) - st.now, reset}
  end
  save(st)
end
if now_us and ARGV[at_deadline] == '' then
  return {reply, {now_us}}
end
return reply
