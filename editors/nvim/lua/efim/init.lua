-- efim.nvim: ghost-text completions from the efim daemon (Unix socket, JSON-RPC, one object per
-- line; docs/protocol.md). Help: :help efim (editors/nvim/doc/efim.txt).
--
--   require("efim").setup({ max_tokens = 64, debounce_ms = 150 })
--
-- While you type in insert mode the plugin waits `debounce_ms`, asks the daemon for a completion
-- at the cursor and shows it as virtual text while it streams in. The ghost belongs to the place
-- where it was asked for: moving the cursor, typing, or opening the popup menu hides it, and the
-- accept keys act only there (and leave the popup menu its own keys). Buffers are synced
-- incrementally (sync.lua), so files are warm in the daemon before the first key.
local rpc = require("efim.rpc")
local sync = require("efim.sync")
local defs = require("efim.defs")
local closers = require("efim.closers")
local uv = vim.uv or vim.loop

local M = {}
local ns = vim.api.nvim_create_namespace("efim")

local defaults = {
  socket = nil, -- default: $EFIM_SOCKET, else $XDG_RUNTIME_DIR/efim/efim.sock, else ~/.cache/efim/run/efim.sock
  max_tokens = 64,
  max_lines = nil, -- the most lines a ghost may have (nil: as many as max_tokens gives)
  type_over = true, -- a ghost may go on past the closers auto-pairs put after the cursor, and replace them
  debounce_ms = 150,
  cursor_debounce_ms = 300, -- the cursor settled on another line: prefill the plan there (0: off)
  auto = true, -- request while typing; false: only on :EfimComplete
  stream = true, -- show the completion while it is generated
  accept_key = "<Tab>",
  accept_word_key = "<M-Right>",
  accept_line_key = "<M-C-Right>",
  dismiss_key = "<C-]>",
  highlight = "Comment",
  info = false, -- show latency, tokens evaluated and cache tier after the ghost
  info_highlight = "NonText",
  filetypes = { help = false, markdown = false }, -- filetype -> enabled; "*": the rest (default true)
  unnamed = false, -- complete in buffers without a file name
  definitions = true, -- send where the buffer's language servers define its imported names (repository context)
  root_markers = { ".git", ".hg", ".svn", "pyproject.toml", "package.json", "Cargo.toml", "go.mod" },
}
M.config = vim.deepcopy(defaults)

local st = { enabled = true, timer = nil, cursor_timer = nil, cursor_at = {}, req = nil, ghost = nil, prior = {},
             mapped = {} }
local has_inline = vim.fn.has("nvim-0.10") == 1

function M.socket_path()
  if M.config.socket then return M.config.socket end
  if os.getenv("EFIM_SOCKET") then return os.getenv("EFIM_SOCKET") end
  if os.getenv("XDG_RUNTIME_DIR") then return os.getenv("XDG_RUNTIME_DIR") .. "/efim/efim.sock" end
  return (os.getenv("XDG_CACHE_HOME") or (os.getenv("HOME") .. "/.cache")) .. "/efim/run/efim.sock"
end
rpc.socket = M.socket_path

-- In insert mode "-- INSERT --" overwrites a message at once: a warning is also drawn at the end
-- of the cursor line until insert mode ends (it stays in :messages).
local notice_ns = vim.api.nvim_create_namespace("efim_notice")
function rpc.on_warning(msg)
  if vim.api.nvim_get_mode().mode:sub(1, 1) ~= "i" then return false end
  local buf, row = vim.api.nvim_get_current_buf(), vim.api.nvim_win_get_cursor(0)[1] - 1
  vim.api.nvim_buf_clear_namespace(buf, notice_ns, 0, -1)
  vim.api.nvim_buf_set_extmark(buf, notice_ns, row, 0, { virt_text = { { msg, "WarningMsg" } }, virt_text_pos = "eol" })
  local clear = function() pcall(vim.api.nvim_buf_clear_namespace, buf, notice_ns, 0, -1) end
  vim.api.nvim_create_autocmd("InsertLeave", { once = true, callback = clear })
  return true
end

