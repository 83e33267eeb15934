import { test } from "node:test";
import assert from "node:assert/strict";
import { DaemonClient } from "./daemon.ts";
import { fakeDaemon } from "./fake-daemon.ts";
import { PARAMETERS, runSkillTool } from "./skill-tool.ts";

test("create sends name, description and instructions and reports the skill live", async () => {
  const d = await fakeDaemon(() => [201, { name: "metric-units", status: "published", live: true, issues: [] }]);
  try {
    const text = await runSkillTool({ action: "create", name: "metric-units", description: "Units for this user",
                                      instructions: "Always use metric units." }, new DaemonClient(d.url, 2000, "k"));
    assert.match(text, /skill metric-units created; OpenClaw loads it from the next turn/);
    assert.equal(d.got[0].method, "POST");
    assert.equal(d.got[0].url, "/v1/skills");
    assert.deepEqual(d.got[0].body, { name: "metric-units", description: "Units for this user",
                                      instructions: "Always use metric units." });
    assert.equal(d.got[0].headers.authorization, "Bearer k");
  } finally {
    await d.close();
  }
});

test("update and delete address the skill by its encoded name", async () => {
  const d = await fakeDaemon((method) => [200, method === "DELETE"
    ? { name: "a-b", status: "unpublished", live: false, issues: [] }
    : { name: "a-b", status: "error", live: false, issues: [{ message: "description: is empty" }] }]);
  try {
    const client = new DaemonClient(d.url, 2000);
    assert.match(await runSkillTool({ action: "update", name: "a-b", description: "x", instructions: "y" }, client),
                 /updated but not published \(error: description: is empty\)/);
    assert.match(await runSkillTool({ action: "delete", name: "a-b" }, client), /no longer loaded/);
    assert.deepEqual(d.got.map((g) => `${g.method} ${g.url}`), ["PATCH /v1/skills/a-b", "DELETE /v1/skills/a-b"]);
    // A hostile name is sent encoded; the daemon refuses it (its checks are tested in Python).
    await runSkillTool({ action: "show", name: "../../etc" }, client);
    assert.equal(d.got[2].url, "/v1/skills/..%2F..%2Fetc");
  } finally {
    await d.close();
  }
});

test("missing parameters and unknown actions are answered without calling the daemon", async () => {
  const d = await fakeDaemon(() => [500, {}]);
  try {
    const client = new DaemonClient(d.url, 2000);
    assert.equal(await runSkillTool({ action: "create", name: "x" }, client),
                 "clawrl_skill create needs description and instructions");
    assert.equal(await runSkillTool({ action: "delete" }, client), "clawrl_skill delete needs name");
    assert.match(await runSkillTool({ action: "rm" }, client), /action must be one of list, show, create/);
    assert.equal(d.got.length, 0);
    assert.deepEqual(PARAMETERS.required, ["action"]);
  } finally {
    await d.close();
  }
});

test("the daemon's refusal reaches the agent as its message", async () => {
  const d = await fakeDaemon(() => [409, { error: { message: "a skill named 'x' exists already" } }]);
  try {
    const text = await runSkillTool({ action: "create", name: "x", description: "d", instructions: "i" },
                                    new DaemonClient(d.url, 2000));
    assert.equal(text, "clawrl_skill: a skill named 'x' exists already");
  } finally {
    await d.close();
  }
});

test("list shows each skill with its state", async () => {
  const d = await fakeDaemon(() => [200, { source: "/s", skills: [{ name: "a", status: "published" },
                                                                    { name: "b", status: "error" }] }]);
  try {
    assert.equal(await runSkillTool({ action: "list" }, new DaemonClient(d.url, 2000)),
                 "skills in /s:\n- a: published\n- b: error");
  } finally {
    await d.close();
  }
});
