-- Settle a finished request and append its events, atomically, in one round trip.
--
-- KEYS[1 .. n]   the rule keys the request was admitted with
-- KEYS[n + 1 ..] durable streams (dmxplatform.streams) to append to
-- ARGV[1]        the request id
-- ARGV[2]        tokens to give back: reserved minus used (negative when it used more)
-- ARGV[3]        the rules as JSON, [[kind, limit, param], ...] (as in admit.lua, with kind
--                "rt" for a token bucket, whose tokens are refunded)
-- ARGV[4 ..]     one payload per stream, in KEYS order
-- Token buckets and quotas get the difference back; concurrency slots are freed. Request
-- buckets are never refunded: the request happened.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local member = ARGV[1]
local refund = tonumber(ARGV[2])
local specs = cjson.decode(ARGV[3])
local rules = #specs

for i = 1, rules do
  local kind, limit, param = specs[i][1], specs[i][2], specs[i][3]
  local key = KEYS[i]
  if kind == 'rt' and refund ~= 0 then
    local stored = redis.call('HMGET', key, 'v', 't')
    if stored[1] then
      local since = tonumber(stored[2]) or now
      local level = math.min(limit, tonumber(stored[1]) + math.max(now - since, 0) * param + refund)
      redis.call('HSET', key, 'v', level, 't', now)
    end
  elseif kind == 'c' then
    redis.call('ZREM', key, member)
  elseif kind == 'q' and refund ~= 0 then
    if redis.call('EXISTS', key) == 1 then
      redis.call('DECRBY', key, refund)
    end
  end
end

for i = rules + 1, #KEYS do
  redis.call('XADD', KEYS[i], '*', 'e', ARGV[3 + i - rules])
end
return 1