--- Whether completions are on in `bufnr` (default: the current buffer): :EfimEnable/:EfimDisable,
--- then b:efim_enabled, then the buffer kind, the `unnamed` option and the `filetypes` table.
function M.is_enabled(bufnr)
  bufnr = bufnr or vim.api.nvim_get_current_buf()
  if not st.enabled or not vim.api.nvim_buf_is_valid(bufnr) then return false end
  local b = vim.b[bufnr].efim_enabled
  if b ~= nil then return b == true or b == 1 end
  local bt = vim.bo[bufnr].buftype
  if bt ~= "" and bt ~= "help" then return false end
  if vim.api.nvim_buf_get_name(bufnr) == "" and not M.config.unnamed then return false end
  local v = M.config.filetypes[vim.bo[bufnr].filetype]
  if v == nil then v = M.config.filetypes["*"] end
  return v ~= false and v ~= 0
end

-- -- the ghost ----------------------------------------------------------------------------------
local function cursor_at(o)
  if vim.api.nvim_get_current_buf() ~= o.buf then return false end
  local r, c = unpack(vim.api.nvim_win_get_cursor(0))
  return r - 1 == o.row and c == o.col
end

-- The ghost can be shown or accepted: same buffer, text and cursor as when it was asked for,
-- insert mode, no popup menu.
local function still_at(o)
  return cursor_at(o) and vim.b[o.buf].changedtick == o.tick and vim.fn.pumvisible() == 0
    and vim.api.nvim_get_mode().mode:sub(1, 1) == "i"
end

local function report_accepted(g)
  if g.taken > 0 then
    rpc.notify("accepted", { path = g.path, id = tostring(g.id), text = g.offered, accepted = g.taken })
  end
end

local function info_text(res)
  if not (M.config.info and res) then return nil end
  local t, tok, ctx = res.timings or {}, res.tokens or {}, res.context or {}
  local context = ""
  if ctx.tokens then -- the context the answer used, of the full plan's, and whether (and why) the budget cut it
    local why = type(ctx.reduced_by) == "table" and ctx.reduced_by.text
    context = string.format(", context %d/%d (%.0f%%%s)", ctx.tokens, ctx.full_tokens or ctx.tokens,
      100 * (ctx.share or 1), ctx.reduced and (why and ", reduced by " .. why or ", reduced") or "")
  end
  return string.format("  efim %.0f ms%s, %d evaluated, %s", t.total_ms or 0, context, tok.evaluated or 0,
    tostring(res.cache_tier or "?"))
end

--- Hide the ghost.
function M.dismiss()
  local g = st.ghost
  st.ghost = nil
  if g then
    if vim.api.nvim_buf_is_valid(g.buf) then vim.api.nvim_buf_clear_namespace(g.buf, ns, 0, -1) end
    report_accepted(g)
  end
end

