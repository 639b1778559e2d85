-- efim.nvim: ghost-text completions from the efim daemon (Unix socket, JSON-RPC, one object per line).
--
--   require("efim").setup({ max_tokens = 64, debounce_ms = 150, accept_key = "<Tab>" })
--
-- While you type in insert mode the plugin waits `debounce_ms`, asks the daemon for a completion
-- at the cursor, and shows it as virtual text. `accept_key` inserts it, `dismiss_key` hides it.
-- A newer request supersedes (and cancels) the older one. Files are warm before the first key:
-- entering a buffer opens it in the daemon (`didOpen`, which prefills it), and when the cursor
-- settles on another line (`cursor_debounce_ms`) the plugin syncs the text and sends a `cursor`
-- notification, so the daemon prefills the plan anchored there while you read.
local M = {}
local uv = vim.loop
local ns = vim.api.nvim_create_namespace("efim")

M.config = {
  socket = nil, -- default: $EFIM_SOCKET, else $XDG_RUNTIME_DIR/efim/efim.sock, else ~/.cache/efim/run/efim.sock
  max_tokens = 64,
  debounce_ms = 150,
  accept_key = "<Tab>",
  dismiss_key = "<C-e>",
  auto = true, -- request while typing; false: only on M.trigger()
  highlight = "Comment",
  cursor_debounce_ms = 300, -- the cursor settled on a line: prefill there (0: off)
}

local st = { pipe = nil, connected = false, outbox = {}, inbuf = "", next_id = 0, handlers = {},
             timer = nil, current = nil, suggestion = nil, cursor_timer = nil, cursor_at = {} }

local function socket_path()
  if M.config.socket then return M.config.socket end
  if os.getenv("EFIM_SOCKET") then return os.getenv("EFIM_SOCKET") end
  if os.getenv("XDG_RUNTIME_DIR") then return os.getenv("XDG_RUNTIME_DIR") .. "/efim/efim.sock" end
  return (os.getenv("XDG_CACHE_HOME") or (os.getenv("HOME") .. "/.cache")) .. "/efim/run/efim.sock"
end

local function on_line(line)
  local ok, msg = pcall(vim.json.decode, line)
  if not ok or type(msg) ~= "table" or msg.id == nil then return end
  local h = st.handlers[msg.id]
  st.handlers[msg.id] = nil
  if h then h(msg) end
end

local function reset()
  if st.pipe then pcall(function() st.pipe:close() end) end
  st.pipe, st.connected, st.outbox, st.inbuf, st.handlers = nil, false, {}, "", {}
end

local function connect()
  if st.pipe then return end
  local pipe = uv.new_pipe(false)
  st.pipe = pipe
  pipe:connect(socket_path(), function(err)
    if err then
      vim.schedule(reset)
      return
    end
    st.connected = true
    for _, data in ipairs(st.outbox) do pipe:write(data) end
    st.outbox = {}
    pipe:read_start(function(rerr, chunk)
      if rerr or not chunk then
        vim.schedule(reset)
        return
      end
      st.inbuf = st.inbuf .. chunk
      while true do
        local nl = st.inbuf:find("\n", 1, true)
        if not nl then break end
        local line = st.inbuf:sub(1, nl - 1)
        st.inbuf = st.inbuf:sub(nl + 1)
        vim.schedule(function() on_line(line) end)
      end
    end)
  end)
end

local function send(method, params, handler)
  connect()
  st.next_id = st.next_id + 1
  local id = st.next_id
  if handler then st.handlers[id] = handler end
  local data = vim.json.encode({ jsonrpc = "2.0", id = id, method = method, params = params }) .. "\n"
  if st.connected then st.pipe:write(data) else table.insert(st.outbox, data) end
  return id
end

local function notify(method, params)
  connect()
  local data = vim.json.encode({ jsonrpc = "2.0", method = method, params = params }) .. "\n"
  if st.connected then st.pipe:write(data) else table.insert(st.outbox, data) end
end

local function doc_path(bufnr)
  local path = vim.api.nvim_buf_get_name(bufnr)
  if path == "" then path = "buffer-" .. bufnr end
  return path
end

local function is_file(bufnr)
  return vim.bo[bufnr].buftype == "" and vim.api.nvim_buf_get_name(bufnr) ~= ""
end

local function buf_text(bufnr)
  return table.concat(vim.api.nvim_buf_get_lines(bufnr, 0, -1, false), "\n")
end

-- A file buffer was entered: open it in the daemon (which prefills it when idle).
local function did_open()
  local bufnr = vim.api.nvim_get_current_buf()
  if not is_file(bufnr) then return end
  notify("didOpen", { path = doc_path(bufnr), text = buf_text(bufnr), root = vim.fn.getcwd() })
  st.cursor_at[bufnr] = nil
end

-- The cursor settled on another line: sync the text, then ask the daemon to prefill there.
local function cursor_settled()
  local bufnr = vim.api.nvim_get_current_buf()
  if not is_file(bufnr) then return end
  local row, col = unpack(vim.api.nvim_win_get_cursor(0))
  if st.cursor_at[bufnr] == row then return end
  st.cursor_at[bufnr] = row
  local line = vim.api.nvim_buf_get_lines(bufnr, row - 1, row, false)[1] or ""
  local path = doc_path(bufnr)
  notify("didChange", { path = path, contentChanges = { { text = buf_text(bufnr) } } })
  notify("cursor", { path = path, position = { line = row - 1, character = vim.str_utfindex(line, col) } })
