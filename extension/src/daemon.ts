// The daemon's control endpoints, as the plugin uses them: end a session, send feedback, read status.
// Every call is bounded by the configured timeout and fails with a DaemonError whose message is what
// the user should see (the daemon's own OpenAI-style error message when it sent one).

export class DaemonError extends Error {
  readonly status?: number;
  constructor(message: string, status?: number) {
    super(message);
    this.status = status;
  }
}

export interface FeedbackResult {
  session_id: string;
  turn_id: number;
  reward: number;
}

export class DaemonClient {
  readonly baseUrl: string;
  private readonly timeoutMs: number;
  private readonly apiKey?: string;

  constructor(baseUrl: string, timeoutMs: number, apiKey?: string) {
    this.baseUrl = baseUrl.replace(/\/+$/, "");
    this.timeoutMs = timeoutMs;
    this.apiKey = apiKey;
  }

  private async call(method: string, path: string, body?: unknown): Promise<any> {
    let res: Response;
    try {
      res = await fetch(this.baseUrl + path, {
        method,
        headers: {
          ...(body === undefined ? {} : { "content-type": "application/json" }),
          ...(this.apiKey ? { authorization: `Bearer ${this.apiKey}` } : {}),
        },
        body: body === undefined ? undefined : JSON.stringify(body),
        signal: AbortSignal.timeout(this.timeoutMs),
      });
    } catch (e) {
      const why = (e as Error).name === "TimeoutError" ? `no answer within ${this.timeoutMs} ms` : (e as Error).message;
      throw new DaemonError(`clawrl daemon at ${this.baseUrl} is not reachable (${why}); is \`clawrl serve\` running?`);
    }
    const text = await res.text();
    let data: any = undefined;
    try {
      data = text ? JSON.parse(text) : undefined;
    } catch {
      data = undefined;
    }
    if (!res.ok) throw new DaemonError(data?.error?.message ?? `HTTP ${res.status} from ${path}`, res.status);
    return data;
  }

  /** Tell the daemon a session is over, so its last turn is judged now. Unknown sessions are fine. */
  async endSession(sessionId: string): Promise<boolean> {
    try {
      await this.call("POST", `/v1/sessions/${encodeURIComponent(sessionId)}/end`);
      return true;
    } catch (e) {
      if (e instanceof DaemonError && e.status === 404) return false;  // nothing was served in it
      throw e;
    }
  }

  feedback(sessionId: string, reward: -1 | 0 | 1, comment?: string, userId?: string): Promise<FeedbackResult> {
    return this.call("POST", "/v1/feedback", { session_id: sessionId, reward, comment, user_id: userId });
  }

  skills(): Promise<any> {
    return this.call("GET", "/v1/skills");
  }

  showSkill(name: string): Promise<any> {
    return this.call("GET", `/v1/skills/${encodeURIComponent(name)}`);
  }

  createSkill(name: string, description: string, instructions: string): Promise<any> {
    return this.call("POST", "/v1/skills", { name, description, instructions });
  }

  updateSkill(name: string, description: string, instructions: string): Promise<any> {
    return this.call("PATCH", `/v1/skills/${encodeURIComponent(name)}`, { description, instructions });
  }

  deleteSkill(name: string): Promise<any> {
    return this.call("DELETE", `/v1/skills/${encodeURIComponent(name)}`);
  }

  async status(): Promise<{ ready: any; adapters: any }> {
    const [ready, adapters] = await Promise.all([this.call("GET", "/readyz"), this.call("GET", "/v1/adapters")]);
    return { ready, adapters };
  }
}