-- Draw `text` at origin `o` (buf, row, col, tick). `chain` carries what was offered and taken
-- so far when this is the rest of a partly accepted completion. `over`: how many characters after
-- the cursor it replaces (the closers it types over; default: the result's `replaces`).
local function show(o, text, res, chain, over)
  if text == nil or text == "" then return end
  local hl = M.config.highlight
  local lines = vim.split(text, "\n", { plain = true })
  local line = vim.api.nvim_buf_get_lines(o.buf, o.row, o.row + 1, false)[1] or ""
  local n = res and res.replaces
  over = over or (type(n) == "number" and n) or 0 -- (a string is no count: the LSP server takes none either)
  local after = line:sub(o.col + 1, o.col + over)
  -- As the LSP server does: a few closers, in the buffer after the cursor, that the text types over
  -- as the daemon says; anything else replaces nothing.
  local sane = over >= 1 and over <= closers.MAX_REPLACES and over == math.floor(over) and #after == over
    and closers.all_closers(after)
  local at = sane and closers.typed_over(text, after) or {}
  if #at ~= over then at, over = {}, 0 end
  local split = over > 0 and at[over] <= #lines[1] -- the closers it types over are on its first line
  local opts = { virt_text = { { lines[1], hl } }, hl_mode = "combine" }
  local pieces = {} -- inline, a ghost that types over closers is drawn between them: `f(est|)` shows `f(est)`
  if has_inline and split then
    opts.virt_text_pos = "inline"
    local from = 1
    for k, i in ipairs(at) do
      if k == 1 then opts.virt_text[1][1] = lines[1]:sub(1, i - 1)
      else pieces[#pieces + 1] = { o.col + k - 1, lines[1]:sub(from, i - 1) } end
      from = i + 1
    end
    pieces[#pieces + 1] = { o.col + over, lines[1]:sub(from) }
  elseif has_inline then
    opts.virt_text_pos = "inline"
  else
    -- Before 0.10 a ghost in the middle of a line can only be drawn after the line's end, where
    -- more than one word reads as garbage (`name.st.split()).lower() rip()`): one word only; or over
    -- the closers it types over, when they end the line.
    local ends_line = o.col + (split and over or 0) >= #line
    if not ends_line and (#lines > 1 or text:find("%s")) then
      if st.ghost then M.dismiss() end
      vim.api.nvim_buf_clear_namespace(o.buf, ns, 0, -1)
      return
    end
    opts.virt_text_pos = ends_line and "overlay" or "eol"
  end
  if #lines > 1 then
    opts.virt_lines = {}
    for i = 2, #lines do opts.virt_lines[i - 1] = { { lines[i], hl } } end
  end
  local info = info_text(res)
  local info_eol = info and has_inline and not opts.virt_lines -- inline, it would sit inside the code line
  if info and not info_eol then
    local last = opts.virt_lines and opts.virt_lines[#opts.virt_lines] or opts.virt_text
    table.insert(last, { info, M.config.info_highlight })
  end
  vim.api.nvim_buf_clear_namespace(o.buf, ns, 0, -1)
  vim.api.nvim_buf_set_extmark(o.buf, ns, o.row, o.col, opts)
  for _, p in ipairs(pieces) do
    if p[2] ~= "" then
      vim.api.nvim_buf_set_extmark(o.buf, ns, o.row, p[1], { virt_text = { { p[2], hl } }, virt_text_pos = "inline",
                                                            hl_mode = "combine" })
    end
  end
  if info_eol then
    vim.api.nvim_buf_set_extmark(o.buf, ns, o.row, 0, { virt_text = { { info, M.config.info_highlight } },
                                                        virt_text_pos = "eol", hl_mode = "combine" })
  end
  chain = chain or { offered = text, taken = 0 }
  st.ghost = { buf = o.buf, row = o.row, col = o.col, tick = o.tick, id = o.id, path = o.path, text = text,
               res = res, offered = chain.offered, taken = chain.taken, line = line, over = at }
end

-- How many of the closers the ghost types over come after its first `n` bytes.
local function left_over(g, n)
  local k = 0
  for _, i in ipairs(g.over) do if i > n then k = k + 1 end end
  return k
end

-- How many bytes of the ghost were typed since it was shown (0: the change is not typing it): the
-- cursor moved right on its line, and the line is what it was with the ghost's next bytes inserted,
-- or with the closers among them typed over (auto-pairs step over a closer typed before one).
local function typed_into(g)
  if vim.api.nvim_get_current_buf() ~= g.buf then return 0 end
  local r, c = unpack(vim.api.nvim_win_get_cursor(0))
  local n = c - g.col
  if r - 1 ~= g.row or n <= 0 or n >= #g.text then return 0 end
  local line = vim.api.nvim_buf_get_lines(g.buf, g.row, g.row + 1, false)[1] or ""
  local typed = g.line:sub(1, g.col) .. g.text:sub(1, n)
  local over = #g.over - left_over(g, n)
  if line ~= typed .. g.line:sub(g.col + 1) and (over == 0 or line ~= typed .. g.line:sub(g.col + 1 + over)) then
    return 0
  end
  return n
end

-- The user typed the ghost's next characters: keep showing the rest where the cursor now is (the
-- daemon answers the request that follows from what it generated: the same text, or more).
local function type_through(g, n)
  show({ buf = g.buf, row = g.row, col = g.col + n, tick = vim.b[g.buf].changedtick, id = g.id, path = g.path },
    g.text:sub(n + 1), g.res, g, left_over(g, n))
end

-- -- requests -------------------------------------------------------------------------------------
local function cancel_request()
  local req = st.req
  st.req = nil
  if req then
    rpc.forget(req.entry)
    if req.entry.id then rpc.notify("cancel", { id = req.entry.id }) end
  end
end

local send_complete

local function on_result(req, msg)
  if st.req ~= req then return end
  st.req = nil
  local err = msg.error
  if err then
    -- A daemon that lost the document (restarted, or it was closed): open it again, once.
    if not req.reopened and tostring(err.message):find("document not open", 1, true) then
      req.reopened = true
      local doc = sync.docs[req.origin.buf]
      if doc then doc.gen = nil end
      st.req = req
      send_complete(req)
    end
    return
  end
  local res = msg.result
  if type(res) ~= "table" then return end
  req.origin.id = req.entry.id -- (a retry has a new id)
  if still_at(req.origin) and res.text ~= "" then
    show(req.origin, res.text, res)
  elseif st.ghost and st.ghost.id == req.origin.id then
    M.dismiss()
  end
end

send_complete = function(req)
  local o = req.origin
  req.entry = rpc.request("complete", function()
    local doc = sync.ensure(o.buf) -- (again) when retried on a new connection
    return { path = doc and doc.path or o.path, position = sync.position(o.buf, o.row, o.col),
             max_tokens = M.config.max_tokens, max_lines = M.config.max_lines, stream = M.config.stream,
             type_over = M.config.type_over }
  end, function(msg) on_result(req, msg) end, {
    on_partial = function(piece, id)
      if st.req ~= req then return end
      if req.stream_id ~= id then req.text, req.stream_id, o.id = "", id, id end -- a retry starts over
      req.text = req.text .. piece
      local g = st.ghost -- (a ghost typed through already shows more of it: no flicker)
      local more = g and g.buf == o.buf and g.row == o.row and g.col == o.col and g.text:sub(1, #req.text) == req.text
      if still_at(o) and not more then show(o, req.text, nil) end
    end,
  })
  o.id = req.entry.id
end

--- Ask for a completion at the cursor now. Returns the request id (nil: off in this buffer).
function M.trigger()
  local bufnr = vim.api.nvim_get_current_buf()
  if not M.is_enabled(bufnr) then return nil end
  local doc = sync.ensure(bufnr)
  if not doc then return nil end
  cancel_request()
  local row, col = unpack(vim.api.nvim_win_get_cursor(0))
  local req = { text = "", origin = { buf = bufnr, row = row - 1, col = col, tick = vim.b[bufnr].changedtick,
                                      path = doc.path } }
  st.req = req
  send_complete(req)
  return req.entry.id
end

-- -- accepting ------------------------------------------------------------------------------------
--- The next word of `text`: leading blanks, then a run of word characters or of other characters.
function M.next_word(text)
  return text:match("^%s*[%w_\128-\255]+") or text:match("^%s*[^%w_\128-\255%s]+") or text
end

--- The next line of `text`: up to its first newline; a leading newline and the line after it.
function M.next_line(text)
  if text:sub(1, 1) == "\n" then return "\n" .. text:sub(2):match("^[^\n]*") end
  return text:match("^[^\n]*")
end

-- Insert `part` of the ghost (all, next word or next line) at its place; the rest stays shown.
local function accept(pick)
  local g = st.ghost
  if not g or not still_at(g) then return false end
  local part = pick and pick(g.text) or g.text
  local rest = g.text:sub(#part + 1)
  local lines = vim.split(part, "\n", { plain = true })
  local over = #g.over - left_over(g, #part) -- the closers this part types over: it replaces them
  vim.api.nvim_buf_clear_namespace(g.buf, ns, 0, -1)
  st.ghost = nil
  vim.api.nvim_buf_set_text(g.buf, g.row, g.col, g.row, g.col + over, lines)
  local row = g.row + #lines - 1
  local col = (#lines == 1) and (g.col + #part) or #lines[#lines]
  vim.api.nvim_win_set_cursor(0, { row + 1, col })
  g.taken = g.taken + sync.cp_len(part)
  if rest ~= "" then
    show({ buf = g.buf, row = row, col = col, tick = vim.b[g.buf].changedtick, id = g.id, path = g.path }, rest,
      g.res, g, left_over(g, #part))
  else
    report_accepted(g)
    st.accepted_tick = vim.b[g.buf].changedtick -- the next completion is asked for at once: it is ready
  end
  return true
end

function M.accept() return accept(nil) end
function M.accept_word() return accept(M.next_word) end
function M.accept_line() return accept(M.next_line) end

function M.visible()
  return st.ghost ~= nil
end

function M.suggestion()
  return st.ghost and st.ghost.text
end

-- -- events ---------------------------------------------------------------------------------------
local function on_text_changed(ev)
  local g = st.ghost
  if g and g.buf == vim.api.nvim_get_current_buf() and g.tick == vim.b[g.buf].changedtick then
    return -- our own partial accept
  end
  local n = g and ev.event == "TextChangedI" and typed_into(g) or 0
  if n > 0 then
    type_through(g, n)
  else
    M.dismiss()
  end
  cancel_request()
  if not M.config.auto or ev.event == "TextChangedP" or not M.is_enabled() then return end
  local accepted = st.accepted_tick == vim.b.changedtick
  st.accepted_tick = nil
  if st.timer then st.timer:stop() else st.timer = uv.new_timer() end
  st.timer:start(accepted and 0 or M.config.debounce_ms, 0, vim.schedule_wrap(function()
    if vim.api.nvim_get_mode().mode:sub(1, 1) == "i" and vim.fn.pumvisible() == 0 then M.trigger() end
  end))
end

-- The cursor settled on another line: ask the daemon to prefill the plan anchored there.
local function cursor_settled()
  local bufnr = vim.api.nvim_get_current_buf()
  if not M.is_enabled(bufnr) then return end
  local row, col = unpack(vim.api.nvim_win_get_cursor(0))
  if st.cursor_at[bufnr] == row then return end
  st.cursor_at[bufnr] = row
  local doc = sync.ensure(bufnr)
  if doc then rpc.notify("cursor", { path = doc.path, position = sync.position(bufnr, row - 1, col) }) end
end

local function on_cursor_moved()
  local g = st.ghost
  if g and not cursor_at(g) then
    local n = typed_into(g)
    if n == 0 then
      M.dismiss()
    elseif g.tick == vim.b[g.buf].changedtick then
      type_through(g, n) -- auto-pairs stepped over the closer the ghost types next: the text is unchanged
    end
  end
  if st.req and not cursor_at(st.req.origin) then cancel_request() end
  if M.config.cursor_debounce_ms <= 0 then return end
  if st.cursor_timer then st.cursor_timer:stop() else st.cursor_timer = uv.new_timer() end
  st.cursor_timer:start(M.config.cursor_debounce_ms, 0, vim.schedule_wrap(cursor_settled))
end

local function on_leave()
  M.dismiss()
  cancel_request()
end

-- Where the buffer's language servers define the names it imports, to the daemon (defs.lua).
local function send_definitions(ev)
  local bufnr = ev and ev.buf or vim.api.nvim_get_current_buf()
  if not M.config.definitions or not vim.api.nvim_buf_is_valid(bufnr) or not M.is_enabled(bufnr) then return end
  local doc = sync.ensure(bufnr)
  if doc then defs.send(bufnr, doc.path, doc.gen) end
end

-- A buffer was entered (or its filetype set): open it in the daemon, which prefills it when idle.
local function on_enter(ev)
  local bufnr = ev and ev.buf or vim.api.nvim_get_current_buf()
  if bufnr ~= vim.api.nvim_get_current_buf() then return end
  if M.is_enabled(bufnr) then
    sync.ensure(bufnr)
    vim.defer_fn(function() send_definitions({ buf = bufnr }) end, 500) -- language servers attach after BufEnter
  else
    sync.close(bufnr)
  end
  st.cursor_at[bufnr] = nil
end

--- Turn completions on (:EfimEnable); the current buffer is opened in the daemon.
function M.enable()
  st.enabled = true
  on_enter()
end

--- Turn completions off (:EfimDisable): hide the ghost, stop syncing, close documents.
function M.disable()
  st.enabled = false
  on_leave()
  sync.close_all()
end

--- Whether completions are on at all (:EfimEnable / :EfimDisable).
function M.active()
  return st.enabled
end

function M.toggle()
  if st.enabled then M.disable() else M.enable() end
  return st.enabled
end

-- -- keys -----------------------------------------------------------------------------------------
-- What `key` did before the plugin mapped it (a user's mapping, else the built-in key).
local function fallback(key)
  local prior = st.prior[key]
  local keys, mode = vim.api.nvim_replace_termcodes(key, true, false, true), "n"
  if prior then
    if prior.callback then
      local r = prior.callback()
      if prior.expr ~= 1 then return end
      keys = vim.api.nvim_replace_termcodes(r or "", true, false, true)
    elseif prior.expr == 1 then
      keys = vim.api.nvim_eval(prior.rhs)
    else
      keys = vim.api.nvim_replace_termcodes(prior.rhs, true, false, true)
    end
    mode = prior.noremap == 1 and "n" or "m"
  end
  vim.api.nvim_feedkeys(keys, mode .. "i", false)
end

local function map(key, action, desc)
  if not key or key == "" then return end
  local m = vim.fn.maparg(key, "i", false, true)
  st.prior[key] = (m.rhs or m.callback) and m.buffer ~= 1 and m or nil -- the user's mapping
  vim.keymap.set("i", key, function()
    if vim.fn.pumvisible() == 1 or not action() then fallback(key) end
  end, { desc = "efim: " .. desc })
  st.mapped[#st.mapped + 1] = key
end

-- Remove the plugin's mappings and put back the ones they replaced.
local function unmap_all()
  for _, key in ipairs(st.mapped) do
    pcall(vim.keymap.del, "i", key)
    local p = st.prior[key]
    if p then
      vim.keymap.set("i", key, p.callback or p.rhs, { expr = p.expr == 1, remap = p.noremap ~= 1,
                                                     silent = p.silent == 1, nowait = p.nowait == 1 })
    end
  end
  st.mapped, st.prior = {}, {}
end

local function dismiss_if_visible()
  if not st.ghost then return false end
  M.dismiss()
  return true
end

function M.setup(opts)
  M.config = vim.tbl_deep_extend("force", vim.deepcopy(defaults), opts or {})
  if opts and opts.root_markers then M.config.root_markers = opts.root_markers end -- a list: not merged
  sync.root_markers = M.config.root_markers
  local group = vim.api.nvim_create_augroup("efim", { clear = true })
  local au = function(events, cb) vim.api.nvim_create_autocmd(events, { group = group, callback = cb }) end
  au({ "TextChangedI", "TextChangedP" }, on_text_changed)
  au({ "CursorMoved", "CursorMovedI" }, on_cursor_moved)
  au("CompleteChanged", M.dismiss)
  au({ "InsertLeave", "BufLeave" }, on_leave)
  au({ "BufEnter", "FileType" }, on_enter)
  au({ "BufDelete", "BufWipeout" }, function(ev) sync.close(ev.buf) end)
  au("VimLeavePre", sync.close_all) -- the daemon holds at most 256 open documents
  au("BufWritePost", send_definitions)
  pcall(au, "LspAttach", send_definitions) -- (Neovim 0.8+)
  unmap_all()
  map(M.config.accept_key, M.accept, "accept the completion")
  map(M.config.accept_word_key, M.accept_word, "accept the next word of the completion")
  map(M.config.accept_line_key, M.accept_line, "accept the next line of the completion")
  map(M.config.dismiss_key, dismiss_if_visible, "dismiss the completion")
  on_enter()
end

--- Counters for tests and :checkhealth (requests, replies, partials, connects, failures, retries).
function M.stats()
  return vim.deepcopy(rpc.stats)
end

return M
