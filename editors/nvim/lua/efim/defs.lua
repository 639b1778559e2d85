-- Definitions of the names a buffer imports, as the buffer's language servers resolve them: "go to
-- definition" on each identifier of its import lines. The locations go to the daemon (`definitions`),
-- which puts those definitions in the file's repository context (T1) while idle, where its own parser
-- resolves less (other languages, unusual imports). Nothing is sent without a language server that
-- answers definitions, and nothing when the result is what was sent last.
local rpc = require("efim.rpc")

local D = { sent = {} } -- path -> the last list sent and the connection it went on (a new daemon gets it again)
local MAX_NAMES = 32 -- identifiers asked about per buffer
local SCAN_LINES = 200 -- import lines are looked for in the buffer's first lines
local TIMEOUT_MS = 3000
local SKIP = { import = true, from = true, as = true, require = true, use = true, include = true, package = true,
               const = true, let = true, var = true, export = true, default = true, type = true, ["local"] = true }

local function import_line(s) -- the daemon's test for lines that may import (repo/discover.py imports_fingerprint)
  return s:find("import", 1, true) or s:find("require(", 1, true) or s:match("^%s*from ") or s:match("^%s*use ")
      or s:match("^%s*#include") or s:match("^%s*package ")
end

local function clients(bufnr)
  local list = vim.lsp.get_clients and vim.lsp.get_clients({ bufnr = bufnr })
      or vim.tbl_values(vim.lsp.buf_get_clients(bufnr))
  return vim.tbl_filter(function(c)
    return c.server_capabilities ~= nil and c.server_capabilities.definitionProvider ~= nil
        and c.server_capabilities.definitionProvider ~= false
  end, list)
end

-- Column of byte `byte` (0-based) of `line` in the client's position encoding.
local function column(line, byte, encoding)
  if encoding == "utf-8" then return byte end
  local units = 0
  for i = 1, byte do
    local b = line:byte(i)
    if b < 0x80 or b >= 0xC0 then units = units + 1 end -- a character's first byte
    if b >= 0xF0 and encoding ~= "utf-32" then units = units + 1 end -- a surrogate pair in UTF-16
  end
  return units
end

-- The 0-based (row, byte column) of each identifier on the buffer's import lines.
local function names(bufnr)
  local out = {}
  for row, line in ipairs(vim.api.nvim_buf_get_lines(bufnr, 0, SCAN_LINES, false)) do
    if import_line(line) then
      for col, word in line:gmatch("()([%a_][%w_]*)") do
        if not SKIP[word] then
          out[#out + 1] = { row - 1, col - 1, line }
          if #out >= MAX_NAMES then return out end
        end
      end
    end
  end
  return out
end

local new_api = vim.fn.has("nvim-0.11") == 1 -- client:request(); before, client.request()

-- (path, 0-based line) of each location of a definition result (Location, Location[], LocationLink[]).
local function locations(result, into)
  if type(result) ~= "table" then return end
  if result.uri or result.targetUri then result = { result } end
  for _, loc in ipairs(result) do
    local uri = loc.targetUri or loc.uri
    local range = loc.targetSelectionRange or loc.targetRange or loc.range
    if type(uri) == "string" and uri:sub(1, 7) == "file://" and range and range.start then
      into[#into + 1] = { path = vim.uri_to_fname(uri), line = range.start.line }
    end
  end
end

--- Ask the buffer's language servers where its imported names are defined, then send the locations
--- of other files to the daemon for document `path` (opened on connection `gen`). Returns how many
--- requests were sent.
function D.send(bufnr, path, gen)
  local servers = clients(bufnr)
  if #servers == 0 then return 0 end
  local found, pending, done = {}, 0, false
  local function finish()
    if done then return end
    done = true
    local seen, list = {}, {}
    for _, loc in ipairs(found) do
      local key = loc.path .. ":" .. loc.line
      if loc.path ~= path and not seen[key] then
        seen[key] = true
        list[#list + 1] = loc
      end
    end
    table.sort(list, function(a, b) return a.path < b.path or (a.path == b.path and a.line < b.line) end)
    while #list > 256 do table.remove(list) end -- the daemon takes at most 256
    local encoded = tostring(gen) .. vim.json.encode(list)
    if D.sent[path] == encoded then return end
    D.sent[path] = encoded
    rpc.notify("definitions", { path = path, definitions = list })
  end
  local uri = vim.uri_from_bufnr(bufnr)
  for _, pos in ipairs(names(bufnr)) do
    for _, client in ipairs(servers) do
      pending = pending + 1
      local params = { textDocument = { uri = uri },
                       position = { line = pos[1], character = column(pos[3], pos[2], client.offset_encoding) } }
      local handler = function(err, result)
        if not err then locations(result, found) end
        pending = pending - 1
        if pending == 0 then finish() end
      end
      local ok
      if new_api then
        ok = client:request("textDocument/definition", params, handler, bufnr)
      else
        ok = client.request("textDocument/definition", params, handler, bufnr)
      end
      if not ok then pending = pending - 1 end
    end
  end
  if pending == 0 then
    finish()
  else
    vim.defer_fn(finish, TIMEOUT_MS) -- a server that never answers: send what came
  end
  return pending
end

return D
