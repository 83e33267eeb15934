import { test } from "node:test";
import assert from "node:assert/strict";
import { ConfigError, DEFAULT_HEADERS, resolveConfig } from "./config.ts";

test("defaults: provider clawrl, local daemon, standard header names, training on", () => {
  const c = resolveConfig(undefined);
  assert.deepEqual(c.providers, ["clawrl"]);
  assert.equal(c.daemonUrl, "http://127.0.0.1:30000");
  assert.deepEqual(c.headers, DEFAULT_HEADERS);
  assert.equal(c.optOut, false);
  assert.equal(c.userId, undefined);
});

test("the daemon URL defaults to the decorated provider's baseUrl without /v1", () => {
  const openclaw = { models: { providers: { mine: { baseUrl: "http://127.0.0.1:31234/v1/" } } } };
  assert.equal(resolveConfig({ providers: ["mine"] }, openclaw).daemonUrl, "http://127.0.0.1:31234");
});

test("explicit settings are kept; header names can be renamed one by one", () => {
  const c = resolveConfig({
    daemonUrl: "http://10.0.0.2:30000/", userId: "alice", optOut: true, timeoutMs: 500,
    headers: { userId: "X-Whose" },
  });
  assert.equal(c.daemonUrl, "http://10.0.0.2:30000");
  assert.equal(c.userId, "alice");
  assert.equal(c.optOut, true);
  assert.equal(c.headers.userId, "X-Whose");
  assert.equal(c.headers.sessionId, "X-Session-Id");
});

const BAD = [
  [{ daemonUrl: "not a url" }, /daemonUrl is not a URL/],
  [{ daemonUrl: "ftp://x" }, /daemonUrl must be an http\(s\) URL/],
  [{ providers: [] }, /providers must be a non-empty list/],
  [{ providers: "clawrl" }, /providers must be a non-empty list/],
  [{ userId: "" }, /userId must be a non-empty string/],
  [{ optOut: "yes" }, /optOut must be true or false/],
  [{ timeoutMs: 5 }, /timeoutMs must be an integer/],
  [{ headers: { sessionId: "bad name" } }, /headers.sessionId must be a valid HTTP header name/],
  [{ headers: { color: "X-Color" } }, /headers.color is not a known header/],
  [{ daemonURL: "http://x" }, /daemonURL is not a setting; known: daemonUrl/],
] as const;

for (const [raw, message] of BAD) {
  test(`rejects ${JSON.stringify(raw)} with a message naming the key`, () => {
    assert.throws(() => resolveConfig(raw), (e: Error) => e instanceof ConfigError && message.test(e.message));
  });
}
