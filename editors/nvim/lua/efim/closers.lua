-- The closers an editor's auto-pairs put after the cursor (`name(|)`), and where a completion types
-- over them: the daemon's `replaces` counts them (docs/protocol.md, `type_over`).
local M = {}

local OPENER = { [")"] = "(", ["]"] = "[", ["}"] = "{" }
local QUOTE = { ["'"] = true, ['"'] = true, ["`"] = true } -- strings the text opens: their brackets are text
M.MAX_REPLACES = 4 -- the most closers a ghost may replace (as the LSP server checks)

--- Whether `s` is only closer characters (brackets and quotes an editor's auto-pairs insert).
function M.all_closers(s)
  return s:match("^[%)%]}\"'`]*$") ~= nil
end

local PREFIX = { r = true, b = true, f = true, u = true, rb = true, br = true, fr = true, rf = true }

-- Whether the quote at byte `i` of `text` (from `at`) opens a string (engine/stream.py `_opens`): an
-- apostrophe after letters does not (`don't`) unless they are a string prefix (`f'`), nor after `&`
-- or `<` (a Rust lifetime, `&'a str`).
local function opens(text, i, at)
  if text:sub(i, i) ~= "'" or i == at then return true end
  local before = text:sub(i - 1, i - 1)
  if before == "&" or before == "<" then return false end
  local j = i
  while j > at and i - j <= 2 and text:sub(j - 1, j - 1):match("[%w_]") do j = j - 1 end
  return j == i or (PREFIX[text:sub(j, i - 1):lower()] ~= nil
    and (j == at or not text:sub(j - 1, j - 1):match("[%w_]")))
end

-- The byte offset in `text`, from `at`, of the character that closes the construct `c` ends (as the
-- daemon's engine/stream.py `_closing`): an unmatched bracket, or for a quote the next unescaped one.
local function closing(text, c, at)
  local depth, quote = 0, nil
  for i = at, #text do
    local ch = text:sub(i, i)
    local escaped = i > 1 and text:sub(i - 1, i - 1) == "\\"
    if not OPENER[c] then -- a quote: the string ends at the next one not escaped
      if ch == c and (i == at or not escaped) then return i end
    elseif quote then -- inside a string the text opened, until its quote or its line's end
      if ch == "\n" or (ch == quote and not escaped) then quote = nil end
    elseif QUOTE[ch] and opens(text, i, at) then quote = ch
    elseif ch == "(" or ch == "[" or ch == "{" then depth = depth + 1
    elseif OPENER[ch] then
      if depth == 0 and ch == c then return i end
      depth = math.max(0, depth - 1)
    end
  end
  return nil
end

--- Where `text` types over `closers` (the auto-paired closers right after the cursor), in order: the
--- byte offsets of those closers in `text` (as the daemon counts them: engine/stream.py typed_over).
function M.typed_over(text, closers)
  local at, out = 1, {}
  for k = 1, #closers do
    local found = closing(text, closers:sub(k, k), at)
    if not found then break end
    out[#out + 1], at = found, found + 1
  end
  return out
end

return M
