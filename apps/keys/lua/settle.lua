-- Give back what a finished request (or an ended lease) did not use, and append events,
-- atomically, in one round trip.
--
-- KEYS[1 .. n]   the rule keys the request or lease was admitted with
-- KEYS[n + 1 ..] durable streams (dmxplatform.streams) to append to
-- ARGV[1]        tokens to give back: reserved minus used (negative when it used more)
-- ARGV[2]        requests to give back: 0 for a request (it happened), a lease's unused ones
-- ARGV[3]        money to give back: reserved minus cost, micro-units (negative: it cost more)
-- ARGV[4]        the rules as JSON, [[kind, limit, param], ...] (as in admit.lua, with kind
--                "rt" for a token bucket, whose tokens are given back, and "qm" for a budget);
--                last, for a request that may run again under its id, its marker:
--                ["o", tokens reserved, money reserved, ms to keep the marker]
-- ARGV[5]        m, the number of concurrency slot members to free
-- ARGV[6 .. 5+m] the members: a request's id or lease slot, a lease's unused slots
-- ARGV[6+m ..]   one payload per stream, in KEYS order
-- Token buckets and quotas get tokens back, request buckets requests, budgets and balances
-- money; slots are freed. A counter that is gone (its period over, or lost with Redis and not
-- seeded again yet) is left alone: what it held went with it.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local tokens = tonumber(ARGV[1])
local requests = tonumber(ARGV[2])
local money = tonumber(ARGV[3])
local specs = cjson.decode(ARGV[4])
local members = tonumber(ARGV[5])
local rules = #specs

-- A request that may run again under its id (a batch line whose worker was lost after this
-- call and before it kept the answer) is counted once. The ledger keeps the first try's record
-- only, so a try that finds the marker set gives back all it reserved.
local marker = specs[rules]
if marker and marker[1] == 'o' then
  if not redis.call('SET', KEYS[rules], 1, 'NX', 'PX', marker[4]) then
    tokens, money = marker[2], marker[3]
  end
end

local function refill(key, limit, param, amount)
  local stored = redis.call('HMGET', key, 'v', 't')
  if stored[1] then
    local since = tonumber(stored[2]) or now
    local level = math.min(limit, tonumber(stored[1]) + math.max(now - since, 0) * param + amount)
    redis.call('HSET', key, 'v', level, 't', now)
  end
end

for i = 1, rules do
  local kind, limit, param = specs[i][1], specs[i][2], specs[i][3]
  local key = KEYS[i]
  if kind == 'rt' and tokens ~= 0 then
    refill(key, limit, param, tokens)
  elseif kind == 'r' and requests ~= 0 then
    refill(key, limit, param, requests)
  elseif kind == 'c' and members > 0 then
    redis.call('ZREM', key, unpack(ARGV, 6, 5 + members))
  elseif kind == 'q' and tokens ~= 0 then
    if redis.call('EXISTS', key) == 1 then
      redis.call('DECRBY', key, tokens)
    end
  elseif kind == 'qm' and money ~= 0 then
    if redis.call('EXISTS', key) == 1 then
      redis.call('DECRBY', key, money)
    end
  elseif kind == 'b' and money ~= 0 then
    -- A cost above its hold (a prompt the gateway could only estimate) takes the balance to
    -- zero, never below: the book charges what is left and counts the shortfall.
    if redis.call('EXISTS', key) == 1 and redis.call('INCRBY', key, money) < 0 then
      redis.call('SET', key, 0)
    end
  end
end

for i = rules + 1, #KEYS do
  redis.call('XADD', KEYS[i], '*', 'e', ARGV[5 + members + i - rules])
end
return 1
