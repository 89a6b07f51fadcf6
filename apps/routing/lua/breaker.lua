-- Record one outcome of a request to a node in its circuit breaker, shared by every gateway.
--
-- KEYS[1]  the breakers hash (field: node id, value: "state failures opened_at_ms")
-- KEYS[2]  the node's probe key (held by the one request let through while half-open)
-- ARGV[1]  node id; ARGV[2] "1" for a failure, "0" for a success; ARGV[3] failures to open
-- Returns the breaker's new state: "closed", or "open <opened_at_ms>".
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local raw = redis.call('HGET', KEYS[1], ARGV[1])
local state, failures = 'closed', 0
if raw then
  local fields = {}
  for word in string.gmatch(raw, '%S+') do fields[#fields + 1] = word end
  state, failures = fields[1], tonumber(fields[2])
end
if ARGV[2] == '0' then
  redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('DEL', KEYS[2])
  return 'closed'
end
failures = failures + 1
if state == 'open' or failures >= tonumber(ARGV[3]) then
  -- A failed probe, or the threshold reached: open (again) from now.
  redis.call('HSET', KEYS[1], ARGV[1], 'open ' .. failures .. ' ' .. now)
  redis.call('DEL', KEYS[2])
  return 'open ' .. now
end
redis.call('HSET', KEYS[1], ARGV[1], 'closed ' .. failures .. ' 0')
return 'closed'
