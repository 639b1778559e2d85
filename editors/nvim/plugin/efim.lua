-- Commands for efim.nvim; call require("efim").setup() to turn on completions while typing.
vim.api.nvim_create_user_command("EfimComplete", function() require("efim").trigger() end, {})
vim.api.nvim_create_user_command("EfimDismiss", function() require("efim").dismiss() end, {})
