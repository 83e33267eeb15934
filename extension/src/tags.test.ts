import { test } from "node:test";
import assert from "node:assert/strict";
import { resolveConfig } from "./config.ts";
import { mergeHeaders, RunRegistry, tagHeaders, tagStream, untoldRun } from "./tags.ts";

const config = resolveConfig({});

test("a user run's calls carry session, main/main and the sender", () => {
  const runs = new RunRegistry();
  runs.remember("run-a", { trigger: "user", sessionKey: "agent:main:main", sessionId: "s-1", senderId: "alice" });
  assert.deepEqual(tagHeaders(config, runs, { requestId: "run-a:model:2" }), {
    "X-Turn-Type": "main", "X-Turn-Kind": "main", "X-Session-Id": "s-1", "X-User-Id": "alice",
  });
});

test("the call's own session id wins over the run's; a configured user id wins over the sender", () => {
  const runs = new RunRegistry();
  runs.remember("run-a", { trigger: "user", sessionId: "s-old", senderId: "alice" });
  const h = tagHeaders(resolveConfig({ userId: "bob" }), runs, { requestId: "run-a:model:1", sessionId: "s-new" });
  assert.equal(h["X-Session-Id"], "s-new");
  assert.equal(h["X-User-Id"], "bob");
});

test("opting out adds X-Clawrl-No-Train: 1, under a renamed header if configured", () => {
  const c = resolveConfig({ optOut: true, headers: { noTrain: "X-No-Learn" } });
  const h = tagHeaders(c, new RunRegistry(), { requestId: "r:model:1", sessionId: "s" });
  assert.equal(h["X-No-Learn"], "1");
  assert.equal(h["X-Clawrl-No-Train"], undefined);
});

test("an unknown run still gets main, and a compaction is side without any run facts", () => {
  const runs = new RunRegistry();
  assert.equal(tagHeaders(config, runs, { requestId: "zz:model:1" })["X-Turn-Type"], "main");
  const h = tagHeaders(config, runs, { requestId: "zz:compaction:cmp-1:model:1", sessionId: "s" });
  assert.equal(h["X-Turn-Type"], "side");
  assert.equal(h["X-Turn-Kind"], "compaction");
});

test("merging keeps existing headers and replaces ours whatever their case", () => {
  const merged = mergeHeaders({ Authorization: "Bearer k", "x-session-id": "stale", traceparent: "00-1" },
                              { "X-Session-Id": "s-1", "X-Turn-Type": "main" });
  assert.deepEqual(merged, { Authorization: "Bearer k", traceparent: "00-1", "X-Session-Id": "s-1", "X-Turn-Type": "main" });
});

test("two concurrent runs in two sessions keep their own tags through the wrapped stream", async () => {
  const runs = new RunRegistry();
  runs.remember("user-run", { trigger: "user", sessionKey: "agent:main:main", sessionId: "s-user" });
  runs.remember("beat-run", { trigger: "heartbeat", sessionKey: "agent:main:main", sessionId: "s-user" });
  runs.remember("other-run", { trigger: "user", sessionKey: "agent:other:main", sessionId: "s-other" });
  const seen: Record<string, Record<string, string>> = {};
  const inner = async (_m: unknown, _c: unknown, o?: any) => {
    await new Promise((r) => setTimeout(r, Math.random() * 10));  // interleave the calls
    seen[o.requestId] = o.headers;
  };
  const wrapped = tagStream(inner, config, runs);
  await Promise.all([
    wrapped({}, {}, { requestId: "user-run:model:1", headers: { Authorization: "Bearer k" } }),
    wrapped({}, {}, { requestId: "beat-run:model:1" }),
    wrapped({}, {}, { requestId: "other-run:model:1" }),
    wrapped({}, {}, { requestId: "user-run:model:2" }),
  ]);
  assert.equal(seen["user-run:model:1"]["Authorization"], "Bearer k");
  for (const id of ["user-run:model:1", "user-run:model:2"]) {
    assert.equal(seen[id]["X-Session-Id"], "s-user");
    assert.equal(seen[id]["X-Turn-Type"], "main");
  }
  assert.equal(seen["beat-run:model:1"]["X-Turn-Type"], "side");
  assert.equal(seen["beat-run:model:1"]["X-Turn-Kind"], "heartbeat");
  assert.equal(seen["other-run:model:1"]["X-Session-Id"], "s-other");
  assert.equal(seen["other-run:model:1"]["X-Turn-Type"], "main");
});

test("the registry forgets finished runs and stays bounded", () => {
  const runs = new RunRegistry(3);
  for (const id of ["a", "b", "c", "d"]) runs.remember(id, { trigger: "user" });
  assert.equal(runs.size, 3);
  assert.equal(runs.get("a"), undefined);
  runs.forget("d");
  assert.equal(runs.get("d"), undefined);
  assert.equal(runs.size, 2);
});

test("a model call from a run the hook never reported is flagged; compactions and announcements are not", async () => {
  const runs = new RunRegistry();
  runs.remember("known", { trigger: "user" });
  assert.equal(untoldRun(runs, "known:model:1"), false);
  assert.equal(untoldRun(runs, "unknown:model:1"), true);
  assert.equal(untoldRun(runs, "unknown:compaction:cmp-1:model:1"), false);
  assert.equal(untoldRun(runs, "announce:v1:x"), false);
  const flagged: string[] = [];
  await tagStream(async () => {}, config, runs, (id) => flagged.push(id))({}, {}, { requestId: "unknown:model:2" });
  assert.deepEqual(flagged, ["unknown:model:2"]);
});
