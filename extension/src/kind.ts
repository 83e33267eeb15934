// Which kind of model call is this? Derived from three facts OpenClaw gives us: the run's trigger
// (before_model_resolve), its session key, and the call's request id (wrapStreamFn).
//
// Main turns are what the user asked for: their turns, every step of the tool loop, a subagent's
// steps and the announcement of its result to the parent. Side turns are the assistant's own
// housekeeping (heartbeats, memory flushes, cron runs, compactions, overflow recovery): they are
// served and logged but never trained on.

export type TurnType = "main" | "side";
export type TurnKind =
  | "main" | "heartbeat" | "memory" | "cron" | "overflow" | "compaction" | "subagent" | "announce";

export interface CallFacts {
  requestId?: string;   // "<runId>:model:<n>", "<runId>:compaction:<id>:model:<n>", "announce:v1:..."
  trigger?: string;     // user | heartbeat | cron | memory | overflow | manual
  sessionKey?: string;  // agent:main:main, agent:main:subagent:<uuid>, agent:main:internal-session-effects:...
}

export interface TurnTag {
  kind: TurnKind;
  type: TurnType;
}

const SIDE_TRIGGERS: Record<string, TurnKind> = {
  heartbeat: "heartbeat", cron: "cron", memory: "memory", overflow: "overflow",
};

export function classify(facts: CallFacts): TurnTag {
  const { requestId = "", trigger = "", sessionKey = "" } = facts;
  // The request id names compactions and announcements on every call, even when no agent hook ran.
  if (requestId.includes(":compaction:")) return { kind: "compaction", type: "side" };
  if (requestId.startsWith("announce:")) return { kind: "announce", type: "main" };
  const side = SIDE_TRIGGERS[trigger];
  if (side) return { kind: side, type: "side" };
  // A memory flush runs in its own internal session; its key says so even if the trigger is missing.
  if (sessionKey.includes(":internal-session-effects:")) return { kind: "memory", type: "side" };
  // Subagents run with trigger "user" in a session of their own.
  if (sessionKey.includes(":subagent:")) return { kind: "subagent", type: "main" };
  return { kind: "main", type: "main" };
}

/** The run a call belongs to: the request id's first field ("announce:" calls have none). */
export function runIdOf(requestId: string | undefined): string | undefined {
  if (!requestId || requestId.startsWith("announce:")) return undefined;
  const head = requestId.split(":", 1)[0];
  return head || undefined;
}
