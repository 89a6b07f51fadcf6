-- Check every limit of one request and reserve what it may use, atomically, in one round trip.
--
-- KEYS[i]   the Redis key of rule i
-- ARGV[1]   the request id (member of concurrency sets)
-- ARGV[2]   the tokens the request reserves
-- ARGV[3]   the rules as JSON, [[kind, cost, limit, param], ...] (one argument, made once per
--           rule set: a dozen arguments cost the caller more to send, and cjson decodes it in
--           a fifth of the time string patterns took)
--   cost: "t" for the reserved tokens, "m" for the reserved money, or a number (1 for a
--         request, 0 for a nonce)
--   kind 'r' token bucket:  limit = capacity, param = refill per ms
--   kind 'c' concurrency:   limit = slots, param = ms after which a slot is presumed leaked
--   kind 'q' period quota:  limit = tokens (or money: a budget) in the period, -1 for a soft
--                           budget that counts and never refuses; param = ttl ms
--   kind 'b' prepaid balance: money left; a request is admitted only if it covers the cost,
--                           which is taken from it; a balance not held yet refuses with retry
--                           -2 (the caller seeds it from the database and asks again)
--   kind 'n' replay nonce:  param = ttl ms
-- ARGV[4]   requests a lease should hold (0: no lease; apps/keys/leases.py)
-- ARGV[5]   tokens a lease should hold
-- ARGV[6]   the lease's id: its concurrency slots are members id:1 .. id:n
-- ARGV[7]   the fewest requests worth a lease
-- ARGV[8]   the money the request reserves, integer micro-units (apps.billing.money)
-- A lease is taken with the request, from the same buckets, slots and quotas, and is granted
-- only as far as it takes at most a quarter of what each rule has left after the request, so a
-- key near a limit is admitted one request at a time.
-- Rule sets with money rules never get a lease (the gateway does not ask): money held by a
-- gateway that died would stay held.
-- Returns {admitted, failed rule (0 if admitted), retry after ms (-1: never), lease requests,
-- lease tokens, then for each rule: remaining, ms until full again}. Time is Redis's own, so
-- every gateway agrees on it.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local member = ARGV[1]
local tokens = tonumber(ARGV[2])
local money = tonumber(ARGV[8]) or 0
local rules = cjson.decode(ARGV[3])
local per_token = {}  -- rules whose cost is the reserved tokens (a lease's tokens count there)
local per_money = {}  -- budgets and balances
for i = 1, #rules do
  if rules[i][2] == 't' then
    rules[i][2] = tokens
    per_token[i] = true
  elseif rules[i][2] == 'm' then
    rules[i][2] = money
    per_money[i] = true
  end
end
local count = #rules
local levels = {}
local room = {}  -- what each rule has left once this request is admitted
local expires = {}  -- quota keys without a ttl yet: set it when they are written
local report = {}

for i = 1, count do
  local kind, cost, limit, param = rules[i][1], rules[i][2], rules[i][3], rules[i][4]
  local key = KEYS[i]
  local remaining, reset, retry = 0, 0, nil
  if kind == 'r' then
    local stored = redis.call('HMGET', key, 'v', 't')
    local level = tonumber(stored[1]) or limit
    local since = tonumber(stored[2]) or now
    level = math.min(limit, level + math.max(now - since, 0) * param)
    levels[i] = level
    if cost > limit then
      retry = -1
    elseif level < cost then
      retry = math.ceil((cost - level) / param)
    end
    remaining = level - cost
    room[i] = remaining
    reset = math.ceil((limit - math.max(remaining, 0)) / param)
  elseif kind == 'c' then
    local used = redis.call('ZCARD', key)
    if used + 1 > limit then
      -- Only a full set is worth sweeping for slots whose request never settled.
      redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
      used = redis.call('ZCARD', key)
    end
    if used + 1 > limit then
      local oldest = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
      retry = 1000
      if oldest[2] then retry = math.min(retry, tonumber(oldest[2]) - now) end
    end
    remaining = limit - used - 1
    room[i] = remaining
  elseif kind == 'q' then
    local used = tonumber(redis.call('GET', key) or '0')
    reset = redis.call('PTTL', key)
    if reset < 0 then
      reset = param
      expires[i] = true
    end
    if limit >= 0 and cost > limit and per_money[i] then
      retry = -1  -- more than the whole budget: it will not fit in any period
    elseif limit >= 0 and used + cost > limit then
      retry = reset
    end
    remaining = limit - used - cost
    room[i] = remaining
  elseif kind == 'b' then
    local balance = redis.call('GET', key)
    if not balance then return {0, i, -2, 0, 0} end
    balance = tonumber(balance)
    if balance < cost then retry = -1 end
    remaining = balance - cost
    room[i] = 0
  elseif kind == 'n' then
    if redis.call('EXISTS', key) == 1 then retry = 0 end
    room[i] = 0  -- a nonce is good once: a signed request never comes with a lease
  end
  if retry ~= nil then
    if kind == 'q' and per_money[i] and retry >= 0 then
      -- A hard budget refuses before it is spent to the last unit: "<counter>:refused" says it
      -- turned a request away this period, for the budget-reached alert (same slot: the key's
      -- hash tag).
      redis.call('SET', key .. ':refused', 1, 'PX', param)
    end
    return {0, i, retry, 0, 0}
  end
  report[#report + 1] = math.max(math.floor(remaining), 0)
  report[#report + 1] = math.max(reset, 0)
end

local lease_requests = tonumber(ARGV[4]) or 0
local lease_tokens = 0
if lease_requests > 0 then
  lease_tokens = tonumber(ARGV[5])
  for i = 1, count do
    local share = math.floor(room[i] / 4)
    if per_token[i] then
      lease_tokens = math.min(lease_tokens, share)
    else
      lease_requests = math.min(lease_requests, share)
    end
  end
  local least = tonumber(ARGV[7])
  if lease_requests < least or lease_tokens < least * tokens then
    lease_requests, lease_tokens = 0, 0
  end
end
local slots = {}  -- score, member pairs for ZADD: the lease's slots, beside the request's
local lease_id = ARGV[6]
for j = 1, lease_requests do
  slots[#slots + 1] = 0
  slots[#slots + 1] = lease_id .. ':' .. j
end

for i = 1, count do
  local kind, cost, limit, param = rules[i][1], rules[i][2], rules[i][3], rules[i][4]
  local key = KEYS[i]
  local leased = lease_requests
  if per_token[i] then leased = lease_tokens end
  if kind == 'r' then
    redis.call('HSET', key, 'v', levels[i] - cost - leased, 't', now)
    redis.call('PEXPIRE', key, math.ceil(limit / param) + 1000)
  elseif kind == 'c' then
    for j = 1, #slots, 2 do slots[j] = now + param end
    redis.call('ZADD', key, now + param, member, unpack(slots))
    redis.call('PEXPIRE', key, param)
  elseif kind == 'q' then
    redis.call('INCRBY', key, cost + leased)
    if expires[i] then redis.call('PEXPIRE', key, param) end
  elseif kind == 'b' then
    redis.call('DECRBY', key, cost)
  elseif kind == 'n' then
    redis.call('SET', key, 1, 'PX', param)
  end
end

local result = {1, 0, 0, lease_requests, lease_tokens}
for _, value in ipairs(report) do result[#result + 1] = value end
return result
