// For tests: a real HTTP server on a loopback port that answers like the daemon and records what it got.
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";

export async function fakeDaemon(handler: (method: string, url: string, body: any) => [number, any]) {
  const got: { method: string; url: string; body: any; headers: any }[] = [];
  const server = createServer((req, res) => {
    let raw = "";
    req.on("data", (c) => (raw += c));
    req.on("end", () => {
      const body = raw ? JSON.parse(raw) : undefined;
      got.push({ method: req.method!, url: req.url!, body, headers: req.headers });
      const [status, out] = handler(req.method!, req.url!, body);
      res.writeHead(status, { "content-type": "application/json" }).end(JSON.stringify(out));
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  return { url, got, close: () => new Promise((r) => server.close(r)) };
}
