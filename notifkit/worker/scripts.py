"""The worker's Lua scripts: each does in one round trip, atomically, what would otherwise
take several (see the package docstring for the loop they serve)."""

# Touch the entries this consumer still owns (KEYS: streams; ARGV: group, consumer, then per
# stream its number of ids and the ids): XCLAIM to itself resets the idle time, JUSTID leaves
# the delivery count alone. An entry another consumer has taken over is left to it.
KEEP_ALIVE = """
local group, consumer = ARGV[1], ARGV[2]
local a, kept = 3, 0
for i, stream in ipairs(KEYS) do
  local n = tonumber(ARGV[a])
  for j = a + 1, a + n do
    local id = ARGV[j]
    if #redis.call('XPENDING', stream, group, id, id, 1, consumer) == 1 then
      redis.call('XCLAIM', stream, group, consumer, 0, id, 'JUSTID')
      kept = kept + 1
    end
  end
  a = a + n + 1
end
return kept
"""

# A consumer that stops with nothing pending leaves its group, so the group's consumers are
# the processes that read it, not every process that ever did. One with entries pending stays
# (XGROUP DELCONSUMER would drop them): another process reclaims them from it, and a later
# sweep of that process forgets it (a killed process's consumer too) once its heartbeat is gone.
FORGET_CONSUMER = """
local ok, held = pcall(redis.call, 'XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2])
if ok and #held == 0 then
  return redis.pcall('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
end
return -1
"""

# Compare-and-delete: only the entry that claimed a dedup mark may release it.
RELEASE_MARKS = """
local n = 0
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[1] then n = n + redis.call('DEL', key) end
end
return n
"""

# One call for a batch's attempt counters (KEYS: counters; ARGV: TTL, then each entry's stream,
# the counter's field): the new count of each.
COUNT_ATTEMPTS = """
local counts = {}
for i, key in ipairs(KEYS) do
  counts[i] = redis.call('INCR', key)
  redis.call('EXPIRE', key, ARGV[1])
end
return counts
"""

# Give back the attempt counted for each entry whose try met an outage (KEYS: counters): DECR
# only a counter still there, since one an ack deleted, or that expired, must not come back
# negative and without a TTL.
GIVE_BACK_ATTEMPTS = """
local n = 0
for i, key in ipairs(KEYS) do
  if redis.call('EXISTS', key) == 1 then
    redis.call('DECR', key)
    n = n + 1
  end
end
return n
"""

# Fill the free slots from the streams in priority order, in one round trip: XREADGROUP on
# each stream in turn (never blocking inside a script), each taking what the earlier ones
# left. KEYS: the streams, highest priority first. ARGV: group, consumer, free slots, then per
# stream the slots it must leave free (the reserve kept for the first stream). Returns whether
# every stream was read and left empty, then the replies as [stream, entries] pairs.
READ_IN_ORDER = """
local group, consumer, free = ARGV[1], ARGV[2], tonumber(ARGV[3])
local taken, out, emptied = 0, {}, 1
for i, stream in ipairs(KEYS) do
  local want = free - taken - tonumber(ARGV[3 + i])
  if want <= 0 then
    emptied = 0
    break
  end
  local reply = redis.call('XREADGROUP', 'GROUP', group, consumer, 'COUNT', want,
                           'STREAMS', stream, '>')
  if reply then
    local entries = reply[1][2]
    out[#out + 1] = reply[1]
    taken = taken + #entries
    if #entries >= want then emptied = 0 end
  end
end
return {emptied, out}
"""

# Settle a batch: XADD its outputs, then XACK its entries and delete their attempt counters.
# KEYS: output streams, then streams to ack on, then attempt counters. ARGV: how many outputs,
# how many ack streams, MAXLEN, group, then per output its number of field/value items and
# those items, then per ack stream its number of ids and the ids. Outputs come first so that a
# refused XADD aborts the script before anything is acked. Returns the outputs' new entry ids,
# in order (a dead-lettered entry's log line names its DLQ id, the one an operator replays).
SETTLE = """
local outputs, acks = tonumber(ARGV[1]), tonumber(ARGV[2])
local maxlen, group = ARGV[3], ARGV[4]
local a = 5
local ids = {}
for i = 1, outputs do
  local n = tonumber(ARGV[a])
  ids[i] = redis.call('XADD', KEYS[i], 'MAXLEN', '~', maxlen, '*', unpack(ARGV, a + 1, a + n))
  a = a + n + 1
end
for j = 1, acks do
  local n = tonumber(ARGV[a])
  a = a + 1
  local first = a
  while first < a + n do
    local last = math.min(first + 999, a + n - 1)
    redis.call('XACK', KEYS[outputs + j], group, unpack(ARGV, first, last))
    first = last + 1
  end
  a = a + n
end
local first = outputs + acks + 1
while first <= #KEYS do
  local last = math.min(first + 999, #KEYS)
  redis.call('DEL', unpack(KEYS, first, last))
  first = last + 1
end
return ids
"""
