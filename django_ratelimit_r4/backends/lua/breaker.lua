-- A cluster-wide circuit breaker's shared state: one hash per breaker, changed only by these operations.
--
-- KEYS[1] HASH  e epoch (bumped by every transition), s state (core State value: 0 CLOSED, 1 OPEN,
--               2 HALF_OPEN, 3 DISABLED, 4 FORCED_OPEN, 5 METRICS_ONLY), u OPEN until (server ms),
--               a attempts (openings since the last CLOSED), c/f/l half-open outcomes (calls, failed, slow)
-- KEYS[2] ZSET  the half-open trials in flight: trial id -> expiry (server ms). A trial whose worker died
--               (kill -9 mid-call) expires and gives its place back, so the cluster cannot stay HALF_OPEN
--               for ever waiting for its outcome.
-- ARGV[1] op, ARGV[2] channel (every transition is published there as "epoch|state|remaining ms|attempts|origin"),
-- ARGV[3] origin (the publishing process's token), then per op:
--   load                                           -> snapshot
--   set      ARGV[4] expected epoch (-1: any), ARGV[5] state, ARGV[6] open wait (ms), ARGV[7] attempts
--            -> {1, snapshot...} applied, {0, snapshot...} another transition came first (compare-and-set)
--   trial    ARGV[4] epoch the caller saw, ARGV[5] permitted trials, ARGV[6] trial id, ARGV[7] trial TTL (ms)
--            OPEN at that epoch becomes HALF_OPEN; in HALF_OPEN one of the permitted trials is taken
--            -> {1, snapshot...} a trial call may run, {0, snapshot...} refused
--   outcome  ARGV[4] epoch of the trial, ARGV[5] failed (0/1), ARGV[6] slow (0/1), ARGV[7] outcomes needed,
--            ARGV[8] failure rate threshold, ARGV[9] slow rate threshold, ARGV[10] open wait if it reopens (ms),
--            ARGV[11] trial id
--            -> {2, snapshot...} the outcome decided a transition, {1, ...} counted, {0, ...} too late
--   release  ARGV[4] epoch of the trial (unused), ARGV[5] trial id: gives an unused trial back -> {1 or 0, snapshot...}
-- A snapshot is {epoch, state, remaining open ms, attempts}. Time is the server's (TIME), so hosts agree.

local K, T = KEYS[1], KEYS[2]
local op, channel, origin = ARGV[1], ARGV[2], ARGV[3]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local OPEN, HALF_OPEN, CLOSED = 1, 2, 0

local h = redis.call('HMGET', K, 'e', 's', 'u', 'a')
local e = tonumber(h[1]) or 0
local s = tonumber(h[2]) or -1 -- -1: never written (each process starts in its initial_state)
local u = tonumber(h[3]) or 0
local a = tonumber(h[4]) or 0

local function remaining()
  if s == OPEN then
    local r = u - now
    if r < 0 then return 0 end
    return r
  end
  return 0
end

local function transition(to, wait_ms, attempts)
  e = e + 1
  s = to
  a = attempts
  if to == OPEN then u = now + wait_ms else u = 0 end
  redis.call('HSET', K, 'e', e, 's', s, 'u', u, 'a', a, 'c', 0, 'f', 0, 'l', 0)
  redis.call('DEL', T)
  redis.call('PUBLISH', channel, e .. '|' .. s .. '|' .. remaining() .. '|' .. a .. '|' .. origin)
end

local function reply(code)
  return {code, e, s, remaining(), a}
end

if op == 'load' then
  return reply(1)
elseif op == 'set' then
  local expected = tonumber(ARGV[4])
  if expected >= 0 and expected ~= e then return reply(0) end
  transition(tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]))
  return reply(1)
elseif op == 'trial' then
  local seen = tonumber(ARGV[4])
  if s == OPEN and e == seen then transition(HALF_OPEN, 0, a) end
  if s == HALF_OPEN then
    redis.call('ZREMRANGEBYSCORE', T, '-inf', now) -- trials of dead workers give their place back
    if redis.call('ZCARD', T) < tonumber(ARGV[5]) then
      local ttl = tonumber(ARGV[7])
      redis.call('ZADD', T, now + ttl, ARGV[6])
      redis.call('PEXPIRE', T, ttl)
      return reply(1)
    end
  end
  return reply(0)
elseif op == 'outcome' then
  if e ~= tonumber(ARGV[4]) or s ~= HALF_OPEN then return reply(0) end
  redis.call('ZREM', T, ARGV[11])
  local c = redis.call('HINCRBY', K, 'c', 1)
  local f = redis.call('HINCRBY', K, 'f', tonumber(ARGV[5]))
  local l = redis.call('HINCRBY', K, 'l', tonumber(ARGV[6]))
  if c < tonumber(ARGV[7]) then return reply(1) end
  -- Resilience4j's verdict over the trial window: rate >= threshold opens again, else the breaker closes.
  if f * 100.0 / c >= tonumber(ARGV[8]) or l * 100.0 / c >= tonumber(ARGV[9]) then
    transition(OPEN, tonumber(ARGV[10]), a + 1)
  else
    transition(CLOSED, 0, 0)
  end
  return reply(2)
elseif op == 'release' then
  -- By id alone (ids are unique; every transition empties the set): a caller cancelled while its trial
  -- was being taken does not know the epoch it was granted in.
  return reply(redis.call('ZREM', T, ARGV[5]))
end
return redis.error_reply('unknown op ' .. tostring(op))
