-- The connection to the efim daemon: JSON-RPC 2.0 over its Unix socket, one object per line.
--
-- One connection at a time, opened on first use. Each connection has a generation number, so
-- that the document sync (sync.lua) knows when the daemon must be told about a file again (a
-- restarted daemon knows no documents). A request whose connection breaks before its reply (the
-- daemon restarted under it) is sent once more on a fresh connection. When the daemon cannot be
-- reached the user gets one warning, then silence until a connection succeeds again.
local uv = vim.uv or vim.loop

local R = {
  socket = nil, -- function returning the socket path (set by init.lua)
  gen = 0, -- generation of the current (or next) connection
  warned = false,
  noticed = false, -- the warning was drawn in insert mode
  stats = { connects = 0, failures = 0, retries = 0, requests = 0, replies = 0, partials = 0 },
}

local conn = nil -- { pipe, open, outbox, inbuf, gen }
local pending = {} -- id -> request entry (sent or queued, not answered)
local next_id = 0

-- One message; and once in insert mode, where "-- INSERT --" hides messages, `R.on_warning(msg)`
-- (set by init.lua) draws it in the buffer and returns true.
local function warn_unreachable(err)
  local msg = string.format("efim: daemon not reachable at %s (%s); start it with `efim daemon start`",
    R.socket(), tostring(err))
  if not R.warned then
    R.warned = true
    vim.notify(msg, vim.log.levels.WARN)
  end
  if not R.noticed and R.on_warning then
    local ok, drawn = pcall(R.on_warning, msg)
    R.noticed = ok and drawn or false
  end
end

-- A handler's error is one line in :messages, not a stack trace in the user's face.
local function run(fn, ...)
  local ok, err = pcall(fn, ...)
  if not ok then vim.notify("efim: " .. tostring(err):gsub("\n.*", ""), vim.log.levels.ERROR) end
end

local function on_message(line)
  local ok, msg = pcall(vim.json.decode, line)
  if not ok or type(msg) ~= "table" then return end
  if msg.id ~= nil and msg.method == nil then
    local e = pending[msg.id]
    if not e then return end
    pending[msg.id] = nil
    R.stats.replies = R.stats.replies + 1
    if e.handler then run(e.handler, msg) end
  elseif msg.method == "completion/partial" and type(msg.params) == "table" then
    local e = pending[msg.params.id]
    R.stats.partials = R.stats.partials + 1
    if e and e.on_partial and type(msg.params.text) == "string" then run(e.on_partial, msg.params.text, msg.params.id) end
  end
end

local send_entry

-- The connection `c` is gone: requests it carried are retried once on a fresh connection (when
-- it had been open), the others are answered with an error so that callers stop waiting.
local function lost(c, err)
  if c ~= conn then return end
  conn = nil
  pcall(function() if not c.pipe:is_closing() then c.pipe:close() end end)
  if not c.open then
    R.stats.failures = R.stats.failures + 1
    warn_unreachable(err)
  end
  local mine = {}
  for id, e in pairs(pending) do
    if e.gen == c.gen then
      pending[id] = nil
      table.insert(mine, e)
    end
  end
  table.sort(mine, function(a, b) return a.id < b.id end)
  for _, e in ipairs(mine) do
    if c.open and e.retries > 0 then
      e.retries = e.retries - 1
      R.stats.retries = R.stats.retries + 1
      send_entry(e)
    elseif e.handler then
      -- never connected: say so (no socket, refused), not "lost"
      local why = c.open and "connection to the daemon lost"
        or string.format("cannot connect to %s (%s)", R.socket(), tostring(err))
      run(e.handler, { id = e.id, error = { code = -32000, message = why } })
    end
  end
end

-- The current connection, opened (asynchronously) if there is none; returns its generation.
function R.connect()
  if conn then return conn.gen end
  R.gen = R.gen + 1
  local c = { pipe = uv.new_pipe(false), open = false, outbox = {}, inbuf = "", gen = R.gen }
  conn = c
  c.pipe:connect(R.socket(), function(err)
    vim.schedule(function()
      if err then return lost(c, err) end
      if c ~= conn then return end
      c.open = true
      R.warned, R.noticed = false, false
      R.stats.connects = R.stats.connects + 1
      local out = c.outbox
      c.outbox = {}
      for _, data in ipairs(out) do c.pipe:write(data) end
      c.pipe:read_start(function(rerr, chunk)
        if rerr or not chunk then
          vim.schedule(function() lost(c, rerr or "closed") end)
          return
        end
        c.inbuf = c.inbuf .. chunk
        local lines = {}
        while true do
          local nl = c.inbuf:find("\n", 1, true)
          if not nl then break end
          table.insert(lines, c.inbuf:sub(1, nl - 1))
          c.inbuf = c.inbuf:sub(nl + 1)
        end
        if #lines > 0 then
          vim.schedule(function() for _, l in ipairs(lines) do on_message(l) end end)
        end
      end)
    end)
  end)
  return c.gen
end

--- The generation of the current connection (open or opening), nil when there is none.
function R.connected_gen()
  return conn and conn.gen
end

local function write(data)
  R.connect()
  local c = conn
  if c.open then
    c.pipe:write(data, function(err)
      if err then vim.schedule(function() lost(c, err) end) end
    end)
  else
    table.insert(c.outbox, data)
  end
  return c.gen
end

send_entry = function(e)
  next_id = next_id + 1
  e.id = next_id
  local params = e.params
  if type(params) == "function" then params = params() end
  pending[e.id] = e
  e.gen = write(vim.json.encode({ jsonrpc = "2.0", id = e.id, method = e.method, params = params }) .. "\n")
  R.stats.requests = R.stats.requests + 1
  return e
end

--- Send a request. `params` is a table, or a function returning one (called again for a retry,
--- so that it can re-open the document first). `handler(msg)` gets the reply (or an error when
--- the connection was lost twice); `opts.on_partial(text, id)` gets streamed pieces; `opts.retry`
--- (default 1) is how often to resend on a fresh connection. Returns the entry: `entry.id` is
--- the id of its latest attempt.
function R.request(method, params, handler, opts)
  opts = opts or {}
  return send_entry({ method = method, params = params, handler = handler, on_partial = opts.on_partial,
                      retries = opts.retry or 1 })
end

--- Send a notification (no reply). Returns the connection generation it went to.
function R.notify(method, params)
  return write(vim.json.encode({ jsonrpc = "2.0", method = method, params = params }) .. "\n")
end

--- Forget a request (its reply, if any, is ignored).
function R.forget(entry)
  if entry and entry.id then pending[entry.id] = nil end
end

--- A request answered synchronously (for :checkhealth), or nil, error after `timeout_ms`.
function R.call_sync(method, params, timeout_ms)
  local reply
  R.request(method, params, function(msg) reply = msg end, { retry = 0 })
  vim.wait(timeout_ms or 2000, function() return reply ~= nil end, 10)
  if reply == nil then return nil, "no reply within " .. (timeout_ms or 2000) .. " ms" end
  if reply.error then return nil, reply.error.message end
  return reply.result
end

--- Close the connection (tests, :EfimDisable does not need it).
function R.close()
  if conn then lost(conn, "closed") end
end

return R
