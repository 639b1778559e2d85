-- Commands for efim.nvim (:help efim); call require("efim").setup() to turn on completions while typing.
local function cmd(name, fn, desc)
  vim.api.nvim_create_user_command(name, function() fn(require("efim")) end, { desc = desc })
end
cmd("EfimComplete", function(efim) efim.trigger() end, "efim: ask for a completion at the cursor")
cmd("EfimDismiss", function(efim) efim.dismiss() end, "efim: hide the completion")
cmd("EfimEnable", function(efim) efim.enable() end, "efim: turn completions on")
cmd("EfimDisable", function(efim) efim.disable() end, "efim: turn completions off")
cmd("EfimToggle", function(efim)
  vim.notify("efim: completions " .. (efim.toggle() and "on" or "off"))
end, "efim: turn completions on or off")
