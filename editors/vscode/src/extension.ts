// efim for VS Code: a thin client of `efim lsp` (LSP 3.18 inline completion) through
// vscode-languageclient. VS Code draws the ghost text and accepts it with Tab; this file adds the
// debounce, the accept-next-word/line commands that report partial accepts, a status-bar item
// (last latency and cache tier, opens the log), a clear message when `efim` is missing, where
// VS Code's language features define the names a file imports (efim's repository context), and
// where the cursor settles (efim prefills the plan there before the first keystroke).
import * as fs from "fs";
import * as path from "path";
import * as vscode from "vscode";
import { LanguageClient, LanguageClientOptions, ServerOptions } from "vscode-languageclient/node";

interface Offered {
  uri: string;
  id: string;
  text: string;
  accepted: number; // code points of `text` taken so far
}

interface Status {
  model?: string;
  latency_ms?: number;
  daemon_ms?: number;
  cache_tier?: string;
  tokens?: { evaluated?: number; generated?: number };
  context?: {
    tokens?: number;
    full_tokens?: number;
    share?: number;
    reduced?: boolean;
    reduced_by?: { cause?: string; text?: string };
  };
}

/** "1204/2950 ctx (41%, reduced)": the context the answer used, of the full plan's. */
function contextText(c: Status["context"]): string {
  if (!c || typeof c.tokens !== "number") return "";
  const share = Math.round(100 * (c.share ?? 1));
  return `${c.tokens}/${c.full_tokens ?? c.tokens} ctx (${share}%${c.reduced ? ", reduced" : ""})`;
}

let client: LanguageClient | undefined;
let log: vscode.LogOutputChannel;
let status: vscode.StatusBarItem;
let offered: Offered | undefined;

function settings() {
  return vscode.workspace.getConfiguration("efim");
}

// The efim executable: a path that must be executable, or a name looked up on PATH.
export function findEfim(cmd: string): string | undefined {
  const executable = (p: string) => {
    try {
      fs.accessSync(p, fs.constants.X_OK);
      return fs.statSync(p).isFile();
    } catch {
      return false;
    }
  };
  if (cmd.includes("/") || cmd.includes("\\")) {
    return executable(cmd) ? cmd : undefined;
  }
  for (const dir of (process.env.PATH || "").split(path.delimiter)) {
    const p = path.join(dir, cmd);
    if (dir && executable(p)) {
      return p;
    }
  }
  return undefined;
}

function enabled(languageId: string): boolean {
  const langs = settings().get<string[]>("enabledLanguages", ["*"]);
  return langs.includes("*") || langs.includes(languageId);
}

// The cursor settled (cursorDebounceMs after it moved): efim prefills the plan anchored there while
// idle, so that the first keystroke there finds it cached (`efim/cursor`; `efim lsp` passes it on
// only when it rests on another line than the daemon last heard of).
let cursorTimer: ReturnType<typeof setTimeout> | undefined;

function cursorMoved(e: vscode.TextEditorSelectionChangeEvent): void {
  const ms = settings().get<number>("cursorDebounceMs", 300);
  const doc = e.textEditor.document;
  if (ms <= 0 || !client || !["file", "untitled"].includes(doc.uri.scheme) || !enabled(doc.languageId)) {
    return;
  }
  clearTimeout(cursorTimer);
  if (e.kind === undefined) {
    return; // an edit moved it (typing, Enter, an accept): the keystroke's own request anchors there
  }
  cursorTimer = setTimeout(() => {
    const pos = e.textEditor.selection.active;
    const uri = doc.uri.toString();
    if (!client?.isRunning() || doc.isClosed) {
      return;
    }
    client
      .sendNotification("efim/cursor", { uri, position: { line: pos.line, character: pos.character } })
      .catch((err) => log.appendLine(`efim/cursor: ${err}`));
  }, ms);
}

function initializationOptions() {
  const s = settings();
  const socket = s.get<string>("socket", "");
  return {
    maxTokens: s.get<number>("maxTokens", 64),
    maxLines: s.get<number>("maxLines", 0),
    enabledLanguages: s.get<string[]>("enabledLanguages", ["*"]),
    // this extension sends efim/cursor itself (efim.cursorDebounceMs): the server asks no document highlights
    cursorNotifications: true,
    ...(socket ? { socket } : {}),
  };
}

