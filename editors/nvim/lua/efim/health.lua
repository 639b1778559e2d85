-- :checkhealth efim — is the daemon reachable, on which socket, with which model and version.
local M = {}

-- Neovim 0.10+ has vim.health.start/ok/...; 0.8-0.9 vim.health.report_*; 0.7 only health#report_*.
local h = vim.health or {}
local function pick(new)
  return h[new] or h["report_" .. new] or function(...) vim.fn["health#report_" .. new](...) end
end
local start, ok, info, warn, err = pick("start"), pick("ok"), pick("info"), pick("warn"), pick("error")

local function efim_version()
  if vim.fn.executable("efim") ~= 1 then return nil end
  local out = vim.fn.system({ "efim", "--version" })
  if vim.v.shell_error ~= 0 then return nil end
  return vim.trim(out)
end

function M.check()
  local efim = require("efim")
  local rpc = require("efim.rpc")
  start("efim")
  if vim.fn.has("nvim-0.10") == 1 then
    ok("Neovim " .. tostring(vim.version()) .. ": ghost text inline at the cursor")
  else
    info("Neovim older than 0.10: a ghost in the middle of a line is drawn at its end")
  end
  local path = efim.socket_path()
  info("socket: " .. path)
  info("completions are " .. (efim.active() and "on" or "off (:EfimEnable)"))
  local status, e
  if vim.fn.getftype(path) == "" then
    e = "no socket at " .. path
  else
    status, e = rpc.call_sync("status", nil, 3000)
  end
  if not status then
    err("daemon not reachable: " .. tostring(e), { "start it: efim daemon start", "or set EFIM_SOCKET / the `socket` option" })
  else
    ok(string.format("daemon reachable (pid %s, up %.0f s, %s requests served)", tostring(status.pid),
      status.uptime_s or 0, tostring(status.served)))
    info("model: " .. tostring(status.model) .. " (layout " .. tostring(status.layout) .. ")")
  end
  local version = status and status.version and (status.version .. " (the daemon's)") or efim_version()
  if version then
    info("version: " .. version)
  else
    warn("version: unknown (the daemon does not report it and `efim` is not on PATH)")
  end
end

return M
