// The /clawrl command: explicit feedback on the session's last turn, and the daemon's state.
// Commands bypass the model, so using them never adds a turn of its own.

import type { DaemonClient } from "./daemon.ts";
import { DaemonError } from "./daemon.ts";

export const USAGE = [
  "/clawrl good [comment]  - the last answer was right (a comment says what was good)",
  "/clawrl bad [comment]   - the last answer was wrong (a comment says how to do better: it becomes the hint)",
  "/clawrl status          - the daemon's model, adapter version and learning queue",
].join("\n");

export type Action =
  | { action: "feedback"; reward: 1 | -1; comment?: string }
  | { action: "status" }
  | { action: "help"; error?: string };

const WORDS: Record<string, 1 | -1> = { good: 1, "+1": 1, "👍": 1, bad: -1, "-1": -1, "👎": -1 };

export function parseArgs(args: string | undefined): Action {
  const text = (args ?? "").trim();
  if (!text || text === "help") return { action: "help" };
  const [word, ...rest] = text.split(/\s+/);
  const comment = text.slice(word.length).trim() || undefined;
  const reward = WORDS[word.toLowerCase()];
  if (reward !== undefined) return { action: "feedback", reward, comment };
  if (word.toLowerCase() === "status" && rest.length === 0) return { action: "status" };
  return { action: "help", error: `unknown /clawrl argument ${JSON.stringify(word)}` };
}

export interface CommandContext {
  args?: string;
  sessionId?: string;
  senderId?: string;
}

function describeStatus(s: { ready: any; adapters: any }): string {
  const r = s.ready, versions = s.adapters?.versions ?? [];
  return [
    `clawrl: ${r.status}, model ${r.model}, adapter v${r.adapter_version ?? 0} active (${versions.length} trained)`,
    `turns ${r.turns}, judged ${r.judged}, awaiting judge ${r.awaiting_judge}, trainer ${r.trainer}`,
  ].join("\n");
}

export async function runCommand(ctx: CommandContext, daemon: DaemonClient, userId?: string): Promise<string> {
  const a = parseArgs(ctx.args);
  try {
    if (a.action === "help") return (a.error ? a.error + "\n" : "") + USAGE;
    if (a.action === "status") return describeStatus(await daemon.status());
    if (!ctx.sessionId) return "clawrl: this conversation has no session yet, so there is no answer to rate.";
    const r = await daemon.feedback(ctx.sessionId, a.reward, a.comment, userId ?? ctx.senderId);
    const verdict = a.reward > 0 ? "good" : "bad";
    return `clawrl: turn ${r.turn_id} marked ${verdict}${a.comment ? " with your comment as the hint" : ""}.`;
  } catch (e) {
    if (e instanceof DaemonError) return `clawrl: ${e.message}`;
    throw e;
  }
}
