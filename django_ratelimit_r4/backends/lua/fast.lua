-- fast.lua: the start of the ONE rate-limiter script (then decide.lua, then ratelimiter.lua, which documents
-- every argument and reply). It reads the time, refuses a late call, and decides the common acquire inline.
--
-- Redis CPU is the capacity of every cluster-wide quota, so this part creates no closure (each `local
-- function` is a new closure on every call), reads the state before the anchor (a state stores the anchor
-- it was written under, so a state written under the anchor the client cached proves that anchor without a
-- GET), and writes with KEEPTTL when the expiry cannot have changed. Anything unusual (no cached anchor, a
-- base too far back, a state from another anchor) falls through to ratelimiter.lua's exact general path.
-- The decision is backends/base.py's decide(), inlined; the property test replays it against the memory
-- backend through this path and the general one.

local op = ARGV[1]
-- ARGV[at], ARGV[at + 1]: now_s, now_ns of a caller on its own clock (absent: server TIME); ARGV[at - 1]:
-- the deadline in server microseconds ('' for none).
local at = 11
-- "A" and "Q" are "a" and "q" of ONE permit WITHOUT waiting (what a request asks), without the permits and
-- timeout arguments: 8 arguments instead of 10 (each costs the server ~560 instructions, and a 9th one more
-- growth of the ARGV table: benchmarks/bench_redis_script_parts.py).
local one = op == 'A' or op == 'Q'
if one then
  at = 9
elseif op == 'm' or op == 'M' or op == 'g' then
  at = 5 + 6 * ARGV[3]
elseif op == 'r' then
  at = 3
end
local now_us, now_s, now_ns, slack
if ARGV[at] then
  now_s, now_ns, slack = ARGV[at] + 0, ARGV[at + 1] + 0, 3600000
else
  -- (x + 0 turns a numeric string into a number like tonumber(x), without a function call.)
  local t = redis.call('TIME')
  local us = t[2] + 0
  now_s, slack = t[1] + 0, 1
  now_us = now_s * 1000000 + us
  now_ns = us * 1000
  local deadline = ARGV[at - 1]
  if deadline ~= '' and now_us > deadline + 0 and op ~= 'g' then -- ("g" carries a time of its own there)
    -- The caller has given up (its socket timeout passed): change nothing.
    return redis.status_reply('LATE')
  end
end

