-- A cluster-wide bulkhead: at most ARGV[2] leases alive at once, over every process of every host.
--
-- KEYS[1] leases  ZSET  lease id -> expiry (server ms); a lease past its expiry is a slot given back
-- KEYS[2] queue   ZSET  waiting lease id -> arrival sequence (FIFO)
-- KEYS[3] waiters HASH  waiting lease id -> "<deadline ms>|<wake list key of its process>"
-- KEYS[4] seq     STRING arrival counter of the queue
-- KEYS[5] stats   HASH  "issued": leases ever granted, "released": leases ever given back by a release (no expiry)
--                       issued - released - alive = leases given back by their TTL (a worker killed or stalled)
-- The wake lists (one per process, named by the waiters) share the keys' hash tag, so one slot holds all.
--
-- ARGV[1] op, ARGV[2] max_concurrent_calls, ARGV[3] lease TTL (ms), then per op:
--   acquire  ARGV[4] lease id, ARGV[5] wait budget (ms, 0: never queue), ARGV[6] this process's wake list
--            -> {1, count} granted, {0, count} rejected, {2, count} queued (the grant arrives on the wake list)
--   cancel   ARGV[4] lease id of a waiter giving up -> {1, count} it was granted meanwhile (keeps it), else {0, count}
--   release  ARGV[4..] lease ids -> {released, count}
--   renew    ARGV[4..] lease ids -> {count, lost id, ...} (lost: expired before this renewal)
--   count    -> {count, leases ever issued, leases ever released}
-- Time is the server's (TIME), so hosts agree. Every write extends the keys' life to cover what they hold.

local L, Q, W, SEQ, S = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local op = ARGV[1]
local max = tonumber(ARGV[2])
local ttl = tonumber(ARGV[3])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- Drop expired leases, then hand free slots to the oldest waiters still inside their budget.
local function pump()
  redis.call('ZREMRANGEBYSCORE', L, '-inf', now)
  local n = redis.call('ZCARD', L)
  while n < max do
    local head = redis.call('ZRANGE', Q, 0, 0)
    if #head == 0 then break end
    local id = head[1]
    redis.call('ZREM', Q, id)
    local info = redis.call('HGET', W, id)
    redis.call('HDEL', W, id)
    if info then
      local sep = string.find(info, '|', 1, true)
      if tonumber(string.sub(info, 1, sep - 1)) > now then
        redis.call('ZADD', L, now + ttl, id)
        redis.call('HINCRBY', S, 'issued', 1)
        n = n + 1
        local wake = string.sub(info, sep + 1)
        redis.call('RPUSH', wake, id)
        redis.call('PEXPIRE', wake, ttl)
      end
    end
  end
  return n
end

local function keep(ms)
  -- Only ever lengthen: another caller's longer lease or wait must not be cut short.
  for _, key in ipairs({L, Q, W, SEQ}) do
    if redis.call('PEXPIRE', key, ms, 'GT') == 0 then redis.call('PEXPIRE', key, ms, 'NX') end
  end
end

if op == 'acquire' then
  local id, wait = ARGV[4], tonumber(ARGV[5])
  local n = pump()
  if n < max and redis.call('ZCARD', Q) == 0 then
    redis.call('ZADD', L, now + ttl, id)
    redis.call('HINCRBY', S, 'issued', 1)
    keep(ttl)
    return {1, n + 1}
  end
  if wait <= 0 or max <= 0 then
    return {0, n}
  end
  redis.call('ZADD', Q, redis.call('INCR', SEQ), id)
  redis.call('HSET', W, id, tostring(now + wait) .. '|' .. ARGV[6])
  keep(wait + ttl)
  return {2, n}
elseif op == 'cancel' then
  local id = ARGV[4]
  redis.call('ZREM', Q, id)
  redis.call('HDEL', W, id)
  local n = pump()
  if redis.call('ZSCORE', L, id) then
    return {1, n}
  end
  return {0, n}
elseif op == 'release' then
  local released = 0
  for i = 4, #ARGV do
    released = released + redis.call('ZREM', L, ARGV[i])
  end
  if released > 0 then redis.call('HINCRBY', S, 'released', released) end
  return {released, pump()}
elseif op == 'renew' then
  redis.call('ZREMRANGEBYSCORE', L, '-inf', now)
  local lost = {}
  for i = 4, #ARGV do
    if redis.call('ZADD', L, 'XX', 'CH', now + ttl, ARGV[i]) == 0 and not redis.call('ZSCORE', L, ARGV[i]) then
      lost[#lost + 1] = ARGV[i]
    end
  end
  local n = pump()
  if n > 0 then keep(ttl) end
  local out = {n}
  for _, id in ipairs(lost) do out[#out + 1] = id end
  return out
elseif op == 'count' then
  local stats = redis.call('HMGET', S, 'issued', 'released')
  return {redis.call('ZCOUNT', L, '(' .. now, '+inf'), tonumber(stats[1] or '0'), tonumber(stats[2] or '0')}
end
return redis.error_reply('unknown bulkhead op ' .. tostring(op))
