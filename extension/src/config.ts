// The plugin's settings (plugins.entries.clawrl.config), checked once at registration.
// OpenClaw validates against the manifest's schema too; this check names the key and the fix, and
// fills in the defaults, so the rest of the plugin never sees an unchecked value.

export interface HeaderNames {
  sessionId: string;
  turnType: string;
  turnKind: string;
  userId: string;
  noTrain: string;
}

export interface ClawrlConfig {
  daemonUrl: string;
  apiKey?: string;     // the decorated provider's apiKey, for a daemon started with server.api_key
  providers: string[];
  userId?: string;
  optOut: boolean;
  timeoutMs: number;
  headers: HeaderNames;
}

export const DEFAULT_HEADERS: HeaderNames = {
  sessionId: "X-Session-Id",
  turnType: "X-Turn-Type",
  turnKind: "X-Turn-Kind",
  userId: "X-User-Id",
  noTrain: "X-Clawrl-No-Train",
};
export const DEFAULT_DAEMON_URL = "http://127.0.0.1:30000";
const KEYS = ["daemonUrl", "providers", "userId", "optOut", "timeoutMs", "headers"];
const HEADER_NAME = /^[A-Za-z0-9!#$%&'*+.^_`|~-]+$/;  // an HTTP token

export class ConfigError extends Error {}

function fail(key: string, problem: string): never {
  throw new ConfigError(`plugins.entries.clawrl.config.${key} ${problem}`);
}

function daemonFromProviders(openclaw: any, providers: string[]): string {
  // The daemon serves its control endpoints next to /v1: strip that from the provider's baseUrl.
  const base = openclaw?.models?.providers?.[providers[0]]?.baseUrl;
  if (typeof base !== "string" || !base) return DEFAULT_DAEMON_URL;
  return base.replace(/\/+$/, "").replace(/\/v1$/, "");
}

function providerApiKey(openclaw: any, providers: string[]): string | undefined {
  const key = openclaw?.models?.providers?.[providers[0]]?.apiKey;
  return typeof key === "string" && key ? key : undefined;  // a secret ref is not ours to resolve
}

function url(key: string, v: unknown): string {
  if (typeof v !== "string") fail(key, "must be a string such as http://127.0.0.1:30000");
  let parsed: URL;
  try {
    parsed = new URL(v);
  } catch {
    fail(key, `is not a URL: ${JSON.stringify(v)}; use e.g. http://127.0.0.1:30000`);
  }
  if (parsed.protocol !== "http:" && parsed.protocol !== "https:") fail(key, "must be an http(s) URL");
  return v.replace(/\/+$/, "");
}

function headerNames(v: unknown): HeaderNames {
  if (v === undefined) return { ...DEFAULT_HEADERS };
  if (typeof v !== "object" || v === null || Array.isArray(v)) fail("headers", "must be an object");
  const out = { ...DEFAULT_HEADERS };
  for (const [k, name] of Object.entries(v)) {
    if (!(k in DEFAULT_HEADERS)) fail(`headers.${k}`, `is not a known header; known: ${Object.keys(DEFAULT_HEADERS).join(", ")}`);
    if (typeof name !== "string" || !HEADER_NAME.test(name)) fail(`headers.${k}`, "must be a valid HTTP header name");
    (out as any)[k] = name;
  }
  return out;
}

/** Check `raw` (the plugin's config entry) and fill in defaults; `openclaw` is the whole config. */
export function resolveConfig(raw: unknown, openclaw?: unknown): ClawrlConfig {
  const c = (raw ?? {}) as Record<string, unknown>;
  if (typeof c !== "object" || Array.isArray(c)) fail("", "must be an object");
  for (const k of Object.keys(c)) if (!KEYS.includes(k)) fail(k, `is not a setting; known: ${KEYS.join(", ")}`);
  let providers = ["clawrl"];
  if (c.providers !== undefined) {
    if (!Array.isArray(c.providers) || c.providers.length === 0
        || !c.providers.every((p) => typeof p === "string" && p.length > 0)) {
      fail("providers", 'must be a non-empty list of provider ids, e.g. ["clawrl"]');
    }
    providers = c.providers as string[];
  }
  if (c.userId !== undefined && (typeof c.userId !== "string" || !c.userId || c.userId.length > 256)) {
    fail("userId", "must be a non-empty string of at most 256 characters");
  }
  if (c.optOut !== undefined && typeof c.optOut !== "boolean") fail("optOut", "must be true or false");
  const timeoutMs = c.timeoutMs ?? 3000;
  if (!Number.isInteger(timeoutMs) || (timeoutMs as number) < 100 || (timeoutMs as number) > 60000) {
    fail("timeoutMs", "must be an integer between 100 and 60000");
  }
  return {
    daemonUrl: c.daemonUrl === undefined ? daemonFromProviders(openclaw, providers) : url("daemonUrl", c.daemonUrl),
    apiKey: providerApiKey(openclaw, providers),
    providers,
    userId: c.userId as string | undefined,
    optOut: (c.optOut as boolean | undefined) ?? false,
    timeoutMs: timeoutMs as number,
    headers: headerNames(c.headers),
  };
}