function sleep(ms: number, token: vscode.CancellationToken): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    token.onCancellationRequested(() => {
      clearTimeout(timer);
      resolve();
    });
  });
}

function showStatus(p: Status) {
  const ms = typeof p.latency_ms === "number" ? `${Math.round(p.latency_ms)} ms` : "";
  const ctx = contextText(p.context);
  status.text = `$(sparkle) efim ${ms} ${ctx} ${p.cache_tier ?? ""}`.replace(/ +/g, " ").trimEnd();
  status.tooltip = `efim: ${p.model ?? "?"}\nlast completion ${ms} (daemon ${p.daemon_ms ?? "?"} ms), ` +
    `cache tier ${p.cache_tier ?? "?"}, ${p.tokens?.evaluated ?? "?"} tokens evaluated` +
    (ctx ? `, context ${ctx}` : "") +
    (p.context?.reduced_by?.text ? `\nreduced by ${p.context.reduced_by.text}` : "") + "\nclick: show the log";
  log.appendLine(`completion: ${ms}, tier ${p.cache_tier}, tokens ${JSON.stringify(p.tokens ?? {})}, ` +
    `context ${JSON.stringify(p.context ?? {})}`);
}

async function start(): Promise<void> {
  const cmd = settings().get<string>("path", "efim") || "efim";
  const efim = findEfim(cmd);
  if (!efim) {
    const msg = `efim: the command '${cmd}' was not found. Install efim-local (pip install efim-local) ` +
      `or set "efim.path" to the efim executable.`;
    log.appendLine(msg);
    status.text = "$(error) efim: not found";
    status.tooltip = msg;
    const choice = await vscode.window.showErrorMessage(msg, "Open Settings");
    if (choice === "Open Settings") {
      void vscode.commands.executeCommand("workbench.action.openSettings", "efim.path");
    }
    return;
  }
  const serverOptions: ServerOptions = { command: efim, args: ["lsp"], options: { env: process.env } };
  const clientOptions: LanguageClientOptions = {
    documentSelector: [{ scheme: "file" }, { scheme: "untitled" }],
    outputChannel: log,
    initializationOptions: initializationOptions(),
    synchronize: { configurationSection: "efim" },
    middleware: {
      provideInlineCompletionItems: async (document, position, context, token, next) => {
        if (!enabled(document.languageId)) {
          return null;
        }
        const ms = settings().get<number>("debounceMs", 75);
        if (ms > 0) {
          await sleep(ms, token);
        }
        if (token.isCancellationRequested) {
          return null;
        }
        const result = await next(document, position, context, token);
        const items = Array.isArray(result) ? result : result?.items;
        const args = items?.[0]?.command?.arguments?.[0];
        if (args && typeof args.text === "string") {
          offered = { uri: args.uri, id: String(args.id), text: args.text, accepted: 0 };
        }
        return result;
      },
    },
  };
  client = new LanguageClient("efim", "efim", serverOptions, clientOptions);
  client.registerProposedFeatures(); // inline completion (LSP 3.18) is still "proposed" in vscode-languageclient 10
  status.text = "$(sync~spin) efim: starting";
  sent.clear(); // a new server (and maybe daemon): send every file's definitions again
  try {
    await client.start();
  } catch (e) {
    status.text = "$(error) efim";
    log.appendLine(`efim lsp failed to start: ${e}`);
    void vscode.window.showErrorMessage(`efim: the language server failed to start (${e}); see the efim log.`);
    return;
  }
  client.onNotification("efim/status", showStatus);
  status.text = "$(sparkle) efim: ready";
  void sendDefinitions(vscode.window.activeTextEditor?.document);
  log.appendLine(`efim lsp started: ${efim}`);
}

