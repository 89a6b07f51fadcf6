-- Settle a finished request and record its usage, atomically, in one round trip.
--
-- KEYS[1 .. n]  the rule keys the request was admitted with; KEYS[n + 1] the usage stream
-- ARGV[1]       the request id
-- ARGV[2]       tokens to give back: reserved minus used (negative when it used more)
-- ARGV[3]       the usage event, appended to the stream
-- ARGV[4+3(i-1) .. 6+3(i-1)]  rule i: kind, limit, param (as in admit.lua)
-- Token buckets and quotas get the difference back; concurrency slots are freed. Request
-- buckets are never refunded: the request happened.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local member = ARGV[1]
local refund = tonumber(ARGV[2])
local rules = #KEYS - 1

for i = 1, rules do
  local base = 4 + (i - 1) * 3
  local kind = ARGV[base]
  local limit = tonumber(ARGV[base + 1])
  local param = tonumber(ARGV[base + 2])
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

return redis.call('XADD', KEYS[rules + 1], '*', 'e', ARGV[3])
