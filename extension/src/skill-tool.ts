// The clawrl_skill tool: the agent writes down what it learned as an OpenClaw skill. The daemon
// checks the skill (skill_bridge) and publishes it into the workspace, where OpenClaw loads it on
// the next turn. Names and paths are checked by the daemon, which keeps them inside its skills folder.

import type { DaemonClient } from "./daemon.ts";
import { DaemonError } from "./daemon.ts";

export const TOOL_NAME = "clawrl_skill";

export const ACTIONS = ["list", "show", "create", "update", "delete"] as const;
export type SkillAction = (typeof ACTIONS)[number];

export const PARAMETERS = {
  type: "object",
  additionalProperties: false,
  required: ["action"],
  properties: {
    action: {
      type: "string",
      enum: [...ACTIONS],
      description: "list the skills; show one; create a new one; update (replace) one; delete one",
    },
    name: {
      type: "string",
      description: "the skill's name: lowercase letters, digits and hyphens, e.g. 'metric-units'",
    },
    description: {
      type: "string",
      description: "create/update: one sentence saying when the skill applies",
    },
    instructions: {
      type: "string",
      description: "create/update: the skill's Markdown body, the steps to follow",
    },
  },
};

export const DESCRIPTION = "Save what you learned about how this user wants things done as an OpenClaw " +
  "skill (a SKILL.md the next turns load), or list, show, update or delete such skills. Use it when " +
  "the user states a lasting preference or teaches you a procedure worth keeping.";

export interface SkillParams {
  action?: string;
  name?: string;
  description?: string;
  instructions?: string;
}

function need(p: SkillParams, ...keys: (keyof SkillParams)[]): string | undefined {
  const missing = keys.filter((k) => typeof p[k] !== "string" || !(p[k] as string).trim());
  return missing.length ? `clawrl_skill ${p.action} needs ${missing.join(" and ")}` : undefined;
}

function outcome(verb: string, r: any): string {
  if (r?.live) return `skill ${r.name} ${verb}; OpenClaw loads it from the next turn`;
  if (r?.status === "unpublished") return `skill ${r.name} ${verb}; it is no longer loaded`;
  const why = (r?.issues ?? []).map((i: any) => i.message).join("; ");
  return `skill ${r?.name} ${verb} but not published (${r?.status}${why ? ": " + why : ""})`;
}

/** Run one call of the tool; returns the text the agent sees. Daemon errors become that text. */
export async function runSkillTool(p: SkillParams, daemon: DaemonClient): Promise<string> {
  const action = p.action as SkillAction;
  if (!ACTIONS.includes(action)) return `clawrl_skill: action must be one of ${ACTIONS.join(", ")}`;
  const missing = action === "list" ? undefined
    : action === "create" || action === "update" ? need(p, "name", "description", "instructions")
    : need(p, "name");
  if (missing) return missing;
  try {
    if (action === "list") {
      const r = await daemon.skills();
      const lines = (r.skills ?? []).map((s: any) => `- ${s.name}: ${s.status}`);
      return lines.length ? `skills in ${r.source}:\n${lines.join("\n")}` : "no skills yet";
    }
    if (action === "show") {
      const r = await daemon.showSkill(p.name!);
      return r.files?.["SKILL.md"] ?? `skill ${p.name} has no SKILL.md`;
    }
    if (action === "create") return outcome("created", await daemon.createSkill(p.name!, p.description!, p.instructions!));
    if (action === "update") return outcome("updated", await daemon.updateSkill(p.name!, p.description!, p.instructions!));
    return outcome("deleted", await daemon.deleteSkill(p.name!));
  } catch (e) {
    if (e instanceof DaemonError) return `clawrl_skill: ${e.message}`;
    throw e;
  }
}