// Lines that may import something: the daemon's own test (repo/discover.py imports_fingerprint).
const IMPORT_LINE = /import|require\(|^\s*(from|use|package) |^\s*#include/;
const SKIP = new Set(["import", "from", "as", "require", "use", "include", "package", "const", "let", "var",
  "export", "default", "type", "local"]);
const sent = new Map<string, string>(); // document URI -> the definitions last sent

// "Go to definition" on each name of the document's import lines (its first 200 lines, at most 32
// names), through whatever language features VS Code has for it; the places in other files go to
// efim (`efim/definitions`), which puts those definitions in the file's repository context.
async function sendDefinitions(doc: vscode.TextDocument | undefined): Promise<void> {
  if (!client || !doc || doc.uri.scheme !== "file" || !enabled(doc.languageId)) {
    return;
  }
  const names: vscode.Position[] = [];
  for (let row = 0; row < Math.min(doc.lineCount, 200) && names.length < 32; row++) {
    const line = doc.lineAt(row).text;
    if (!IMPORT_LINE.test(line)) continue;
    for (const m of line.matchAll(/[A-Za-z_][A-Za-z0-9_]*/g)) {
      if (!SKIP.has(m[0]) && names.length < 32) names.push(new vscode.Position(row, m.index ?? 0));
    }
  }
  const found = new Map<string, { uri: string; line: number }>();
  for (const pos of names) {
    let result: (vscode.Location | vscode.LocationLink)[] | undefined;
    try {
      result = await vscode.commands.executeCommand("vscode.executeDefinitionProvider", doc.uri, pos);
    } catch {
      continue; // no definition provider for this language
    }
    for (const loc of result ?? []) {
      const uri = "targetUri" in loc ? loc.targetUri : loc.uri;
      const range = "targetUri" in loc ? (loc.targetSelectionRange ?? loc.targetRange) : loc.range;
      if (uri.scheme === "file" && uri.toString() !== doc.uri.toString()) {
        found.set(`${uri.toString()}:${range.start.line}`, { uri: uri.toString(), line: range.start.line });
      }
    }
  }
  const definitions = [...found.values()].sort((a, b) => a.uri.localeCompare(b.uri) || a.line - b.line)
    .slice(0, 256); // the daemon takes at most 256
  const key = JSON.stringify(definitions);
  if (sent.get(doc.uri.toString()) === key) return;
  sent.set(doc.uri.toString(), key);
  log.appendLine(`definitions of ${doc.uri.fsPath}: ${definitions.length}`);
  await client.sendNotification("efim/definitions", { uri: doc.uri.toString(), definitions });
}

// Accept part of the suggestion with VS Code's own command, then tell efim how much was taken.
async function acceptPart(builtin: string): Promise<void> {
  const editor = vscode.window.activeTextEditor;
  if (!editor) {
    return;
  }
  const before = editor.selection.active;
  const version = editor.document.version;
  await vscode.commands.executeCommand(builtin);
  const after = editor.selection.active;
  if (!client || !offered || editor.document.version === version || !after.isAfter(before)) {
    return;
  }
  const taken = editor.document.getText(new vscode.Range(before, after));
  offered.accepted = Math.min(offered.text.length, offered.accepted + [...taken].length);
  await client.sendNotification("efim/didPartiallyAcceptCompletion", {
    uri: offered.uri,
    id: offered.id,
    text: offered.text,
    acceptedLength: offered.accepted,
  });
}

export async function activate(context: vscode.ExtensionContext): Promise<void> {
  log = vscode.window.createOutputChannel("efim", { log: true });
  status = vscode.window.createStatusBarItem(vscode.StatusBarAlignment.Right, 100);
  status.name = "efim";
  status.command = "efim.showLog";
  status.text = "efim";
  status.show();
  context.subscriptions.push(
    log,
    status,
    vscode.commands.registerCommand("efim.showLog", () => log.show(true)),
    vscode.commands.registerCommand("efim.acceptNextWord", () =>
      acceptPart("editor.action.inlineSuggest.acceptNextWord")),
    vscode.commands.registerCommand("efim.acceptNextLine", () =>
      acceptPart("editor.action.inlineSuggest.acceptNextLine")),
    vscode.commands.registerCommand("efim.restart", async () => {
      await client?.stop();
      client = undefined;
      await start();
    }),
    vscode.window.onDidChangeActiveTextEditor((e) => void sendDefinitions(e?.document)),
    vscode.window.onDidChangeTextEditorSelection(cursorMoved),
    vscode.workspace.onDidSaveTextDocument((doc) => void sendDefinitions(doc)),
    vscode.workspace.onDidChangeConfiguration(async (e) => {
      if (e.affectsConfiguration("efim.path") || e.affectsConfiguration("efim.socket")) {
        await vscode.commands.executeCommand("efim.restart");
      }
    }),
  );
  await start();
}

export async function deactivate(): Promise<void> {
  await client?.stop();
}