-- The fast path of "A" and "Q": "a"'s below for one limiter, one permit and no wait, straight (no loop, no
-- table). A grant within the stored cycle rewrites only the permissions' digits in place (SETRANGE: the
-- expiry stays, as KEEPTTL; the state is byte for byte what SET would write). "Q" answers one integer when
-- it can (see ratelimiter.lua): a table reply costs the server ~4 000 instructions more.
if one then
  local ARGV, call = ARGV, redis.call -- (locals: a global lookup each time otherwise)
  local token, elapsed = ARGV[2], -1
  local c, p, a
  if token ~= '' then
    local state = call('GET', KEYS[2])
    if state then
      c, p, a = string.match(state, '^(%-?%d+) (%-?%d+) (.*)$')
    end
    if a == token or call('GET', KEYS[1]) == token then
      if a ~= token then
        c = nil -- the cached anchor is current; a state of another anchor is stale (full)
      end
      if not now_us then
        elapsed = ARGV[3] + 0
      elseif ARGV[7] == '1000' then
        elapsed = (now_us - ARGV[3]) * 1000
      else
        elapsed = (now_us - ARGV[3]) * ARGV[7]
      end
    end
  end
  if elapsed >= 0 and elapsed < 4503599627370496 then -- 2^52: elapsed + period stays exact
    local period = ARGV[6] + 0
    -- (cycle, offset) = divmod(elapsed, period), exact below 2^53 (see the general path below).
    local offset = elapsed % period
    if offset < 0 then
      offset = offset + period
    elseif offset >= period then
      offset = offset - period
    end
    local current = ARGV[4] + (elapsed - offset) / period
    local limit = ARGV[5] -- (a string until needed)
    local same, cycle = false, c
    if c then
      local digits = p
      c, p = c + 0, p + 0
      if c == current then
        same = digits -- this cycle's state: a grant keeps its expiry
      else
        limit = limit + 0
        if c > current then
          p = limit -- a state from a later cycle (the server clock stepped back): full, as ratelimiter.lua
        else
          p = math.min(p + (current - c) * limit, limit)
        end
      end
    else
      limit = limit + 0
      p = limit
    end
    if p >= 1 then
      local left = p - 1
      if same then
        -- (%d prints an integer-valued double through a C long: exact below 2^53)
        local digits = string.format('%d', left)
        if #digits == #same then
          call('SETRANGE', KEYS[2], '0', cycle .. ' ' .. digits)
        else
          call('SET', KEYS[2], string.format('%d %s ', current, digits) .. token, 'KEEPTTL')
        end
      else
        -- Expires when lazily refreshed to full: after div_ceil(limit - left, limit) cycles from this one.
        limit = limit + 0
        local m = limit - left + limit - 1
        local d = math.floor(m / limit)
        if d * limit > m then
          d = d - 1
        elseif (d + 1) * limit <= m then
          d = d + 1
        end
        local ms = string.format('%d', math.min(math.ceil((d * period - offset) / (1000 * ARGV[7])) + slack, 1e15))
        call('SET', KEYS[2], string.format('%d %d ', current, left) .. token, 'PX', ms)
      end
      if op == 'A' then
        return 0
      end
      -- "Q" granted: remaining left, reset the time to the next cycle (left >= 0), wait 0: one integer
      -- 2 * (left * (period + 1) + reset) (reset is 1..period), or with period and reset in thousands of
      -- units when both are whole ones (server time counts whole µs: an hourly limit of up to ~10^6
      -- permits fits) 2 * (left * (period / 1000 + 1) + reset / 1000) + 1, while exact; else "q"'s table.
      local reset = period - offset
      local n
      if reset % 1000 == 0 and period % 1000 == 0 then
        n = 2 * (left * (period / 1000 + 1) + reset / 1000) + 1
      else
        n = 2 * (left * (period + 1) + reset)
      end
      if n < 9007199254740992 then
        return n
      end
      return {0, left, reset}
    end
    -- Rejected: the wait for one permit (base.nanos_to_wait), the time to the next cycle plus
    -- div_ceil(1 - (p + limit), limit) = floor(-p / limit) whole periods while in debt. It is also the reset.
    local wait = period - offset
    if p < 0 then
      limit = limit + 0
      if -p >= limit then
        local d = math.floor(-p / limit)
        if d * limit > -p then
          d = d - 1
        elseif (d + 1) * limit <= -p then
          d = d + 1
        end
        wait = wait + d * period
      end
    end
    if op == 'A' or p == 0 then
      return -wait -- ("Q": remaining 0, reset = wait)
    end
    return {-wait, p, wait}
  end
  -- No cached anchor, a stale one, a base too far back: the exact slow path (ratelimiter.lua).
  if op == 'A' then
    op = 'a'
  else
    op = 'q'
  end
end

-- 'q' and 'M' are 'a' and 'm' whose reply also carries the RateLimit header figures (see ratelimiter.lua).
local many, quota = op == 'm' or op == 'M', op == 'q' or op == 'M'

