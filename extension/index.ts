// clawrl's OpenClaw plugin: registration only. The logic lives in src/, each file with its test.
import { definePluginEntry } from "openclaw/plugin-sdk/plugin-entry";
import { runCommand } from "./src/command.ts";
import { resolveConfig } from "./src/config.ts";
import { DaemonClient } from "./src/daemon.ts";
import { DESCRIPTION, PARAMETERS, TOOL_NAME, runSkillTool } from "./src/skill-tool.ts";
import { RunRegistry, tagStream } from "./src/tags.ts";

export default definePluginEntry({
  id: "clawrl",
  name: "clawrl",
  description: "Tags model calls to a clawrl daemon with session, turn kind and user; /clawrl feedback; skills the agent writes.",
  register(api: any) {
    const config = resolveConfig(api.pluginConfig, api.config);
    const runs = new RunRegistry();
    const daemon = new DaemonClient(config.daemonUrl, config.timeoutMs, config.apiKey);
    const log = api.logger;
    let warned = false;
    const untold = () => {
      if (warned) return;
      warned = true;
      log?.warn?.("clawrl: a model call came from a run whose trigger OpenClaw did not report, so it is "
        + "tagged main; heartbeats and cron runs cannot be told apart. Set "
        + "plugins.entries.clawrl.hooks.allowConversationAccess to true (clawrl openclaw-config does).");
    };

    for (const id of config.providers) {
      api.registerProvider({
        id,
        label: `clawrl (${id})`,
        auth: [],
        wrapStreamFn: (ctx: any) => (ctx.streamFn ? tagStream(ctx.streamFn, config, runs, untold) : undefined),
        // Also here: OpenClaw hands this hook the session id on every call, compactions included.
        resolveTransportTurnState: (ctx: any) =>
          ctx.sessionId ? { headers: { [config.headers.sessionId]: ctx.sessionId } } : undefined,
      });
    }

    // Needs plugins.entries.clawrl.hooks.allowConversationAccess: true, or OpenClaw skips it and
    // heartbeats, cron and memory runs could not be told from the user's turns.
    api.on("before_model_resolve", (_event: unknown, ctx: any) => {
      runs.remember(ctx.runId, {
        trigger: ctx.trigger, sessionKey: ctx.sessionKey, sessionId: ctx.sessionId, senderId: ctx.senderId,
      });
    });
    api.on("agent_end", (_event: unknown, ctx: any) => runs.forget(ctx?.runId));

    const end = async (sessionId: string | undefined, why: string) => {
      if (!sessionId) return;
      try {
        await daemon.endSession(sessionId);
      } catch (e) {
        log?.warn?.(`clawrl: could not end session ${sessionId} (${why}): ${(e as Error).message}`);
      }
    };
    api.on("session_end", (event: any) => end(event?.sessionId, event?.reason ?? "end"));
    api.on("before_reset", (_event: unknown, ctx: any) => end(ctx?.sessionId, "reset"));

    api.registerCommand({
      name: "clawrl",
      description: "Rate the last answer for clawrl (good/bad [comment]) or show its status.",
      acceptsArgs: true,
      handler: async (ctx: any) => ({ text: await runCommand(ctx, daemon, config.userId) }),
    });

    api.registerTool({
      name: TOOL_NAME,
      description: DESCRIPTION,
      parameters: PARAMETERS,
      async execute(_id: string, params: any) {
        const text = await runSkillTool(params ?? {}, daemon);
        return { content: [{ type: "text", text }], details: { text } };
      },
    });
  },
});
