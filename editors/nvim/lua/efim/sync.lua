-- Document sync with the daemon, LSP style: `didOpen` with the whole text (and the workspace
-- root) when a buffer is first used on a connection, then one incremental `didChange` per edit
-- (from nvim_buf_attach's on_lines), so that `complete` and `cursor` carry no text.
--
-- The daemon's document is the buffer's lines joined with "\n" and its positions count Unicode
-- code points (efim_local/daemon/documents.py), while Neovim reports lines and bytes. To give
-- the end of a replaced range in code points the plugin keeps a copy of each synced buffer's
-- lines (as Neovim's own LSP client does); an edit touches only the lines it changed.
local rpc = require("efim.rpc")
local uv = vim.uv or vim.loop

local S = {
  docs = {}, -- bufnr -> { buf, path, root, lines, version, gen }
  root_markers = { ".git" },
}

--- Code points in `s` (valid UTF-8: the bytes that do not continue a character).
function S.cp_len(s)
  return select(2, s:gsub("[^\128-\191]", ""))
end

function S.doc_path(bufnr)
  local path = vim.api.nvim_buf_get_name(bufnr)
  if path == "" then path = "buffer-" .. bufnr end
  return path
end

-- The workspace root of `path`: the nearest directory above it holding a root marker, else the
-- current directory.
local function find_root(path)
  local dir = vim.fn.fnamemodify(path, ":p:h")
  while dir ~= "" do
    for _, m in ipairs(S.root_markers) do
      if uv.fs_stat(dir .. "/" .. m) then return dir end
    end
    local parent = vim.fn.fnamemodify(dir, ":h")
    if parent == dir then break end
    dir = parent
  end
  return vim.fn.getcwd()
end

-- The generation of the live connection, nil when there is none.
local function live()
  return rpc.connected_gen()
end

-- Replace lines [first, last) of the copy by `new` and return the LSP-style change.
local function splice(doc, first, last, new)
  local old, n = doc.lines, #doc.lines
  local change
  if last < n then -- whole lines, each ended by "\n"
    change = { range = { start = { line = first, character = 0 }, ["end"] = { line = last, character = 0 } },
               text = #new > 0 and table.concat(new, "\n") .. "\n" or "" }
  elseif first > 0 then -- up to the end of the text, which has no final "\n": start after line first-1
    change = { range = { start = { line = first - 1, character = S.cp_len(old[first]) },
                         ["end"] = { line = n - 1, character = S.cp_len(old[n]) } },
               text = #new > 0 and "\n" .. table.concat(new, "\n") or "" }
  else
    change = { range = { start = { line = 0, character = 0 }, ["end"] = { line = n - 1, character = S.cp_len(old[n]) } },
               text = table.concat(new, "\n") }
  end
  if last - first == #new then
    for i = 1, #new do old[first + i] = new[i] end
  else
    local lines = {}
    for i = 1, first do lines[i] = old[i] end
    for i = 1, #new do lines[first + i] = new[i] end
    for i = last + 1, n do lines[#lines + 1] = old[i] end
    if #lines == 0 then lines[1] = "" end
    doc.lines = lines
  end
  return change
end

local function send_change(doc, change)
  if doc.gen ~= nil and doc.gen == live() then
    doc.version = doc.version + 1
    rpc.notify("didChange", { path = doc.path, version = doc.version, contentChanges = { change } })
  else
    doc.gen = nil -- re-opened with its whole text when next used
  end
end

local function attach(bufnr)
  if not vim.api.nvim_buf_is_loaded(bufnr) then return nil end
  local doc = { buf = bufnr, path = S.doc_path(bufnr), lines = vim.api.nvim_buf_get_lines(bufnr, 0, -1, false),
                version = 0, gen = nil }
  doc.root = find_root(doc.path)
  local ok = vim.api.nvim_buf_attach(bufnr, false, {
    on_lines = function(_, b, _, first, last, new_last)
      if S.docs[b] ~= doc then return true end -- closed: detach
      if last > #doc.lines then -- out of step (should not happen): send everything
        doc.lines = vim.api.nvim_buf_get_lines(b, 0, -1, false)
        send_change(doc, { text = table.concat(doc.lines, "\n") })
        return
      end
      send_change(doc, splice(doc, first, last, vim.api.nvim_buf_get_lines(b, first, new_last, false)))
    end,
    on_reload = function(_, b)
      if S.docs[b] ~= doc then return end
      doc.lines = vim.api.nvim_buf_get_lines(b, 0, -1, false)
      send_change(doc, { text = table.concat(doc.lines, "\n") })
    end,
    on_detach = function(_, b) -- unloaded (:bdelete unloads before BufDelete): close it in the daemon
      if S.docs[b] == doc then S.close(b) end
    end,
  })
  if not ok then return nil end
  S.docs[bufnr] = doc
  return doc
end

--- The buffer's document, opened in the daemon on the current connection (a didOpen with its
--- whole text when this connection has not seen it: first use, renamed buffer, new daemon).
function S.ensure(bufnr)
  local doc = S.docs[bufnr] or attach(bufnr)
  if not doc then return nil end
  local gen = rpc.connect()
  local path = S.doc_path(bufnr)
  if doc.path ~= path then
    if doc.gen == gen then rpc.notify("didClose", { path = doc.path }) end
    doc.path, doc.root, doc.gen = path, find_root(path), nil
  end
  if doc.gen ~= gen then
    doc.version = doc.version + 1
    doc.gen = rpc.notify("didOpen", { path = doc.path, text = table.concat(doc.lines, "\n"), version = doc.version,
                                      root = doc.root })
  end
  return doc
end

--- Stop syncing the buffer (and close it in the daemon).
function S.close(bufnr)
  local doc = S.docs[bufnr]
  if not doc then return end
  S.docs[bufnr] = nil -- on_lines detaches on the next edit
  if doc.gen ~= nil and doc.gen == live() then rpc.notify("didClose", { path = doc.path }) end
end

function S.close_all()
  for bufnr in pairs(S.docs) do S.close(bufnr) end
end

--- The daemon's position ({line, character}: 0-based, code points) of byte column `col` of `row`.
function S.position(bufnr, row, col)
  local line = vim.api.nvim_buf_get_lines(bufnr, row, row + 1, false)[1] or ""
  return { line = row, character = S.cp_len(line:sub(1, col)) }
end

return S