end

local function schedule_cursor()
  if M.config.cursor_debounce_ms <= 0 then return end
  if st.cursor_timer then st.cursor_timer:stop() else st.cursor_timer = uv.new_timer() end
  st.cursor_timer:start(M.config.cursor_debounce_ms, 0, vim.schedule_wrap(cursor_settled))
end

function M.dismiss()
  vim.api.nvim_buf_clear_namespace(0, ns, 0, -1)
  st.suggestion = nil
end

local function show(bufnr, row, col, text)
  if text == nil or text == "" then return end
  local lines = vim.split(text, "\n", { plain = true })
  local line = vim.api.nvim_buf_get_lines(bufnr, row, row + 1, false)[1] or ""
  local opts = { virt_text = { { lines[1], M.config.highlight } },
                 virt_text_pos = (col >= #line) and "overlay" or "eol", hl_mode = "combine" }
  if #lines > 1 then
    opts.virt_lines = {}
    for i = 2, #lines do table.insert(opts.virt_lines, { { lines[i], M.config.highlight } }) end
  end
  vim.api.nvim_buf_clear_namespace(bufnr, ns, 0, -1)
  vim.api.nvim_buf_set_extmark(bufnr, ns, row, col, opts)
  st.suggestion = { buf = bufnr, row = row, col = col, text = text, tick = vim.b[bufnr].changedtick }
end

function M.trigger()
  local bufnr = vim.api.nvim_get_current_buf()
  local row, col = unpack(vim.api.nvim_win_get_cursor(0))
  row = row - 1
  local lines = vim.api.nvim_buf_get_lines(bufnr, 0, -1, false)
  local character = vim.str_utfindex(lines[row + 1] or "", col)
  local tick = vim.b[bufnr].changedtick
  local path = vim.api.nvim_buf_get_name(bufnr)
  if path == "" then path = "buffer-" .. bufnr end
  if st.current then send("cancel", { id = st.current }) end
  local id
  id = send("complete", {
    path = path, text = table.concat(lines, "\n"), position = { line = row, character = character },
    max_tokens = M.config.max_tokens,
  }, function(msg)
    if st.current == id then st.current = nil end
    if msg.result == nil then return end
    -- Show it only if nothing changed since the request.
    local r, c = unpack(vim.api.nvim_win_get_cursor(0))
    if vim.api.nvim_get_current_buf() == bufnr and vim.b[bufnr].changedtick == tick and r - 1 == row and c == col then
      show(bufnr, row, col, msg.result.text)
    end
  end)
  st.current = id
  return id
end

function M.accept()
  local s = st.suggestion
  if not s or s.buf ~= vim.api.nvim_get_current_buf() or vim.b[s.buf].changedtick ~= s.tick then return false end
  local lines = vim.split(s.text, "\n", { plain = true })
  M.dismiss()
  vim.api.nvim_buf_set_text(s.buf, s.row, s.col, s.row, s.col, lines)
  local last = lines[#lines]
  local row = s.row + #lines
  local col = (#lines == 1) and (s.col + #last) or #last
  vim.api.nvim_win_set_cursor(0, { row, col })
  return true
end

function M.visible()
  return st.suggestion ~= nil
end

function M.suggestion()
  return st.suggestion and st.suggestion.text
end

local function schedule()
  M.dismiss()
  if st.timer then st.timer:stop() else st.timer = uv.new_timer() end
  st.timer:start(M.config.debounce_ms, 0, vim.schedule_wrap(function()
    if vim.api.nvim_get_mode().mode:sub(1, 1) == "i" then M.trigger() end
  end))
end

function M.setup(opts)
  M.config = vim.tbl_extend("force", M.config, opts or {})
  local group = vim.api.nvim_create_augroup("efim", { clear = true })
  if M.config.auto then
    vim.api.nvim_create_autocmd({ "TextChangedI", "TextChangedP" }, { group = group, callback = schedule })
  end
  vim.api.nvim_create_autocmd({ "InsertLeave", "BufLeave" }, { group = group, callback = M.dismiss })
  vim.api.nvim_create_autocmd("BufEnter", { group = group, callback = did_open })
  vim.api.nvim_create_autocmd({ "CursorMoved", "CursorMovedI" }, { group = group, callback = schedule_cursor })
  vim.api.nvim_create_autocmd("BufDelete", { group = group, callback = function(ev)
    if is_file(ev.buf) then notify("didClose", { path = doc_path(ev.buf) }) end
  end })
  vim.keymap.set("i", M.config.accept_key, function()
    if not M.accept() then
      vim.api.nvim_feedkeys(vim.api.nvim_replace_termcodes(M.config.accept_key, true, false, true), "n", false)
    end
  end, { desc = "efim: accept the completion" })
  vim.keymap.set("i", M.config.dismiss_key, M.dismiss, { desc = "efim: dismiss the completion" })
end

return M
