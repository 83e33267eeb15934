// Per-call tags. OpenClaw tells us about a run in one place (before_model_resolve: its trigger,
// session key, session id, sender) and about each model call in another (wrapStreamFn: the request
// id, whose first field is the run id). RunRegistry joins the two by run id, so parallel runs and
// parallel sessions never see each other's tags: there is no "current run" anywhere.

import type { ClawrlConfig } from "./config.ts";
import { classify, runIdOf } from "./kind.ts";

export interface RunFacts {
  trigger?: string;
  sessionKey?: string;
  sessionId?: string;
  senderId?: string;
}

/** Facts per run id, bounded: a run that never reports its end cannot grow the map forever. */
export class RunRegistry {
  private runs = new Map<string, RunFacts>();
  private readonly limit: number;
  constructor(limit = 512) {
    this.limit = limit;
  }

  remember(runId: string | undefined, facts: RunFacts): void {
    if (!runId) return;
    this.runs.delete(runId);  // re-insert: newest last, so eviction drops the oldest
    this.runs.set(runId, facts);
    if (this.runs.size > this.limit) this.runs.delete(this.runs.keys().next().value as string);
  }

  forget(runId: string | undefined): void {
    if (runId) this.runs.delete(runId);
  }

  get(runId: string | undefined): RunFacts | undefined {
    return runId ? this.runs.get(runId) : undefined;
  }

  get size(): number {
    return this.runs.size;
  }
}

export interface CallOptions {
  requestId?: string;
  sessionId?: string;
  headers?: Record<string, string>;
}

/** The headers clawrl wants on one model call. */
export function tagHeaders(config: ClawrlConfig, runs: RunRegistry, call: CallOptions): Record<string, string> {
  const run = runs.get(runIdOf(call.requestId)) ?? {};
  const tag = classify({ requestId: call.requestId, trigger: run.trigger, sessionKey: run.sessionKey });
  const names = config.headers;
  const out: Record<string, string> = { [names.turnType]: tag.type, [names.turnKind]: tag.kind };
  const session = call.sessionId ?? run.sessionId;
  if (session) out[names.sessionId] = session;
  const user = config.userId ?? run.senderId;
  if (user) out[names.userId] = user;
  if (config.optOut) out[names.noTrain] = "1";
  return out;
}

/** `existing` plus `added`; an added header replaces an existing one whatever its letter case. */
export function mergeHeaders(existing: Record<string, string> | undefined,
                             added: Record<string, string>): Record<string, string> {
  const replaced = new Set(Object.keys(added).map((k) => k.toLowerCase()));
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(existing ?? {})) if (!replaced.has(k.toLowerCase())) out[k] = v;
  return { ...out, ...added };
}

type StreamFn = (model: unknown, context: unknown, options?: CallOptions & Record<string, unknown>) => unknown;

/** True for an ordinary model call of a run that before_model_resolve never told us about:
 * the sign that OpenClaw skips that hook (no hooks.allowConversationAccess for the plugin). */
export function untoldRun(runs: RunRegistry, requestId: string | undefined): boolean {
  const run = runIdOf(requestId);
  return !!run && /:model:\d+$/.test(requestId!) && !requestId!.includes(":compaction:") && !runs.get(run);
}

/** Wrap OpenClaw's stream function so every call carries its tags; `onUntold` hears of calls
 * from runs whose trigger is unknown (they are tagged main). */
export function tagStream(inner: StreamFn, config: ClawrlConfig, runs: RunRegistry,
                          onUntold?: (requestId: string) => void): StreamFn {
  return (model, context, options) => {
    if (onUntold && untoldRun(runs, options?.requestId)) onUntold(options!.requestId!);
    return inner(model, context, { ...options, headers: mergeHeaders(options?.headers, tagHeaders(config, runs, options ?? {})) });
  };
}
