-- The closers an editor's auto-pairs put after the cursor (`name(|)`), and where a completion types
-- over them: the daemon's `replaces` counts them (docs/protocol.md, `type_over`).
local M = {}

local OPENER = { [")"] = "(", ["]"] = "[", ["}"] = "{" }

--- Where `text` types over `closers` (the auto-paired closers right after the cursor), in order: the
--- byte offsets of those closers in `text` (as the daemon counts them: engine/stream.py typed_over).
function M.typed_over(text, closers)
  local at, out = 1, {}
  for k = 1, #closers do
    local c, depth, found = closers:sub(k, k), 0, nil
    for i = at, #text do
      local ch = text:sub(i, i)
      if not OPENER[c] then -- a quote: the string ends at the next one not escaped
        if ch == c and (i == at or text:sub(i - 1, i - 1) ~= "\\") then found = i break end
      elseif ch == "(" or ch == "[" or ch == "{" then depth = depth + 1
      elseif OPENER[ch] then
        if depth == 0 and ch == c then found = i break end
        depth = math.max(0, depth - 1)
      end
    end
    if not found then break end
    out[#out + 1], at = found, found + 1
  end
  return out
end

return M
