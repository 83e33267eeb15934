import { test } from "node:test";
import assert from "node:assert/strict";
import { parseArgs, runCommand } from "./command.ts";
import { DaemonClient } from "./daemon.ts";
import { fakeDaemon } from "./fake-daemon.ts";

test("parseArgs reads good, bad with a comment, status and help", () => {
  assert.deepEqual(parseArgs("good"), { action: "feedback", reward: 1, comment: undefined });
  assert.deepEqual(parseArgs("  bad   too long, answer in one line "),
                   { action: "feedback", reward: -1, comment: "too long, answer in one line" });
  assert.deepEqual(parseArgs("BAD"), { action: "feedback", reward: -1, comment: undefined });
  assert.deepEqual(parseArgs("status"), { action: "status" });
  assert.deepEqual(parseArgs(""), { action: "help" });
  assert.equal(parseArgs("meh").action, "help");
});

test("/clawrl bad <comment> posts the session's feedback, with the user and the API key", async () => {
  const d = await fakeDaemon(() => [200, { session_id: "s-1", turn_id: 7, reward: -1 }]);
  try {
    const text = await runCommand({ args: "bad use metric units", sessionId: "s-1", senderId: "tg:42" },
                                  new DaemonClient(d.url, 2000, "sk-local"));
    assert.match(text, /turn 7 marked bad with your comment/);
    assert.equal(d.got[0].url, "/v1/feedback");
    assert.deepEqual(d.got[0].body, { session_id: "s-1", reward: -1, comment: "use metric units", user_id: "tg:42" });
    assert.equal(d.got[0].headers.authorization, "Bearer sk-local");
  } finally {
    await d.close();
  }
});

test("a daemon error reaches the user as its message", async () => {
  const d = await fakeDaemon(() => [404, { error: { message: "no a turn in session 's-9' has been recorded" } }]);
  try {
    const text = await runCommand({ args: "good", sessionId: "s-9" }, new DaemonClient(d.url, 2000));
    assert.match(text, /^clawrl: no a turn in session 's-9'/);
  } finally {
    await d.close();
  }
});

test("an unreachable daemon is a message saying so, not a crash", async () => {
  const text = await runCommand({ args: "status" }, new DaemonClient("http://127.0.0.1:9", 500));
  assert.match(text, /not reachable.*clawrl serve/);
});

test("/clawrl status summarises readyz and the adapters", async () => {
  const d = await fakeDaemon((_m, url) => url === "/readyz"
    ? [200, { status: "ready", model: "m", adapter_version: 2, turns: 5, judged: 3, awaiting_judge: 1, trainer: "idle" }]
    : [200, { active: 2, versions: [{ version: 1 }, { version: 2 }] }]);
  try {
    const text = await runCommand({ args: "status" }, new DaemonClient(d.url, 2000));
    assert.match(text, /ready, model m, adapter v2 active \(2 trained\)/);
    assert.match(text, /turns 5, judged 3, awaiting judge 1, trainer idle/);
  } finally {
    await d.close();
  }
});

test("ending a session that served nothing is not an error", async () => {
  const d = await fakeDaemon(() => [404, { error: { message: "no session" } }]);
  try {
    assert.equal(await new DaemonClient(d.url, 2000).endSession("s/with slash"), false);
    assert.equal(d.got[0].url, "/v1/sessions/s%2Fwith%20slash/end");
  } finally {
    await d.close();
  }
});
