import { test } from "node:test";
import assert from "node:assert/strict";
import { classify, runIdOf } from "./kind.ts";

// One row per call kind in OpenClaw's table (trigger, sessionKey, requestId), as observed.
const CASES = [
  ["user turn, first step", { trigger: "user", sessionKey: "agent:main:main", requestId: "r1:model:1" }, "main", "main"],
  ["user turn, tool-loop step", { trigger: "user", sessionKey: "agent:main:main", requestId: "r1:model:3" }, "main", "main"],
  ["manual run", { trigger: "manual", sessionKey: "agent:main:main", requestId: "r2:model:1" }, "main", "main"],
  ["heartbeat", { trigger: "heartbeat", sessionKey: "agent:main:main", requestId: "r3:model:1" }, "heartbeat", "side"],
  ["cron", { trigger: "cron", sessionKey: "agent:main:cron:job", requestId: "r4:model:1" }, "cron", "side"],
  ["memory flush", { trigger: "memory", sessionKey: "agent:main:internal-session-effects:x", requestId: "r5:model:1" }, "memory", "side"],
  ["memory flush, no trigger seen", { sessionKey: "agent:main:internal-session-effects:x", requestId: "r5:model:1" }, "memory", "side"],
  ["overflow recovery", { trigger: "overflow", sessionKey: "agent:main:main", requestId: "r6:model:1" }, "overflow", "side"],
  ["compaction (no hook fires)", { requestId: "r1:compaction:cmp-abc:model:1" }, "compaction", "side"],
  ["compaction inside a user run", { trigger: "user", sessionKey: "agent:main:main", requestId: "r1:compaction:cmp-abc:model:1" }, "compaction", "side"],
  ["subagent step", { trigger: "user", sessionKey: "agent:main:subagent:0b1c", requestId: "r7:model:2" }, "subagent", "main"],
  ["subagent result announced", { trigger: "user", sessionKey: "agent:main:main", requestId: "announce:v1:r7:abc" }, "announce", "main"],
  ["nothing known", {}, "main", "main"],
] as const;

for (const [name, facts, kind, type] of CASES) {
  test(`classify: ${name} is ${type}/${kind}`, () => {
    assert.deepEqual(classify(facts), { kind, type });
  });
}

test("runIdOf takes the run from model and compaction request ids, none from announcements", () => {
  assert.equal(runIdOf("abc-123:model:2"), "abc-123");
  assert.equal(runIdOf("abc-123:compaction:cmp-9:model:1"), "abc-123");
  assert.equal(runIdOf("announce:v1:abc:def"), undefined);
  assert.equal(runIdOf(undefined), undefined);
  assert.equal(runIdOf(""), undefined);
});