-- The fast path of "a" (acquire), "s" (state) and "m" (all-or-nothing): every limiter's state proves the
-- client's cached anchor (or the anchor does) and its base is recent. Otherwise: ratelimiter.lua.
if not one and (op == 'a' or op == 's' or many or quota) then
  local n, j, permits, timeout = 1, 2, 0, 0
  -- Redis CPU: every string -> number conversion (x + 0: strtod) costs about as much as 30 VM instructions
  -- (benchmarks/bench_redis_script_parts.py), so the usual values are recognised by comparing with a
  -- constant (strings are interned: a pointer comparison) and only the others are converted.
  if many then
    n, j, permits = ARGV[3] + 0, 4, ARGV[2]
  else
    permits, timeout = ARGV[8], ARGV[9]
    if timeout == '0' then
      timeout = 0
    else
      timeout = timeout + 0
    end
  end
  if permits == '1' then
    permits = 1
  else
    permits = permits + 0
  end
  local fast = true
  local pending, rejecting
  local worst, worst_wait, worst_ns = 0, 0, -1
  -- "M": per limiter, the permissions before this decision, period, offset, limit. "q": the same in locals
  -- (no table: a single decision stays as cheap as "a"), with the signed wait.
  local figures = many and quota and {}
  local qwait, qleft, qperiod, qoffset, qlimit
  for i = 1, n do
    local token = ARGV[j]
    if token == '' then
      fast = false
      break
    end
    local state = redis.call('GET', KEYS[2 * i])
    local c, p, a
    if state then
      c, p, a = string.match(state, '^(%-?%d+) (%-?%d+) (.*)$')
    end
    local valid = a == token
    if not valid and redis.call('GET', KEYS[2 * i - 1]) == token then
      valid, c = true, nil -- the cached anchor is current; a state of another anchor is stale (full)
    end
    local elapsed = -1
    if valid then
      if now_us then
        local m = ARGV[j + 5]
        if m == '1000' then
          elapsed = (now_us - ARGV[j + 1]) * 1000
        else
          elapsed = (now_us - ARGV[j + 1]) * m
        end
      else
        elapsed = ARGV[j + 1] + 0
      end
    end
    if elapsed < 0 or elapsed >= 4503599627370496 then -- 2^52: elapsed + period stays exact
      fast = false
      break
    end
    -- (limit stays a string until needed: a grant within the stored cycle that leaves no debt never reads it)
    local limit, period = ARGV[j + 3], ARGV[j + 4] + 0
    -- (cycle, offset) = divmod(elapsed, period), exact below 2^53: Lua's % rounds a / b, so the remainder
    -- may be one period off; elapsed - offset is then an exact multiple of the period.
    local offset = elapsed % period
    if offset < 0 then
      offset = offset + period
    elseif offset >= period then
      offset = offset - period
    end
    local current = ARGV[j + 2] + (elapsed - offset) / period
    -- base.refresh; keep: the stored state is of this cycle and not in debt, so its expiry (the end of
    -- this cycle) stays right as long as the new permissions are not in debt either.
    local keep = false
    if c then
      c, p = c + 0, p + 0
      if c == current then
        keep = p >= 0
      else
        limit = limit + 0
        if c > current then
          p = limit -- a state from a later cycle (the server clock stepped back): full, as ratelimiter.lua
        else
          p = math.min(p + (current - c) * limit, limit)
        end
      end
    else
      limit = limit + 0
      p = limit
    end
    if not keep or p < permits or timeout < 0 or figures or quota then
      limit = limit + 0 -- (a number already: no conversion)
    end
    -- base.nanos_to_wait: the time to the next cycle plus div_ceil(deficit, limit) whole periods.
    local wait = 0
    if p < permits then
      wait = period - offset
      local m = permits - (p + limit) + limit - 1
      if m >= limit then -- div_ceil is 0 for every m < limit reached here (m > -1 since p < permits)
        local d = math.floor(m / limit)
        if d * limit > m then
          d = d - 1
        elseif (d + 1) * limit <= m then
          d = d + 1
        end
        wait = wait + d * period
      end
    end
    if op == 's' then
      return {current, p, wait, period - offset}
    end
    if figures then
      local k = 4 * i
      figures[k - 3], figures[k - 2], figures[k - 1], figures[k] = p, period, offset, limit
    end
    if timeout < wait then
      if not many then
        if quota then
          qwait, qleft, qperiod, qoffset, qlimit = -wait, p, period, offset, limit
          break
        end
        return -wait
      end
      -- All-or-nothing: remember every rejecting limiter and the longest wait (compared in ns: the units
      -- of two limiters may differ), and reserve nothing anywhere.
      rejecting = rejecting or {}
      rejecting[#rejecting + 1] = i
      local wait_ns = wait * 1000 / ARGV[j + 5]
      if wait_ns > worst_ns then
        worst, worst_wait, worst_ns = i, wait, wait_ns
      end
    elseif not rejecting then
      p = p - permits
      -- %d prints an integer-valued double through a C long: exact below 2^53 and much cheaper than the
      -- %.14g of tostring / concatenation (about 1 µs per decision).
      local value = string.format('%d %d ', current, p) .. token
      local ms = false
      if not (keep and p >= 0) then
        -- Expires when lazily refreshed to full: after div_ceil(limit - p, limit) cycles from this one.
        local m = limit - p + limit - 1
        local d = math.floor(m / limit)
        if d * limit > m then
          d = d - 1
        elseif (d + 1) * limit <= m then
          d = d + 1
        end
        -- (a string: redis.call formats a Lua number with %.17g, several times the cost of %d)
        ms = string.format('%d', math.min(math.ceil((d * period - offset) / (1000 * ARGV[j + 5])) + slack, 1e15))
      end
      if not many then
        if ms then
          redis.call('SET', KEYS[2], value, 'PX', ms)
        else
          redis.call('SET', KEYS[2], value, 'KEEPTTL')
        end
        if not quota then
          return wait
        end
        qwait, qleft, qperiod, qoffset, qlimit = wait, p, period, offset, limit
        break
      end
      pending = pending or {}
      pending[#pending + 1] = KEYS[2 * i]
      pending[#pending + 1] = value
      pending[#pending + 1] = ms
    end
    j = j + 6
  end
  -- The header figures after this decision, as 's' would read them: (remaining, time to the next cycle)
  -- while a permit is left, else (remaining, the wait for one permit), in each limiter's unit.
  if qwait then
    local reset = qperiod - qoffset
    if qleft < 0 and -qleft >= qlimit then
      local d = math.floor(-qleft / qlimit)
      if d * qlimit > -qleft then
        d = d - 1
      elseif (d + 1) * qlimit <= -qleft then
        d = d + 1
      end
      reset = reset + d * qperiod
    end
    return {qwait, qleft, reset}
  end
  local qreply
  if fast and figures then
    local granted = not rejecting
    qreply = {}
    local reply = qreply
    for k = 1, #figures, 4 do
      local left, period, offset, limit = figures[k], figures[k + 1], figures[k + 2], figures[k + 3]
      if granted then
        left = left - permits
      end
      local reset = period - offset
      if left < 0 and -left >= limit then
        local d = math.floor(-left / limit)
        if d * limit > -left then
          d = d - 1
        elseif (d + 1) * limit <= -left then
          d = d + 1
        end
        reset = reset + d * period
      end
      reply[#reply + 1] = left
      reply[#reply + 1] = reset
    end
    if rejecting then
      reply[#reply + 1] = worst
      reply[#reply + 1] = worst_wait
      for k = 1, #rejecting do
        reply[#reply + 1] = rejecting[k]
      end
      return reply
    end
  end
  if fast then
    if rejecting then
      local reply = {worst, worst_wait}
      for k = 1, #rejecting do
        reply[k + 2] = rejecting[k]
      end
      return reply
    end
    for k = 1, #pending, 3 do
      if pending[k + 2] then
        redis.call('SET', pending[k], pending[k + 1], 'PX', pending[k + 2])
      else
        redis.call('SET', pending[k], pending[k + 1], 'KEEPTTL')
      end
    end
    if qreply then
      qreply[#qreply + 1] = 0
      return qreply
    end
    return {0}
  end
end
